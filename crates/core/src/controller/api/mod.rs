//! What agents and OCI Notifications call: the HTTPS API ([`server`], its shared state and body
//! limits in [`app`]), who may call it ([`auth`]:
//! TokenReview and the node binding), the OCI Notifications endpoint ([`oci_events`]), and the
//! report versions it takes ([`report_versions`]).

pub mod app;
pub mod auth;
pub mod oci_events;
pub mod report_versions;
pub mod server;
