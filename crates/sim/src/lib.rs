//! Test and demo stand-ins for the real peers nodekeeper talks to, and the demo. A crate of its
//! own so that nothing here ever links into the agent build; it depends on `nodekeeper-core`,
//! never the other way round.
//!
//! - [`apiserver`]: a Kubernetes API server stand-in with simulated control loops (`nodekeeper sim apiserver`);
//! - [`imds`]: cloud instance-metadata emulators for OCI, AWS, Azure and GCP (`nodekeeper sim imds`);
//! - [`oci_compute`]: the OCI Compute / Container Engine calls of the `oci` replacement provider,
//!   with signature verification (`nodekeeper sim oci-compute`);
//! - [`oci_events`]: posts an OCI Events notification to the controller (`nodekeeper sim oci-event`).
//!
//! Each `nodekeeper sim` subcommand is a plain arguments struct and a `run` here; parsing them
//! (clap) is the binary's (`src/cli/sim.rs`), as for [`demo::DemoArgs`].

// No unwrap()/expect() on anything in library code; tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod apiserver;
pub mod demo;
pub mod imds;
pub mod oci_compute;
pub mod oci_events;
