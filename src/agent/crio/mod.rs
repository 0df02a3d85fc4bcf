//! Post-bootstrap CRI-O configuration: validated drop-ins, atomic writes, restart over systemd
//! D-Bus only on change, rollback on failure.

pub mod lint;
