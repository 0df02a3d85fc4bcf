//! nodekeeper end to end on a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and KWOK, built from Go modules), as the shipped ServiceAccounts: RBAC, the
//! ValidatingAdmissionPolicy, TokenRequest/TokenReview and the disruption controller are the real ones.
//! One cluster serves the whole binary (`support::cluster()`); each test uses nodes of its own.
//! Needs Go (scripts/setup-k8s.sh builds the binaries on first use) and the real kubectl
//! (scripts/setup-kubectl.sh); a missing prerequisite fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod support;

// The helpers shared with the other test binaries (tests/support/); `support` above is e2e's own.
#[path = "../support/mod.rs"]
mod shared;
use shared::{agent_proc, ctl, packaging as packaging_support};

mod demo;
mod drain;
mod events;
mod failover;
mod history;
mod identity;
mod install;
mod karpenter;
mod karpenter_budgets;
mod karpenter_random;
mod karpenter_repair;
mod kubectl_plugin;
mod labels;
mod ladder;
mod lifecycle;
mod node_write;
mod nodepool;
mod preemption;
mod privilege;
mod prometheus;
mod rbac;
mod real_node;
mod repair;
mod supervised;
mod veto;
mod whatif;
