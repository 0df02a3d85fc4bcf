//! What agents and OCI Notifications call: the HTTPS API ([`server`], its shared state and body
//! limits in [`app`]), who may call it ([`auth`]:
//! TokenReview and the node binding), and the OCI Notifications endpoint ([`oci_events`]).

pub mod app;
pub mod auth;
pub mod oci_events;
pub mod server;
