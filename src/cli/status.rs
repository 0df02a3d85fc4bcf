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
use nodekeeper_core::controller::status::explain::{get_node, DEFAULT_NAMESPACE};
use nodekeeper_core::controller::status::history::{node_history, render_history};
use nodekeeper_core::controller::status::{
    budget_rows, list_nodepools, list_rows, render_with_budgets, BudgetStatus, NodeStatus,
    StatusOutput,
};
use nodekeeper_core::k8s::client;

use super::Output;

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
    /// Only this node.
    pub node: Option<String>,
    /// What nodekeeper did to NODE, newest first (what, why, what drove it, outcome, how long),
    /// from the history its controller keeps; then the node's nodekeeper Events.
    #[arg(long, requires = "node")]
    pub history: bool,
    /// The namespace nodekeeper's controller runs in, where it keeps the histories (with
    /// `--config`: its `[controller] namespace`).
    #[arg(long, short = 'n', default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
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
    let (budgets, namespace) = match &args.opts.config {
        Some(path) => match super::load_config(path, env) {
            Ok(l) => (
                Some(l.config.policy().budgets),
                l.config.controller.controller.map(|c| c.namespace),
            ),
            Err(code) => return code,
        },
        None => (None, None),
    };
    // An error (kubeconfig, API server unreachable, forbidden...) is printed as
    // `error: <cause chain>` with exit 1 by block_on.
    if let (true, Some(node)) = (args.history, args.node.clone()) {
        let output = match args.output {
            StatusOutput::Json => Output::Json,
            StatusOutput::Text | StatusOutput::Wide => Output::Text,
        };
        let namespace = namespace.unwrap_or_else(|| args.namespace.clone());
        return super::block_on_current_thread(async move {
            let (client, server) = connect(&args).await?;
            print_history(client, &server, &namespace, &node, output).await
        });
    }
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
    let (client, server) = connect(args).await?;
    let group_label = budgets.map_or(args.opts.group_label.as_str(), |b| b.group_by.as_str());
    let mut rows = list_rows(
        client.clone(),
        &server,
        args.opts.selector.as_deref(),
        args.opts.chunk_size,
        group_label,
    )
    .await?;
    if let Some(node) = &args.node {
        rows.retain(|r| &r.name == node);
        if rows.is_empty() {
            // Not listed: missing, or not matching the selector; say which.
            get_node(client.clone(), &server, node).await?;
        }
    }
    let Some(b) = budgets else {
        return Ok((rows, Vec::new()));
    };
    let pools = list_nodepools(client, &server, b).await?;
    let table = budget_rows(&rows, b, &pools, now);
    Ok((rows, table))
}

type Connected = (kube::Client, String);

/// A client for the arguments, and its server's URL (for messages).
async fn connect(args: &StatusArgs) -> Result<Connected, Box<dyn std::error::Error + Send + Sync>> {
    let mut cfg = client::config(
        args.kubeconfig.as_deref(),
        args.context.as_deref(),
        "status",
    )
    .await?;
    cfg.connect_timeout = Some(args.opts.connect_timeout);
    let server = cfg.cluster_url.to_string();
    Ok((client::client(cfg)?, server))
}

/// Prints `node`'s history, kept in `namespace` (`status NODE --history`, `kubectl nodekeeper
/// history NODE`); a node that does not exist is an error (a typo is not an empty history).
pub async fn print_history(
    client: kube::Client,
    server: &str,
    namespace: &str,
    node: &str,
    output: Output,
) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    get_node(client.clone(), server, node).await?;
    let now = Utc::now();
    let doc = node_history(client, server, namespace, node, now).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&doc)?),
        Output::Text => print!("{}", render_history(&doc, now)),
    }
    Ok(super::Exit::Ok.code())
}
