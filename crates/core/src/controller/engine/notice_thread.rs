//! The notice lane: a thread of the controller's own for the fast path after a notice.
//!
//! A notice's cordon is the one write whose latency is a goal (notice → cordon, docs/comparison.md).
//! On the controller's shared runtime the fast path waits for a worker behind whatever the
//! workers are doing at that moment — the agents' reports and their TLS handshakes, the
//! reconcile the notice wakes, the drains — and its PATCH is written by a connection task that
//! waits the same way. The lane is one more OS thread with a current-thread runtime and a
//! Kubernetes client of its own (built on that runtime, so that the client's connections are
//! driven there): the notices' intake and the fast path run there, and the fast path writes the
//! node's own patch through that client.
//! The thread sleeps between notices, and the kernel's scheduler lets a thread waking from sleep
//! run soon, where a runtime worker busy with reports has used its share. What follows the
//! node's own patch — its Events, the drain, the replacement request, the Karpenter fence —
//! goes to the shared runtime and client as before ([`crate::controller::act::actions::Actor`]).
//!
//! On by default (`[controller.engine] notice_lane`): at 5,000 nodes on the real control plane the
//! runs with it ranked ahead of those without it (bench/results/2026-12-05-notice-apart.md).
//!
//! Its price: one thread (a few hundred KiB of stack and runtime) and one more connection to
//! kube-apiserver while notices come (the client's idle connections close after 90 s).

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The lane could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaneError {
    /// The thread or its runtime could not be started.
    #[error("notice lane: {0}")]
    Start(#[source] std::io::Error),
    /// The lane's client could not be built.
    #[error("notice lane: {0}")]
    Client(#[from] crate::k8s::client::ClientError),
    /// The thread ended before it was ready.
    #[error("notice lane: the thread ended while starting")]
    Ended,
}

/// What the engine uses of the lane: where to run the fast path, and the client its node
/// patches go through.
#[derive(Clone)]
pub struct Lane {
    /// The lane's runtime.
    pub handle: Handle,
    /// A client whose connections the lane's runtime drives.
    pub client: kube::Client,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").finish_non_exhaustive()
    }
}

/// Spawns on one runtime wherever it is called from: the lane's (the notices' intake and fast
/// path), or the controller's shared one, where what the fast path does after the node's own
/// patch (its Events, the drain, the replacement request, the fence) runs, so that no connection
/// of the controller's client is opened by a task of the lane.
#[derive(Debug, Clone)]
pub struct Home(Option<Handle>);

impl Home {
    /// The current runtime (none outside one: then each spawn goes to the caller's).
    pub fn here() -> Self {
        Home(Handle::try_current().ok())
    }

    /// `runtime` (none: each spawn goes to the caller's).
    pub fn on(runtime: Option<Handle>) -> Self {
        Home(runtime)
    }

    /// This runtime (none: the caller's).
    pub fn handle(&self) -> Option<&Handle> {
        self.0.as_ref()
    }

    /// Spawns `task` on this runtime.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some(h) => h.spawn(task),
            None => tokio::spawn(task),
        }
    }
}

/// The lane's thread; dropping this stops it (a fast path in flight is dropped: the reconcile of
/// the next leader redoes what it did not write).
#[derive(Debug)]
pub struct NoticeLane {
    lane: Lane,
    stop: Option<oneshot::Sender<()>>,
}

impl NoticeLane {
    /// Starts the thread (`nodekeeper-notices`) and builds its client of `cfg` on it.
    pub async fn start(cfg: kube::Config) -> Result<Self, LaneError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("nodekeeper-notices".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(LaneError::Start(e)));
                        return;
                    }
                };
                // Built inside the runtime: the client's buffer task and its connections are
                // spawned on it.
                let client = rt.block_on(async { crate::k8s::client::client(cfg) });
                let ready = client.map(|client| Lane {
                    handle: rt.handle().clone(),
                    client,
                });
                let started = ready.is_ok();
                if ready_tx.send(ready.map_err(LaneError::from)).is_err() || !started {
                    return;
                }
                // Runs the lane's tasks until stopped (or the `NoticeLane` dropped).
                rt.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(LaneError::Start)?;
        let lane = ready_rx.await.map_err(|_| LaneError::Ended)??;
        Ok(NoticeLane {
            lane,
            stop: Some(stop),
        })
    }

    /// The lane, for [`crate::controller::engine::EngineOptions::lane`].
    pub fn lane(&self) -> Lane {
        self.lane.clone()
    }
}

impl Drop for NoticeLane {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> kube::Config {
        kube::Config::new("https://127.0.0.1:1".parse().expect("a URI"))
    }

    #[tokio::test]
    async fn the_fast_path_runs_on_a_thread_of_its_own() {
        let lane = NoticeLane::start(config()).await.expect("started");
        let name = lane
            .lane()
            .handle
            .spawn(async { std::thread::current().name().map(str::to_string) })
            .await
            .expect("ran");
        assert_eq!(name.as_deref(), Some("nodekeeper-notices"));
        assert_ne!(
            std::thread::current().name(),
            Some("nodekeeper-notices"),
            "the test's own thread"
        );
    }

    #[tokio::test]
    async fn dropping_the_lane_stops_its_runtime() {
        let lane = NoticeLane::start(config()).await.expect("started");
        let handle = lane.lane().handle;
        drop(lane);
        // Once the thread's runtime is gone, what is spawned there never runs.
        let mut ended = false;
        for _ in 0..200 {
            if handle.spawn(async {}).await.is_err() {
                ended = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(ended, "the lane's runtime still runs tasks after the drop");
    }
}
