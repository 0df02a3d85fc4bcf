//! Host dependencies behind narrow traits: systemd over D-Bus (and fakes for unit tests).

pub mod fake;
pub mod systemd;
