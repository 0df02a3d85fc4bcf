//! The Karpenter fence's Node writes give way to the engine's other Node writes.
//!
//! A disruption of a Ready node fences its NodePool's other nodes ([`crate::controller::policy::fence`]): a
//! wave of notices across NodePools is a few cordons beside many fence PATCHes, and on a busy
//! kube-apiserver each cordon then waits behind the fence writes already in flight (at 1,000
//! nodes in 100 NodePools, 50 notices: 450 fence writes beside 50 cordons; notice → cordon
//! 241–443 ms p99 with them, 96–123 ms without them, bench/results/2026-12-05-fence-gate.md). So a write
//! that only sets or lifts fence marks ([`crate::controller::policy::fence::fence_only`]) takes one of a few
//! permits, and starts only once no other Node write of the engine is in flight, or after
//! [`MAX_YIELD`]; the other writes never wait for the fence. The price: a mark that lands later
//! widens, by that much, the window in which a voluntary disruption Karpenter decides (its
//! disruption loop polls every 10 s) can still start beside the drain (docs/karpenter.md).

use std::time::Duration;

use tokio::sync::{watch, Semaphore, SemaphorePermit};

/// Fence writes in flight at once, engine-wide.
pub const FENCE_WRITES: usize = 2;

/// The longest a fence write waits for the other Node writes in flight to be answered.
pub const MAX_YIELD: Duration = Duration::from_secs(1);

/// The fence writes' permits, and the count of the other Node writes in flight.
#[derive(Debug)]
pub struct FenceGate {
    permits: Semaphore,
    urgent: watch::Sender<usize>,
}

/// Counts a write that is not the fence's as in flight until dropped.
#[derive(Debug)]
#[must_use = "the write counts as in flight only while the guard lives"]
pub struct Urgent<'a>(&'a watch::Sender<usize>);

impl Drop for Urgent<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl FenceGate {
    /// A gate with `permits` fence writes in flight at most.
    pub fn new(permits: usize) -> Self {
        FenceGate {
            permits: Semaphore::new(permits.max(1)),
            urgent: watch::channel(0).0,
        }
    }

    /// Marks a write that is not the fence's in flight (fence writes wait for it).
    pub fn urgent(&self) -> Urgent<'_> {
        self.urgent.send_modify(|n| *n += 1);
        Urgent(&self.urgent)
    }

    /// Waits for a permit, then for no other write in flight (at most [`MAX_YIELD`]). `None`
    /// only if the semaphore was closed (never: the gate does not close it).
    pub async fn fence_slot(&self) -> Option<SemaphorePermit<'_>> {
        let permit = self.permits.acquire().await.ok()?;
        let mut rx = self.urgent.subscribe();
        // Err only if the sender is gone, which `self` holds.
        let _ = tokio::time::timeout(MAX_YIELD, rx.wait_for(|n| *n == 0)).await;
        Some(permit)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_write_starts_once_the_urgent_write_is_answered() {
        let gate = Arc::new(FenceGate::new(2));
        let start = Instant::now();
        let g = gate.clone();
        let urgent = tokio::spawn(async move {
            let _u = g.urgent();
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
        tokio::task::yield_now().await;
        let _slot = gate.fence_slot().await.expect("a slot");
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        urgent.await.expect("urgent write");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_write_waits_for_urgent_writes_at_most_max_yield() {
        let gate = FenceGate::new(2);
        let _u = gate.urgent();
        let start = Instant::now();
        let _slot = gate.fence_slot().await.expect("a slot");
        assert_eq!(start.elapsed(), MAX_YIELD);
    }

    #[tokio::test(start_paused = true)]
    async fn without_urgent_writes_a_fence_write_starts_at_once_within_its_permits() {
        let gate = FenceGate::new(2);
        let start = Instant::now();
        let a = gate.fence_slot().await.expect("first");
        let _b = gate.fence_slot().await.expect("second");
        assert_eq!(start.elapsed(), Duration::ZERO);
        let third = tokio::time::timeout(Duration::from_secs(5), gate.fence_slot()).await;
        assert!(third.is_err(), "a third fence write waited for a permit");
        drop(a);
        let _c = gate.fence_slot().await.expect("a permit freed");
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_writes_count_while_their_guards_live() {
        let gate = FenceGate::new(1);
        let (u, v) = (gate.urgent(), gate.urgent());
        assert_eq!(*gate.urgent.borrow(), 2);
        drop(u);
        assert_eq!(*gate.urgent.borrow(), 1);
        drop(v);
        let start = Instant::now();
        let _slot = gate.fence_slot().await.expect("a slot");
        assert_eq!(start.elapsed(), Duration::ZERO, "none in flight: no wait");
    }
}
