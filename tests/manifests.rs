//! Every manifest parses into its k8s-openapi type without unknown or dropped fields, the
//! embedded configurations are valid, and the RBAC is least-privilege.

mod packaging_support;

use std::collections::BTreeSet;
use std::process::Command;

use k8s_openapi::api::core::v1::ServiceAccount;
use packaging_support::{grants, load, manifest_docs, metric_names, rules_of, typed, All};
use serde_json::Value;

fn docs() -> Vec<(String, Value)> {
    manifest_docs()
}

fn load_all() -> All {
    load(&docs())
}

#[test]
fn typed_round_trip_rejects_unknown_fields() {
    let v = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}, "automountToken": false});
    let r = std::panic::catch_unwind(|| typed::<ServiceAccount>("t", &v));
    assert!(r.is_err(), "a misspelt field must fail");
}

#[test]
fn manifests_parse_and_rbac_is_least_privilege() {
    let a = load_all();
    let agent = grants(&rules_of(&a, "nodekeeper-agent"));
    let want_agent: BTreeSet<String> = ["/nodes:get", "/pods:list", "/pods:watch"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(agent, want_agent, "the agent must be read-only");
    let ctl = grants(&rules_of(&a, "nodekeeper-controller"));
    let want_ctl: BTreeSet<String> = [
        "/nodes:get",
        "/nodes:list",
        "/nodes:watch",
        "/nodes:patch",
        "/nodes/status:patch",
        "/pods:get",
        "authentication.k8s.io/tokenreviews:create",
        "coordination.k8s.io/leases:get",
        "coordination.k8s.io/leases:create",
        "coordination.k8s.io/leases:update",
        "events.k8s.io/events:create",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(ctl, want_ctl);
    for g in agent.iter().chain(ctl.iter()) {
        assert!(!g.contains("secrets"), "{g}");
    }
    // Bindings point at the right service accounts.
    for b in &a.crbs {
        let n = b.metadata.name.as_deref().unwrap();
        let s = &b.subjects.as_ref().unwrap()[0];
        assert_eq!(
            (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()),
            ("ServiceAccount", n, Some("nodekeeper"))
        );
        assert_eq!(b.role_ref.name, n);
    }
    assert_eq!(a.rbs.len(), 1);
}

#[test]
fn workloads_have_the_required_shape() {
    let a = load_all();
    let ds = &a.daemonsets[0];
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("nodekeeper-agent")
    );
    let token = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .find_map(|s| s.service_account_token.as_ref())
        .expect("projected token");
    assert_eq!(token.audience.as_deref(), Some("nodekeeper"));

    let dep = a.deployments[0].spec.as_ref().unwrap();
    assert_eq!(dep.replicas, Some(2));
    let aff = dep
        .template
        .spec
        .as_ref()
        .unwrap()
        .affinity
        .as_ref()
        .unwrap();
    let anti = aff.pod_anti_affinity.as_ref().unwrap();
    assert!(anti
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .is_some_and(|t| t[0].topology_key == "kubernetes.io/hostname"));
    let na = aff
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap();
    assert!(na
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .any(|e| e.key == "karpenter.sh/nodepool" && e.operator == "DoesNotExist"));
    assert_eq!(a.pdbs.len(), 1);
    assert_eq!(a.services.len(), 1);

    // The admission policy covers the agent SA and Node writes, and is bound.
    let vap = a.vaps[0].spec.as_ref().unwrap();
    let mc = vap.match_conditions.as_ref().unwrap();
    assert!(mc[0]
        .expression
        .contains("system:serviceaccount:nodekeeper:nodekeeper-agent"));
    let rr = &vap
        .match_constraints
        .as_ref()
        .unwrap()
        .resource_rules
        .as_ref()
        .unwrap()[0];
    assert!(rr
        .resources
        .as_ref()
        .unwrap()
        .contains(&"nodes".to_string()));
    assert!(rr
        .operations
        .as_ref()
        .unwrap()
        .contains(&"UPDATE".to_string()));
    assert!(vap.validations.as_ref().unwrap()[0]
        .expression
        .contains("request.name"));
    let b = a.vapbs[0].spec.as_ref().unwrap();
    assert_eq!(b.policy_name.as_deref(), a.vaps[0].metadata.name.as_deref());
    assert_eq!(
        b.validation_actions.as_deref(),
        Some(&["Deny".to_string()][..])
    );
}

#[test]
fn embedded_configs_are_valid() {
    let a = load_all();
    let cfgs = packaging_support::configs(&a);
    assert_eq!(
        cfgs.keys().map(String::as_str).collect::<Vec<_>>(),
        ["nodekeeper-agent", "nodekeeper-controller"]
    );
    let agent = packaging_support::validate_config("agent config.toml", &cfgs["nodekeeper-agent"]);
    // Atomic renames need state_dir and the drop-in dir on one mount: the DaemonSet's /etc/crio
    // hostPath volume (each volume is a mount of its own).
    let ds = a.daemonsets[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let mounts: Vec<String> = ds.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.clone())
        .collect();
    let covering: Vec<&String> = mounts
        .iter()
        .filter(|m| {
            agent.crio.state_dir.starts_with(m.as_str())
                && agent.crio.dropin_dir.starts_with(m.as_str())
        })
        .collect();
    assert_eq!(
        covering,
        [&"/etc/crio".to_string()],
        "state_dir and dropin_dir on one volume"
    );
    assert!(
        !mounts.iter().any(|m| m.starts_with("/etc/crio/")),
        "no volume below /etc/crio may split it: {mounts:?}"
    );
    assert_eq!(
        agent.report.unwrap().server_name.as_deref(),
        Some("nodekeeper-controller.nodekeeper.svc")
    );
    let ctl = packaging_support::validate_config(
        "controller config.toml",
        &cfgs["nodekeeper-controller"],
    );
    let c = ctl.controller.unwrap();
    assert_eq!(
        c.service_account,
        "system:serviceaccount:nodekeeper:nodekeeper-agent"
    );
    assert!(c.dry_run, "the shipped controller config starts in dry-run");
    assert_eq!(ctl.budgets.group_by, "karpenter.sh/nodepool");
}

/// The kubectl from `scripts/setup-kubectl.sh` (installed on first use).
fn kubectl() -> std::path::PathBuf {
    let repo = packaging_support::repo();
    let out = Command::new(repo.join("scripts/setup-kubectl.sh"))
        .output()
        .expect("run scripts/setup-kubectl.sh");
    assert!(
        out.status.success(),
        "setup-kubectl.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    repo.join(".cache/venv/bin/kubectl")
}

#[test]
fn kustomize_renders_every_manifest_unchanged() {
    let repo = packaging_support::repo();
    // Every manifest file is listed in kustomization.yaml (and nothing else).
    let k: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo.join("manifests/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let files: BTreeSet<String> = docs().into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        listed, files,
        "kustomization.yaml resources vs manifests/*.yaml"
    );

    let out = Command::new(kubectl())
        .args(["kustomize", "manifests"])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = packaging_support::yaml_docs("kustomize", &String::from_utf8_lossy(&out.stdout));
    let key = |v: &Value| {
        format!(
            "{}/{}/{}",
            v["kind"].as_str().unwrap_or(""),
            v["metadata"]["namespace"].as_str().unwrap_or(""),
            v["metadata"]["name"].as_str().unwrap_or("")
        )
    };
    let mut want: Vec<(String, Value)> = docs().into_iter().map(|(_, v)| (key(&v), v)).collect();
    let mut got: Vec<(String, Value)> = rendered.into_iter().map(|(_, v)| (key(&v), v)).collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got.iter().map(|g| &g.0).collect::<Vec<_>>(),
        want.iter().map(|w| &w.0).collect::<Vec<_>>()
    );
    for ((id, g), (_, w)) in got.iter().zip(&want) {
        assert_eq!(g, w, "{id}: kustomize output differs from the file");
    }
    // And the render parses into the typed models like the files do.
    let typed_all = load(&got.into_iter().collect::<Vec<_>>());
    assert_eq!(typed_all.prometheus_rules.len(), 1);
}

/// Every `nodekeeper_*` token in docs/catalog.md and in the sources (the names the binary exports).
fn known_metrics() -> BTreeSet<String> {
    let repo = packaging_support::repo();
    let mut text = std::fs::read_to_string(repo.join("docs/catalog.md")).unwrap();
    let mut stack = vec![repo.join("src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                text.push_str(&std::fs::read_to_string(p).unwrap());
            }
        }
    }
    metric_names(&text)
}

#[test]
fn alerts_cover_the_issue_and_use_known_metrics() {
    let a = load_all();
    let rule = &a.prometheus_rules[0];
    let alerts: Vec<_> = rule.spec.groups.iter().flat_map(|g| &g.rules).collect();
    let names: BTreeSet<&str> = alerts.iter().map(|r| r.alert.as_str()).collect();
    for want in [
        "NodekeeperNodeHeldTooLong",
        "NodekeeperDrainBlocked",
        "NodekeeperShortCircuitActive",
        "NodekeeperAgentSilent",
    ] {
        assert!(names.contains(want), "missing alert {want}");
    }
    let known = known_metrics();
    assert!(known.contains("nodekeeper_nodes_marked_stale_total"));
    for r in &alerts {
        let used = metric_names(&r.expr);
        assert!(
            !used.is_empty(),
            "{}: no nodekeeper metric in {}",
            r.alert,
            r.expr
        );
        for m in used {
            assert!(
                known.contains(&m),
                "{}: metric {m} is not in docs/catalog.md nor exported by src/",
                r.alert
            );
        }
        assert!(
            r.labels.contains_key("severity"),
            "{}: no severity",
            r.alert
        );
        assert!(
            r.annotations.contains_key("summary"),
            "{}: no summary",
            r.alert
        );
    }
}

#[test]
fn service_monitor_scrapes_the_controller_service() {
    let a = load_all();
    let sm = &a.service_monitors[0];
    let svc = a
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("nodekeeper-controller"))
        .unwrap();
    let labels = svc.metadata.labels.clone().unwrap_or_default();
    for (k, v) in sm.spec.selector.match_labels.iter().flatten() {
        assert_eq!(
            labels.get(k),
            Some(v),
            "ServiceMonitor selector {k}={v} vs Service labels"
        );
    }
    let ports: BTreeSet<String> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.name.clone())
        .collect();
    let ep = &sm.spec.endpoints[0];
    assert!(
        ports.contains(&ep.port),
        "port {} not on the Service",
        ep.port
    );
    assert_eq!(
        (ep.path.as_str(), ep.scheme.as_str()),
        ("/metrics", "https")
    );
    assert_eq!(
        ep.tls_config
            .as_ref()
            .and_then(|t| t.server_name.as_deref()),
        Some("nodekeeper-controller.nodekeeper.svc")
    );
}
