//! The node agent: applies the CRI-O configuration at start, again on SIGHUP and whenever the
//! configuration file changes, and stops cleanly on SIGTERM/SIGINT.
//!
//! Later capabilities (health checks, metadata sources, label rules, reporting) join the same
//! `select!` loop.

pub mod checks;
pub mod crio;
pub mod host;
pub mod reporter;
pub mod sources;

use std::path::{Path, PathBuf};

use crate::agent::crio::apply::{self, ApplyOptions};
use crate::agent::host::systemd::Systemd;
use crate::config::{Config, Env, Loaded};
use crate::shutdown::Signals;

/// Options of `nodekeeper agent`.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Prefix for every host path (tests, demo).
    pub root: Option<PathBuf>,
}

/// Runs the agent until a termination signal. Returns the exit code.
pub async fn run(loaded: Loaded, env: Env, opts: AgentOptions, mut signals: Signals) -> u8 {
    let path = loaded.path.clone();
    let mut config = loaded.config;
    let mut fingerprint = file_fingerprint(&path);
    tracing::info!(config = %path.display(), version = crate::VERSION, "agent starting");
    apply_crio(&config, &opts).await;
    let mut poll = tokio::time::interval(config.agent.config_poll_interval);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = signals.shutdown.changed() => break,
            Some(()) = signals.reload.recv() => {
                tracing::info!("SIGHUP: reloading configuration");
                fingerprint = file_fingerprint(&path);
                if let Some(c) = reload(&path, &env) { config = c; }
                apply_crio(&config, &opts).await;
            }
            _ = poll.tick() => {
                let now = file_fingerprint(&path);
                if now != fingerprint {
                    fingerprint = now;
                    tracing::info!(config = %path.display(), "configuration file changed: reloading");
                    if let Some(c) = reload(&path, &env) {
                        config = c;
                        apply_crio(&config, &opts).await;
                    }
                }
            }
        }
    }
    tracing::info!("agent stopped");
    crate::cli::EXIT_OK
}

/// Re-reads the configuration; an invalid file is logged and the running configuration kept.
fn reload(path: &Path, env: &Env) -> Option<Config> {
    match Config::load(path, env) {
        Ok(l) => {
            for w in &l.warnings {
                tracing::warn!(diagnostic = %w.render(path), "configuration warning");
            }
            Some(l.config)
        }
        Err(e) => {
            tracing::error!(config = %path.display(), error = %e, "new configuration is invalid: keeping the running one");
            None
        }
    }
}

/// Content hash of the config file (None when unreadable), to notice edits and replacements.
fn file_fingerprint(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| crate::agent::crio::state::digest(&b))
}

async fn apply_crio(config: &Config, opts: &AgentOptions) {
    let aopts = ApplyOptions {
        root: opts.root.clone(),
        dry_run: false,
    };
    let (report, result) = apply::apply(&config.crio, &aopts, Systemd::connect_system).await;
    match result {
        Ok(()) if report.changed => tracing::info!(
            files = report.files.len(),
            restarted = report.restarted,
            unit_state = %report.unit_state,
            "CRI-O drop-ins applied"
        ),
        Ok(()) => tracing::debug!("CRI-O drop-ins unchanged"),
        Err(e) => {
            tracing::error!(error = %crate::cli::error_chain(&e), rolled_back = report.rolled_back, "CRI-O apply failed")
        }
    }
}
