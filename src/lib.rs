//! nodekeeper: one agent on every Kubernetes node plus a small central controller.
//!
//! Module map (see README "Architecture"):
//! - [`config`]: the typed TOML configuration, read once, validated, printed without secrets.
//! - [`agent`]: the node agent (CRI-O config, health checks, metadata sources, label rules).
//! - [`controller`]: the central controller (report API, node state, OCI Events, leader election).
//! - [`http`] and [`serve`]: the one outbound HTTP client and the one HTTP server.
//! - [`sim`]: the Kubernetes API stand-in and cloud metadata emulators used by tests and the demo.
//! - [`cli`]: the `nodekeeper` command line; the binary's `main` only calls [`cli::main`].

// No unwrap()/expect() on anything in library code; tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod agent;
pub mod backoff;
pub mod cli;
pub mod config;
pub mod controller;
pub mod demo;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod k8s;
pub mod report;
pub mod serve;
pub mod shutdown;
pub mod sim;
pub mod telemetry;

/// Version string printed by `nodekeeper --version`: crate version and git commit.
#[cfg(feature = "full")]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("NODEKEEPER_GIT_COMMIT"),
    ")"
);

/// Version string of the agent build (`--no-default-features`: no controller, drain, status,
/// sim or demo commands; see README "Builds").
#[cfg(not(feature = "full"))]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("NODEKEEPER_GIT_COMMIT"),
    ", agent build)"
);
