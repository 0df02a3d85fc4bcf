//! `nodekeeper agent --once`: one report of this node, printed and not sent. Runs every check
//! once, reads the cloud identity and the pending notices once, and plans (never applies) the
//! CRI-O drop-ins. Handy for debugging on a node.

use std::time::Instant;

use chrono::Utc;

use crate::agent::checks::Checks;
use crate::agent::config::AgentSections;
use crate::agent::crio::apply::{self, ApplyOptions};
use crate::agent::host::systemd::Systemd;
use crate::agent::state::AgentState;
use crate::wire::NodeReport;

/// Builds the one-off report. `root` prefixes the CRI-O paths, as for `agent --root`.
pub async fn report(config: &AgentSections, root: Option<std::path::PathBuf>) -> NodeReport {
    let mut st = AgentState::new(
        super::node_name(config),
        "once".into(),
        super::boot_id(config),
    );
    let mut checks = Checks::from_config(&config.checks);
    st.apply_round(checks.run_once(Instant::now()).await);
    let sources = crate::agent::sources::poll_once(&config.sources).await;
    if let Some(id) = sources.identity {
        st.set_identity(id);
    }
    let opts = ApplyOptions {
        root,
        dry_run: true,
    };
    let (plan, result) = apply::apply(&config.crio, &opts, Systemd::connect_system).await;
    st.set_crio(super::crio_config_hash(config), &plan, &result, Utc::now());
    let mut report = st.report(sources.events, Utc::now());
    report.problems.extend(
        sources
            .errors
            .into_iter()
            .map(|e| crate::wire::Problem::new("metadata source", e.to_string())),
    );
    report
}
