//! `nodekeeper drain NODE`: cordon, drain in tiers, print progress and the blocker live.
//!
//! Exit codes (docs/drain.md): 0 drained, 1 error, 2 usage, 3 blocked by a PDB or do-not-disrupt
//! at the deadline, 4 timed out for another reason, 5 interrupted by a signal.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use nodekeeper_core::controller::act::drain::lifecycle::{self, DrainEdge};
use nodekeeper_core::controller::act::drain::{
    self, drain, DrainError, DrainOptions, DrainProgress, DrainReport, OnTimeout, Phase,
};

use super::{Exit, Output};
use nodekeeper_core::telemetry::error_chain;

/// Arguments of `nodekeeper drain`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// The node to drain.
    pub node: String,
    /// Kubeconfig file (default: KUBECONFIG, ~/.kube/config or in-cluster, as kube-rs infers).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Output format: text lines or one JSON object per line.
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    #[command(flatten)]
    pub opts: DrainOpts,
}

/// The options of a drain besides the node, the cluster and the output (shared with
/// `kubectl nodekeeper drain`).
#[derive(Debug, clap::Args)]
pub struct DrainOpts {
    /// Deadline for the whole drain, e.g. 90s or 10m; 0 means no deadline.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub timeout: Duration,
    /// At the deadline: fail (report the blocker) or force-delete the remaining pods.
    #[arg(long, default_value_t = OnTimeout::Fail, value_parser = super::choices::<OnTimeout>(&[
        ("fail", "Stop and report the blocker (the node stays cordoned)"),
        ("force-delete", "Delete the remaining pods (bypassing PDBs), each with its own grace period clamped to the time left"),
    ]))]
    pub on_timeout: OnTimeout,
    /// List what would be evicted; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Evictions in flight at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub concurrency: u16,
    /// Do not wait for the node's VolumeAttachments to be detached.
    #[arg(long)]
    pub skip_volume_wait: bool,
    /// Set Kubernetes 1.37's lifecycle conditions `DrainInProgress` and `Drained` on the node, as
    /// the controller does (needs `patch` on `nodes/status`; docs/drain.md).
    #[arg(long)]
    pub report_node_conditions: bool,
}

/// One JSON output line.
#[derive(Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
enum JsonLine<'a> {
    Progress(&'a DrainProgress),
    Result {
        status: &'a str,
        exit_code: u8,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        blocker: Option<&'a drain::Blocker>,
        #[serde(skip_serializing_if = "Option::is_none")]
        report: Option<&'a DrainReport>,
    },
}

/// Runs the command; returns the exit code.
pub fn main(args: DrainArgs) -> u8 {
    super::block_on(async move { Ok(run(args).await) })
}

/// A drain client (no transparent 429 retries) from `--kubeconfig` and `--context`, else the
/// inferred configuration (in-cluster, `$KUBECONFIG`).
async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, String> {
    let cfg = nodekeeper_core::k8s::client::config(kubeconfig, context, "drain")
        .await
        .map_err(|e| error_chain(&e))?;
    drain::client(cfg).map_err(|e| format!("cannot build a Kubernetes client: {e}"))
}

async fn run(args: DrainArgs) -> u8 {
    let client = match client(args.kubeconfig.as_deref(), args.context.as_deref()).await {
        Ok(c) => c,
        Err(msg) => {
            return finish(
                args.output,
                "error",
                Exit::Failure.code(),
                Some(msg),
                None,
                None,
            )
        }
    };
    let o = &args.opts;
    let mut opts = DrainOptions::new(&args.node);
    if !o.timeout.is_zero() {
        opts = opts.with_timeout(o.timeout);
    }
    opts.on_timeout = o.on_timeout;
    opts.dry_run = o.dry_run;
    opts.concurrency = usize::from(o.concurrency);
    opts.wait_volume_detach = !o.skip_volume_wait;
    let cancel = shutdown_token();
    let output = args.output;
    let conditions = (o.report_node_conditions && !o.dry_run)
        .then(|| kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone()));
    let why = "nodekeeper drain";
    if let Some(nodes) = &conditions {
        report_conditions(nodes, &args.node, DrainEdge::Started, why).await;
    }
    let result = drain(client, &opts, cancel, |p| print_progress(output, p)).await;
    if let Some(nodes) = &conditions {
        let edge = match &result {
            Ok(_) => DrainEdge::Completed,
            Err(DrainError::TimedOut { .. }) => DrainEdge::TimedOut,
            Err(DrainError::Cancelled { .. }) => DrainEdge::Cancelled,
            Err(_) => DrainEdge::Failed,
        };
        report_conditions(nodes, &args.node, edge, why).await;
    }
    match result {
        Ok(report) => {
            if output == Output::Text {
                print_report(&report);
            }
            finish(
                output,
                "drained",
                Exit::Ok.code(),
                None,
                None,
                Some(&report),
            )
        }
        Err(e) => failure(output, &e),
    }
}

/// Writes the lifecycle conditions of `edge`; a failure is a warning (the drain's result stands).
async fn report_conditions(
    nodes: &kube::Api<k8s_openapi::api::core::v1::Node>,
    node: &str,
    edge: DrainEdge,
    why: &str,
) {
    if let Err(e) = lifecycle::write(nodes, node, edge, why).await {
        eprintln!(
            "warning: {node}: lifecycle conditions not written ({edge:?}): {}",
            error_chain(&e)
        );
    }
}

fn failure(output: Output, e: &DrainError) -> u8 {
    let msg = Some(error_chain(e));
    match e {
        DrainError::TimedOut {
            blocker, report, ..
        } => {
            let policy = blocker.as_ref().is_some_and(|b| b.reason.is_policy());
            let (status, code) = if policy {
                ("blocked", Exit::Blocked.code())
            } else {
                ("timed-out", Exit::TimedOut.code())
            };
            finish(output, status, code, msg, blocker.as_deref(), Some(report))
        }
        DrainError::Cancelled { report, .. } => finish(
            output,
            "interrupted",
            Exit::Interrupted.code(),
            msg,
            None,
            Some(report),
        ),
        _ => finish(output, "error", Exit::Failure.code(), msg, None, None),
    }
}

/// The process's one shutdown token (cancelled by SIGTERM/SIGINT: the drain stops and reports
/// `interrupted`); a token nothing cancels when the handlers cannot be installed.
fn shutdown_token() -> CancellationToken {
    match nodekeeper_core::shutdown::install() {
        Ok(s) => s.shutdown,
        Err(e) => {
            eprintln!("warning: cannot install signal handlers: {e}");
            CancellationToken::new()
        }
    }
}

fn finish(
    output: Output,
    status: &str,
    code: u8,
    error: Option<String>,
    blocker: Option<&drain::Blocker>,
    report: Option<&DrainReport>,
) -> u8 {
    match output {
        Output::Json => {
            let line = JsonLine::Result {
                status,
                exit_code: code,
                error,
                blocker,
                report,
            };
            println_flush(&serde_json::to_string(&line).unwrap_or_default());
        }
        Output::Text => {
            if let Some(e) = error {
                eprintln!("error: {e}");
            }
        }
    }
    code
}

fn println_flush(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn print_progress(output: Output, p: &DrainProgress) {
    match output {
        Output::Json => {
            println_flush(&serde_json::to_string(&JsonLine::Progress(p)).unwrap_or_default())
        }
        Output::Text => println_flush(&progress_text(p)),
    }
}

/// The text form of one progress report (stable; docs/drain.md).
pub fn progress_text(p: &DrainProgress) -> String {
    let t = format!("[{:>8.3}s]", p.elapsed_ms as f64 / 1000.0);
    let mut line =
        match (p.phase, p.tier) {
            (Phase::Cordoning, _) => format!("{t} cordoning node {}", p.node),
            (Phase::Done, _) => format!("{t} node {} drained", p.node),
            (Phase::WaitingVolumes, _) => format!("{t} waiting for volumes to detach"),
            (phase, tier) => {
                format!(
            "{t} {} tier {}: {} pod(s) left in tier, {} in total; {} evicted, {} force-deleted",
            if phase == Phase::ForceDeleting { "force-deleting," } else { "evicting" },
            tier.map(|t| t.name()).unwrap_or("-"),
            p.remaining_in_tier,
            p.remaining,
            p.evicted,
            p.force_deleted
        )
            }
        };
    if let Some(b) = &p.blocker {
        line.push_str(&format!("\n{t}   blocked: {b}"));
    }
    line
}

fn print_report(r: &DrainReport) {
    let mut out = String::new();
    if r.dry_run {
        out.push_str(&format!(
            "dry run: node {} would be cordoned and {} pod(s) evicted in this order:\n",
            r.node,
            r.planned.iter().filter(|p| !p.held).count()
        ));
        for p in &r.planned {
            let verb = if p.held {
                "would hold (do-not-disrupt)"
            } else {
                "would evict"
            };
            out.push_str(&format!("  {verb} {} [tier {}]\n", p.pod, p.tier));
        }
    } else {
        let forced = r.removed.iter().filter(|x| x.forced).count();
        out.push_str(&format!(
            "drained node {}: {} pod(s) evicted, {forced} force-deleted, {} skipped in {:.3}s\n",
            r.node,
            r.removed.len() - forced,
            r.skipped.len(),
            r.elapsed_ms as f64 / 1000.0
        ));
    }
    for s in &r.skipped {
        let reason = serde_json::to_value(s.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str(&format!("  skipped {} ({reason})\n", s.pod));
    }
    print!("{out}");
}
