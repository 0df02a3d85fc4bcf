//! Integration tests of the binary on this host: the agent and `crio apply` CLIs, health checks
//! against the machine and `/dev/kmsg`, real systemd in systemd-nspawn containers, the metadata
//! sources (emulators on loopback and, in a network namespace, at 169.254.169.254), packaging
//! (.deb, .rpm, image, Helm), the manifests (rendered by the real kubectl's kustomize). Tests
//! that need root are `#[ignore = "needs root …"]`: run them with `-- --include-ignored`
//! (scripts/test.sh does). One test binary (`cargo test --test host`); each former
//! `tests/NAME.rs` is the module `NAME`.
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod aemm_netns;
mod agent_cli;
mod agent_reboot_nspawn;
mod agent_shutdown_nspawn;
mod checks_host;
mod checks_kmsg;
mod checks_systemd_nspawn;
mod cli_crio;
mod crio_apply_systemd;
mod crio_real;
mod crio_shortnames;
mod grafana_dashboard;
mod helm_chart;
mod imds_config;
mod imds_netns;
mod imds_sources;
mod manifests;
mod oci_sdk_crosscheck;
mod packaging_deb;
mod packaging_image;
mod packaging_plugin;
mod packaging_rpm;
mod prometheus_rules;
mod systemd_logind;
mod systemd_units;
mod unit_files;
