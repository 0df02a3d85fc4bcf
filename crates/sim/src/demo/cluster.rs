//! The demo's cluster: the sim with two node pools (spot and on-demand, the OKE preemptible
//! taint on spot), workloads with PDBs, a Cilium-like DaemonSet, and the controller's policy
//! (the values OKE + KPO users run, durations divided by the demo's speed).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::apiserver::loops::LoopOptions;
use crate::apiserver::scenario::{DaemonSetSpec, PdbSpec, Pool, Scenario, Taint, Workload};
use crate::apiserver::SimOptions;
use nodekeeper_core::config::{ConfigError, Env};
use nodekeeper_core::config_file::Config;
use nodekeeper_core::controller::policy::PolicyConfig;

/// The taint OKE puts on preemptible (spot) nodes.
pub const PREEMPTIBLE_TAINT: &str = "oci.oraclecloud.com/oke-is-preemptible";
/// The migration label the agents clean (what OKE leaves after a Cilium migration).
pub const MIGRATION_LABEL: &str = "last-migration-failure";
/// The embedded controller configuration (see the file for what it mirrors).
pub const CONTROLLER_TOML: &str = include_str!("controller.toml");

/// The built-in demo cluster.
pub fn default_scenario() -> Scenario {
    let mut s = Scenario::default_mixed();
    s.pools = vec![
        pool("spot", 3, "spot", true),
        pool("on-demand", 3, "on-demand", false),
    ];
    // Tolerates the spot pool's taint (not every taint: pods tolerating the drain taint stay).
    let tolerate_spot = |w: &mut Workload| w.tolerate = vec![PREEMPTIBLE_TAINT.into()];
    let mut web = s.workloads[0].clone();
    web.replicas = 16;
    web.termination_grace_seconds = 2;
    web.pdb = Some(PdbSpec {
        min_available: None,
        max_unavailable: Some(toml::Value::Integer(1)),
    });
    tolerate_spot(&mut web);
    let mut api = web.clone();
    api.name = "api".into();
    api.replicas = 4;
    api.tolerate.clear();
    api.pdb = Some(PdbSpec {
        min_available: Some(toml::Value::Integer(3)),
        max_unavailable: None,
    });
    s.workloads = vec![web, api];
    s.daemonsets = vec![
        DaemonSetSpec {
            name: "cilium".into(),
            namespace: "kube-system".into(),
            tolerate_all: true,
            node_selector: BTreeMap::new(),
        },
        DaemonSetSpec {
            name: "node-exporter".into(),
            namespace: "monitoring".into(),
            tolerate_all: true,
            node_selector: BTreeMap::new(),
        },
    ];
    s
}

fn pool(name: &str, count: usize, capacity_type: &str, preemptible: bool) -> Pool {
    let mut p = Scenario::default_mixed().pools.remove(0);
    p.name = name.into();
    p.count = count;
    p.capacity_type = capacity_type.into();
    p.instance_type = "VM.Standard.E5.Flex".into();
    if preemptible {
        p.taints = vec![Taint {
            key: PREEMPTIBLE_TAINT.into(),
            value: "true".into(),
            effect: "NoSchedule".into(),
        }];
    }
    p
}

/// Sim options for the demo: real-time clock (policy durations are scaled instead, so the
/// controller's clock and the cluster's agree), fast kubelets and provisioner.
pub fn sim_options(scenario: Scenario) -> SimOptions {
    SimOptions {
        time_scale: 1.0,
        loops: LoopOptions {
            tick: Duration::from_millis(100),
            heartbeat_interval: Duration::from_secs(2),
            node_monitor_grace: Duration::from_secs(8),
            pod_start_delay: Duration::from_millis(500),
            terminate_delay: Duration::from_secs(1),
            launch_delay: Duration::from_secs(3),
            ..LoopOptions::default()
        },
        scenario,
        ..SimOptions::default()
    }
}

/// Sets a node's `Ready` condition through the sim's admin API at `admin` (`.../sim/v1/`), as a
/// kubelet that stopped posting Ready would.
pub async fn set_ready(admin: &str, node: &str, status: &str) -> Result<(), String> {
    let body = serde_json::json!({"type": "Ready", "status": status, "reason": "KubeletNotReady",
        "message": "container runtime network not ready (injected by nodekeeper demo)"});
    let url = format!("{admin}nodes/{node}/conditions");
    let fail = |e: String| format!("cannot set Ready={status} on {node}: {e}");
    let resp = nodekeeper_core::http::client()
        .map_err(|e| fail(e.to_string()))?
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(fail(resp.status().to_string()));
    }
    Ok(())
}

/// Loads the controller configuration (`--controller-config` or the embedded one) with
/// located diagnostics, and scales its policy durations by `1/speed`.
pub fn policy(file: Option<&Path>, speed: f64) -> Result<(Config, PolicyConfig), ConfigError> {
    let loaded = match file {
        Some(p) => Config::load(p, &Env::default())?,
        None => Config::load_str(
            Path::new("<embedded demo controller.toml>"),
            CONTROLLER_TOML,
            &Env::default(),
        )?,
    };
    let mut policy = loaded.config.policy();
    scale_policy(&mut policy, speed);
    Ok((loaded.config, policy))
}

/// Divides every policy duration by `speed` (`speed` ≤ 1 leaves them as they are).
pub fn scale_policy(p: &mut PolicyConfig, speed: f64) {
    if speed <= 1.0 {
        return;
    }
    let s = |d: &mut Duration| *d = d.div_f64(speed);
    let r = &mut p.repair;
    for pol in r.policy.iter_mut().chain(r.repair_policies.iter_mut()) {
        s(&mut pol.toleration);
    }
    for g in r.groups.values_mut() {
        for list in [&mut g.policy, &mut g.repair_policies]
            .into_iter()
            .flatten()
        {
            for pol in list {
                s(&mut pol.toleration);
            }
        }
    }
    for d in [
        &mut r.healthy_delay,
        &mut r.drain_timeout,
        &mut r.reboot_timeout,
        &mut r.replace_timeout,
        &mut r.startup_timeout,
    ] {
        s(d);
    }
    let i = &mut p.interruption;
    for d in [
        &mut i.safety_margin,
        &mut i.default_lead,
        &mut i.release_after,
    ] {
        s(d);
    }
    for b in p
        .budgets
        .default
        .iter_mut()
        .chain(p.budgets.groups.values_mut().flatten())
    {
        if let Some(d) = b.duration.as_mut() {
            s(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_config_is_seed_000_and_scales() {
        let (_, p) = policy(None, 60.0).unwrap();
        let tol = p.repair.repair_policies[0].toleration;
        assert_eq!(tol, Duration::from_secs(10), "600 s / 60");
        assert_eq!(p.budgets.default[0].nodes.to_string(), "1");
        let (_, same) = policy(None, 1.0).unwrap();
        assert_eq!(
            same.repair.repair_policies[0].toleration,
            Duration::from_secs(600)
        );
    }

    #[test]
    fn scenario_has_spot_taint_and_pdbs() {
        let s = default_scenario();
        assert_eq!(s.pools.len(), 2);
        assert_eq!(s.pools[0].taints[0].key, PREEMPTIBLE_TAINT);
        assert!(s.workloads.iter().all(|w| w.pdb.is_some()));
        assert!(s.daemonsets.iter().any(|d| d.name == "cilium"));
    }
}
