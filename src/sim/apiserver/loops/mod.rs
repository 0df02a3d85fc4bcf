//! Simulated control loops: kubelet, node lifecycle, scheduler, workload controllers, provisioner.
//!
//! Each loop is a task ticking in real time and reading simulated time from the store clock, so a
//! time scale of 60 makes a 40 s node-monitor grace period pass in under a second.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Sim;

/// Which loops run and their (simulated) timings.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Real-time tick of every loop.
    pub tick: Duration,
    /// Kubelets: Lease heartbeats, Ready condition, pods start, graceful termination.
    pub kubelet: bool,
    /// Node lifecycle: Ready → Unknown after missed heartbeats.
    pub lifecycle: bool,
    /// Scheduler.
    pub scheduler: bool,
    /// ReplicaSet, Deployment, DaemonSet controllers and owner garbage collection.
    pub controllers: bool,
    /// Karpenter-like NodeClaim provisioner.
    pub provisioner: bool,
    /// Simulated interval between kubelet heartbeats.
    pub heartbeat_interval: Duration,
    /// Simulated time without heartbeat before a node turns Unknown.
    pub node_monitor_grace: Duration,
    /// Simulated time from binding to Running+Ready.
    pub pod_start_delay: Duration,
    /// Simulated time from NodeClaim deletion to node removal.
    pub terminate_delay: Duration,
    /// Simulated time from node removal to the replacement node.
    pub launch_delay: Duration,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            tick: Duration::from_millis(100),
            kubelet: true,
            lifecycle: true,
            scheduler: true,
            controllers: true,
            provisioner: true,
            heartbeat_interval: Duration::from_secs(10),
            node_monitor_grace: Duration::from_secs(40),
            pod_start_delay: Duration::from_secs(2),
            terminate_delay: Duration::from_secs(30),
            launch_delay: Duration::from_secs(60),
        }
    }
}

impl LoopOptions {
    /// No loops at all.
    pub fn none() -> Self {
        LoopOptions {
            kubelet: false,
            lifecycle: false,
            scheduler: false,
            controllers: false,
            provisioner: false,
            ..Default::default()
        }
    }
}

/// Starts the enabled loops; they stop when `cancel` fires.
pub fn spawn(sim: Arc<Sim>, cancel: CancellationToken) {
    let o = sim.opts.loops.clone();
    if o.kubelet {
        every(&sim, &cancel, o.tick, |s| {
            let _ = s;
        });
    }
}

/// Runs `f` every `tick` until cancelled.
fn every(
    sim: &Arc<Sim>,
    cancel: &CancellationToken,
    tick: Duration,
    f: impl Fn(&Sim) + Send + 'static,
) {
    let sim = sim.clone();
    let cancel = cancel.clone();
    tokio::spawn(async move {
        let mut t = tokio::time::interval(tick);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = t.tick() => f(&sim),
            }
        }
    });
}
