//! `nodekeeper demo`: the whole loop on an embedded cluster, with no cloud.
//!
//! One process starts the sim API server with a mixed OKE-like cluster ([`cluster`]), the
//! controller (in-process, with a typical OKE + KPO policy on a scaled clock), and one real
//! `nodekeeper agent` process per node against its own OCI metadata emulator ([`agents`]). It
//! then plays a scripted scenario ([`script`]) and prints a live timeline ([`timeline`]): the
//! migration label cleaned once Cilium is Ready, CRI-O drop-ins applied, a preemption notice
//! answered by taint + cordon + tiered drain + replacement, two nodes going NotReady repaired
//! one at a time under the budget `nodes: "1"` with the held node explained. It exits 0 only
//! if every expected outcome happened. `--serve` keeps the cluster up for `kubectl` and
//! `nodekeeper status`. `--kubeconfig` plays the same scenario on a real control plane, with
//! nodekeeper as its ServiceAccounts ([`real`]). `--snapshot` replays a real cluster's export
//! instead ([`whatif`]).

pub mod agents;
pub mod backend;
pub mod cluster;
pub mod real;
pub mod script;
pub mod timeline;
pub mod whatif;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::{SimOptions, TestCluster};

/// What `nodekeeper demo` plays (the command's arguments, parsed by the binary).
#[derive(Debug, Clone)]
pub struct DemoArgs {
    /// Policy time runs this many times faster than real time (600 s toleration → 10 s at 60).
    pub speed: f64,
    /// A sim scenario TOML for the cluster's shape (pools, workloads, PDBs, DaemonSets; see
    /// docs/dev/sim.md). The script acts on the first node of the first spot pool and the first
    /// two nodes of the first on-demand pool.
    pub scenario: Option<PathBuf>,
    /// Your controller configuration (its `[repair]`, `[budgets]`, `[interruption]` sections) instead
    /// of the embedded one (crates/sim/src/demo/controller.toml, typical OKE + KPO values).
    pub controller_config: Option<PathBuf>,
    /// Play on this real cluster instead of the embedded sim: an admin kubeconfig of an API
    /// server whose nodes KWOK plays (annotation `kwok.x-k8s.io/node=fake`), with the shipped
    /// manifests installed (`scripts/demo.sh --real` builds, starts and installs one). The
    /// admin seeds the scenario and injects faults; the controller and agents run as the
    /// `nodekeeper-controller` and `nodekeeper-agent` ServiceAccounts.
    pub kubeconfig: Option<PathBuf>,
    /// Keep the cluster running after the scenario and print its kubeconfig.
    pub serve: bool,
    /// Give up on an outcome after this long (real time).
    pub step_timeout: Duration,
    /// Working directory (kubeconfig, agent configs and logs; with --snapshot: `after.json`,
    /// the replayed objects at the end); default: a new directory under the system's temporary
    /// directory, removed at the end unless `--serve`.
    pub dir: Option<PathBuf>,
    /// What-if replay: a snapshot of a real cluster (`kubectl get nodes,pods,pdb -A -o json`,
    /// or `-o yaml`; several lists may follow each other), seeded as exported, with your
    /// `--controller-config` policy in dry run. Prints what nodekeeper would do to each node.
    pub snapshot: Option<PathBuf>,
    /// With --snapshot, an event to inject (repeatable): `notready:NODE`,
    /// `preemption:NODE`, also termination, maintenance, rebalance, reboot, redeploy; TARGET
    /// may be `pool=NAME` (a value of `[budgets] group_by`) or `LABEL=VALUE`.
    pub what_if: Vec<whatif::event::WhatIf>,
    /// With --snapshot, decide this long after the events (default: the longest repair
    /// toleration + 1s, so that tolerations have run out).
    pub after: Option<Duration>,
    /// Output of --snapshot: one JSON object (timeline on stderr) instead of the timeline and a table.
    pub json: bool,
}

/// Errors setting the demo up.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Bad scenario or configuration (exit 2).
    #[error("{0}")]
    Invalid(String),
    /// Something failed to start.
    #[error("{0}")]
    Start(String),
}

/// Runs the demo (on the caller's multi-threaded runtime): `Ok(true)` when every expected
/// outcome happened, `Ok(false)` when one did not, an error when it could not be set up.
pub async fn run(args: DemoArgs, tmp: PathBuf) -> Result<bool, DemoError> {
    nodekeeper_core::telemetry::init(nodekeeper_core::telemetry::LogFormat::Text, "warn");
    let _ = rustls::crypto::ring::default_provider().install_default();
    demo(args, tmp).await
}

async fn demo(args: DemoArgs, tmp: PathBuf) -> Result<bool, DemoError> {
    if !(args.speed.is_finite() && args.speed >= 1.0) {
        return Err(DemoError::Invalid(format!(
            "--speed {}: must be a number >= 1",
            args.speed
        )));
    }
    if let Some(snapshot) = &args.snapshot {
        return whatif::run(&args, snapshot).await;
    }
    let scenario = match &args.scenario {
        Some(p) => crate::apiserver::scenario::Scenario::load(p)
            .map_err(|e| DemoError::Invalid(nodekeeper_core::telemetry::error_chain(&e)))?,
        None => cluster::default_scenario(),
    };
    let (config, policy) = cluster::policy(args.controller_config.as_deref(), args.speed)
        .map_err(|e| DemoError::Invalid(e.to_string()))?;
    let (owned_dir, dir) = match &args.dir {
        Some(d) => (false, d.clone()),
        None => (
            true,
            tmp.join(format!("nodekeeper-demo-{}", std::process::id())),
        ),
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| DemoError::Start(format!("{}: {e}", dir.display())))?;
    let exe = std::env::current_exe()
        .map_err(|e| DemoError::Start(format!("cannot find my own executable: {e}")))?;
    let tl = Arc::new(timeline::Timeline::new(
        args.speed,
        Box::new(std::io::stdout()),
    ));
    let (backend, kubeconfig) = match &args.kubeconfig {
        Some(path) => {
            let real = real::RealCluster::connect(path).await?;
            tl.raw(&format!(
                "seeding the scenario into kube-apiserver {} at {} (KWOK plays the kubelets)",
                real.version, real.server
            ));
            real.seed(&scenario, args.step_timeout).await?;
            (backend::Backend::Real(real), path.clone())
        }
        None => {
            let opts: SimOptions = cluster::sim_options(scenario);
            let cluster = TestCluster::start(opts)
                .await
                .map_err(|e| DemoError::Start(format!("sim: {e}")))?;
            let kubeconfig = dir.join("kubeconfig");
            cluster
                .write_kubeconfig(&kubeconfig)
                .map_err(|e| DemoError::Start(format!("{}: {e}", kubeconfig.display())))?;
            (backend::Backend::Sim(cluster), kubeconfig)
        }
    };
    let env = script::Env::start(
        Arc::new(backend),
        &config,
        policy,
        exe,
        dir.clone(),
        kubeconfig.clone(),
        args.clone(),
        tl.clone(),
    )
    .await?;
    env.play().await;
    if args.serve {
        tl.raw("");
        tl.raw(&format!(
            "Cluster kept running (Ctrl-C to stop):\n  export KUBECONFIG={}\n  kubectl get nodes\n  {} status",
            kubeconfig.display(),
            "nodekeeper"
        ));
        let _ = tokio::signal::ctrl_c().await;
    }
    env.stop().await;
    if owned_dir && !args.serve {
        let _ = std::fs::remove_dir_all(&dir);
    }
    tl.phase(script::PHASES, script::PHASES, "summary");
    Ok(tl.summary())
}
