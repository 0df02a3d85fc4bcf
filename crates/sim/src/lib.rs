//! Test and demo stand-ins for the real peers nodekeeper talks to, and the demo. A crate of its
//! own so that nothing here ever links into the agent build; it depends on `nodekeeper-core`,
//! never the other way round.
//!
//! - [`apiserver`]: a Kubernetes API server stand-in with simulated control loops (`nodekeeper sim apiserver`);
//! - [`imds`]: cloud instance-metadata emulators for OCI, AWS, Azure and GCP (`nodekeeper sim imds`);
//! - [`oci_compute`]: the OCI Compute / Container Engine calls of the `oci` replacement provider,
//!   with signature verification (`nodekeeper sim oci-compute`).

// No unwrap()/expect() on anything in library code; tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod apiserver;
pub mod demo;
pub mod imds;
pub mod oci_compute;
pub mod oci_events;

/// `nodekeeper sim ...` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SimCommand {
    /// Run the Kubernetes API stand-in (with simulated kubelets, scheduler, controllers).
    Apiserver(apiserver::ApiserverArgs),
    /// Mint a service-account token bound to a pod and node (for TokenReview tests).
    Token(apiserver::TokenArgs),
    /// Serve a cloud's instance-metadata API (OCI, AWS, Azure, GCP) with an admin endpoint.
    Imds(imds::ImdsArgs),
    /// Post an OCI Events notification (preemption, maintenance) to the controller.
    OciEvent(oci_events::OciEventArgs),
    /// Serve a stand-in of the OCI Compute / OKE API calls of the `oci` replacement provider
    /// (signatures verified; removes and replaces the cluster's Node on DELETE).
    OciCompute(oci_compute::OciComputeArgs),
}

/// Runs a `sim` subcommand; returns the process exit code.
pub async fn run(cmd: SimCommand) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    match cmd {
        SimCommand::Apiserver(args) => apiserver::run_apiserver(args).await,
        SimCommand::Token(args) => apiserver::run_token(args).await,
        SimCommand::Imds(args) => imds::run(args).await,
        SimCommand::OciEvent(args) => oci_events::run(args).await,
        SimCommand::OciCompute(args) => oci_compute::run(args).await,
    }
}
