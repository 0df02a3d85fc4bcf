//! `nodekeeper status`: arguments, exit codes and printing; the rows and their rendering are
//! `nodekeeper_core::controller::status` (docs/status.md).
//!
//! Exit codes: 0 listed, 1 error (kubeconfig unreadable, API unreachable: the message names the
//! server), 2 bad usage (clap).

use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use nodekeeper_core::config::Env;
use nodekeeper_core::controller::policy::config::BudgetsConfig;
use nodekeeper_core::controller::status::{
    budget_rows, list_nodepools, list_rows, render_with_budgets, BudgetStatus, NodeStatus,
    StatusOutput,
};
use nodekeeper_core::k8s::client;

/// Arguments of `nodekeeper status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Kubeconfig file (default: KUBECONFIG, ~/.kube/config or in-cluster, as kube-rs infers).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Output: a table, a wider table (reason, repair step, notice, replacement) or JSON.
    #[arg(long, short, default_value_t = StatusOutput::Text, value_parser = super::choices::<StatusOutput>(&[
        ("text", "NODE GROUP STATE BLOCKER SINCE NEXT"),
        ("wide", "The table plus REASON, STEP, NOTICE and REPLACEMENT"),
        ("json", "One JSON document (schema version 1, described in docs/status.md)"),
    ]))]
    pub output: StatusOutput,
    #[command(flatten)]
    pub opts: StatusOpts,
}

/// The options of `status` besides the cluster and the output (shared with
/// `kubectl nodekeeper status`).
#[derive(Debug, clap::Args)]
pub struct StatusOpts {
    /// Only nodes matching this label selector (e.g. `karpenter.sh/nodepool=spot`).
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// The node label naming a node's group (as `[budgets] group_by`; with `--config`, the
    /// configuration's `group_by`).
    #[arg(long, default_value = "karpenter.sh/nodepool")]
    pub group_label: String,
    /// The controller's configuration file: also print the budgets in force per group and where
    /// each comes from (`config` or `NodePool <name>`, which needs `nodepools list`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Nodes fetched per list request (pagination).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub chunk_size: u32,
    /// Give up connecting to the API server after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub connect_timeout: Duration,
}

/// Runs the command; returns the exit code.
pub fn main(args: StatusArgs, env: &Env) -> u8 {
    // `--config`: the `[budgets]` section (an invalid file exits 2, as `validate`).
    let budgets = match &args.opts.config {
        Some(path) => match super::load_config(path, env) {
            Ok(l) => Some(l.config.policy().budgets),
            Err(code) => return code,
        },
        None => None,
    };
    // An error (kubeconfig, API server unreachable, forbidden...) is printed as
    // `error: <cause chain>` with exit 1 by block_on.
    super::block_on_current_thread(async move {
        let now = Utc::now();
        let (rows, budgets) = list(&args, budgets.as_ref(), now).await?;
        print!("{}", render_with_budgets(&rows, &budgets, args.output, now));
        Ok(super::Exit::Ok.code())
    })
}

type Listed = (Vec<NodeStatus>, Vec<BudgetStatus>);

async fn list(
    args: &StatusArgs,
    budgets: Option<&BudgetsConfig>,
    now: chrono::DateTime<Utc>,
) -> Result<Listed, Box<dyn std::error::Error + Send + Sync>> {
    let mut cfg = client::config(
        args.kubeconfig.as_deref(),
        args.context.as_deref(),
        "status",
    )
    .await?;
    cfg.connect_timeout = Some(args.opts.connect_timeout);
    let server = cfg.cluster_url.to_string();
    let client = client::client(cfg)?;
    let group_label = budgets.map_or(args.opts.group_label.as_str(), |b| b.group_by.as_str());
    let rows = list_rows(
        client.clone(),
        &server,
        args.opts.selector.as_deref(),
        args.opts.chunk_size,
        group_label,
    )
    .await?;
    let Some(b) = budgets else {
        return Ok((rows, Vec::new()));
    };
    let pools = list_nodepools(client, &server, b).await?;
    let table = budget_rows(&rows, b, &pools, now);
    Ok((rows, table))
}
