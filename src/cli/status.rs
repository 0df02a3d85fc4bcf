//! `nodekeeper status`: arguments, exit codes and printing; the rows and their rendering are
//! `nodekeeper_core::controller::status` (docs/status.md).
//!
//! Exit codes: 0 listed, 1 error (kubeconfig unreadable, API unreachable: the message names the
//! server), 2 bad usage (clap).

use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use nodekeeper_core::controller::status::{list_rows, render, NodeStatus, StatusOutput};
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
    /// Only nodes matching this label selector (e.g. `karpenter.sh/nodepool=spot`).
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// The node label naming a node's group (as `[budgets] group_by`).
    #[arg(long, default_value = "karpenter.sh/nodepool")]
    pub group_label: String,
    /// Nodes fetched per list request (pagination).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub chunk_size: u32,
    /// Give up connecting to the API server after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub connect_timeout: Duration,
}

/// Runs the command; returns the exit code.
pub fn main(args: StatusArgs) -> u8 {
    // An error (kubeconfig, API server unreachable, forbidden...) is printed as
    // `error: <cause chain>` with exit 1 by block_on.
    super::block_on_current_thread(async move {
        let rows = list(&args).await?;
        print!("{}", render(&rows, args.output, Utc::now()));
        Ok(super::EXIT_OK)
    })
}

async fn list(
    args: &StatusArgs,
) -> Result<Vec<NodeStatus>, Box<dyn std::error::Error + Send + Sync>> {
    let mut cfg = client::config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    cfg.connect_timeout = Some(args.connect_timeout);
    let server = cfg.cluster_url.to_string();
    let client = client::client(cfg)?;
    Ok(list_rows(
        client,
        &server,
        args.selector.as_deref(),
        args.chunk_size,
        &args.group_label,
    )
    .await?)
}
