//! Integration tests on the simulated cluster (`nodekeeper_sim`, the API stand-in and its loops):
//! the engine, the controller and its report API, drains, the sim itself, labels, status, the
//! demo, the providers, API faults and security. `kubectl_everyday` and `sim_kubectl` also need
//! the real kubectl (and the first the real control plane). One test binary
//! (`cargo test --test sim`); each former `tests/NAME.rs` is the module `NAME`.
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod agent_to_controller;
mod controller_api;
mod controller_auth_pod;
mod controller_cli;
mod controller_connections;
mod controller_kill;
mod controller_leader;
mod controller_reporter;
mod controller_state;
mod demo_cli;
mod demo_run;
mod demo_whatif;
mod drain_blockers;
mod drain_cli;
mod drain_sim_loops;
mod drain_tiers;
mod engine_cancel_dryrun;
mod engine_interruption;
mod engine_nodepool_budgets;
mod engine_notify;
mod engine_oci_notice;
mod engine_repair;
mod engine_report_notice;
mod engine_resume;
mod faults_convergence;
mod karpenter_sim_drain;
mod kubectl_everyday;
mod labels_sim;
mod metrics_catalog;
mod provider_karpenter;
mod provider_oci;
mod security_api;
mod security_hostile;
mod sim_kube;
mod sim_kubeconfig;
mod sim_kubectl;
mod sim_loops;
mod sim_random_scenarios;
mod status_cli;
