//! Integration tests that need nothing but the build: pure functions, property tests, fuzzing
//! smoke, configuration parsing, and the notification and webhook clients against in-process
//! receivers on 127.0.0.1. No external binary: the manifests tests, which run the real kubectl,
//! are in `host`. One test binary (`cargo test --test unit_like`); each former `tests/NAME.rs`
//! is the module `NAME`.
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod catalog;
mod checks_config;
mod checks_systemd;
mod drain_select_prop;
mod fuzz_smoke;
mod imds_parsers_prop;
mod layering;
mod notify_webhook;
mod policy_config;
mod policy_karpenter_repair;
mod policy_ladder;
mod policy_nodepool;
mod policy_prespin;
mod policy_props;
mod policy_table;
mod policy_veto;
mod provider_karpenter;
mod provider_none;
mod provider_webhook;
