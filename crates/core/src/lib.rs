//! nodekeeper's product library: one agent on every Kubernetes node plus a small central controller.
//!
//! Module map (docs/dev/architecture.md):
//! - [`config`]: the configuration engine (every error located, `NODEKEEPER_*` overrides, secrets
//!   printed redacted) and the shared `[log]` and `[node]` sections;
//!   [`config_file`]: the whole file, composed of the agent's and the controller's sections.
//! - [`agent`]: the node agent (CRI-O config, health checks, metadata sources, label rules, reporter).
//! - `controller` (feature `controller`): the central controller (report API, node state, policy,
//!   drains, providers, OCI Events, leader election).
//! - [`wire`]: everything that crosses the agent → controller boundary (the report, its events,
//!   checks and identity, the commands); [`text`]: `truncate`, its one leaf.
//! - [`k8s`], [`http`] (the one outbound HTTP client), `serve` (feature `controller`: the one HTTP
//!   server), [`backoff`], [`telemetry`], [`shutdown`]: shared helpers, one copy each.
//!
//! No CLI here: argument parsing, runtimes, printing and exit codes live in the `nodekeeper`
//! binary crate; the test and demo stand-ins live in `nodekeeper-sim`, which nothing here uses.

// No unwrap()/expect() on anything in library code; tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod agent;
pub mod backoff;
pub mod config;
pub mod config_file;
#[cfg(feature = "controller")]
pub mod controller;
#[doc(hidden)]
#[cfg(feature = "controller")]
pub mod fuzzing;
pub mod http;
pub mod k8s;
#[cfg(feature = "controller")]
pub mod serve;
pub mod shutdown;
pub mod sync;
pub mod telemetry;
pub mod text;
pub mod wire;

/// Version string printed by `nodekeeper --version`: crate version and git commit.
#[cfg(feature = "controller")]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("NODEKEEPER_GIT_COMMIT"),
    ")"
);

/// Version string of the agent build (no `controller` feature: no controller, drain, status,
/// sim or demo commands; see README "Builds").
#[cfg(not(feature = "controller"))]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("NODEKEEPER_GIT_COMMIT"),
    ", agent build)"
);
