//! `nodekeeper demo`: arguments and exit codes; the demo itself is `nodekeeper_sim::demo`.
// The arguments' docs are `--help` text, which names TOML tables as `[repair]`, not as links.
#![allow(rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::time::Duration;

use nodekeeper_sim::demo::whatif::event::WhatIf;
use nodekeeper_sim::demo::{DemoArgs, DemoError};

use super::{Exit, Output};

/// Arguments of `nodekeeper demo`.
///
/// The clap twin of the stand-ins' plain [`DemoArgs`] (`nodekeeper-sim` has no clap): defaults,
/// help, conflicts and `-o text|json` (→ `json: bool`) are the command line's.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoCmd {
    /// Policy time runs this many times faster than real time (600 s toleration → 10 s at 60).
    #[arg(long, default_value_t = 60.0)]
    pub speed: f64,
    /// A sim scenario TOML for the cluster's shape (pools, workloads, PDBs, DaemonSets; see
    /// docs/dev/sim.md). The script acts on the first node of the first spot pool and the first
    /// two nodes of the first on-demand pool.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Your controller configuration (its [repair], [budgets], [interruption] sections) instead
    /// of the embedded one (crates/sim/src/demo/controller.toml, typical OKE + KPO values).
    #[arg(long)]
    pub controller_config: Option<PathBuf>,
    /// Play on this real cluster instead of the embedded sim: an admin kubeconfig of an API
    /// server whose nodes KWOK plays (annotation `kwok.x-k8s.io/node=fake`), with the shipped
    /// manifests installed (`scripts/demo.sh --real` builds, starts and installs one). The
    /// admin seeds the scenario and injects faults; the controller and agents run as the
    /// `nodekeeper-controller` and `nodekeeper-agent` ServiceAccounts.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Keep the cluster running after the scenario and print its kubeconfig.
    #[arg(long)]
    pub serve: bool,
    /// Give up on an outcome after this long (real time).
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    pub step_timeout: Duration,
    /// Working directory (kubeconfig, agent configs and logs; with --snapshot: `after.json`,
    /// the replayed objects at the end); default: a new directory under the system's temporary
    /// directory, removed at the end unless `--serve`.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// What-if replay: a snapshot of a real cluster (`kubectl get nodes,pods,pdb -A -o json`,
    /// or `-o yaml`; several lists may follow each other), seeded as exported, with your
    /// `--controller-config` policy in dry run. Prints what nodekeeper would do to each node.
    #[arg(long, conflicts_with_all = ["scenario", "serve", "kubeconfig"])]
    pub snapshot: Option<PathBuf>,
    /// With --snapshot, an event to inject (repeatable): `notready:NODE`,
    /// `preemption:NODE`, also termination, maintenance, rebalance, reboot, redeploy; TARGET
    /// may be `pool=NAME` (a value of [budgets] group_by) or `LABEL=VALUE`.
    #[arg(long = "what-if", value_name = "EVENT:TARGET", requires = "snapshot")]
    pub what_if: Vec<WhatIf>,
    /// With --snapshot, decide this long after the events (default: the longest repair
    /// toleration + 1s, so that tolerations have run out).
    #[arg(long, requires = "snapshot", value_parser = humantime::parse_duration)]
    pub after: Option<Duration>,
    /// Output of --snapshot: the timeline and a table, or one JSON object (timeline on stderr).
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

impl From<DemoCmd> for DemoArgs {
    fn from(c: DemoCmd) -> Self {
        DemoArgs {
            speed: c.speed,
            scenario: c.scenario,
            controller_config: c.controller_config,
            kubeconfig: c.kubeconfig,
            serve: c.serve,
            step_timeout: c.step_timeout,
            dir: c.dir,
            snapshot: c.snapshot,
            what_if: c.what_if,
            after: c.after,
            json: c.output == Output::Json,
        }
    }
}

/// Runs the demo; exit 0 when every expected outcome happened, 1 when one did not or something
/// failed to start, 2 for a bad scenario or configuration.
pub fn main(cmd: DemoCmd) -> u8 {
    super::block_on(async move {
        Ok(
            match nodekeeper_sim::demo::run(cmd.into(), std::env::temp_dir()).await {
                Ok(true) => Exit::Ok.code(),
                Ok(false) => Exit::Failure.code(),
                Err(e @ DemoError::Invalid(_)) => {
                    eprintln!("error: {e}");
                    Exit::Invalid.code()
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    Exit::Failure.code()
                }
            },
        )
    })
}
