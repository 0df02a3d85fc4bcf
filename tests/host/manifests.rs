//! Every manifest parses into its k8s-openapi type without unknown or dropped fields, the
//! embedded configurations are valid, and the RBAC grants exactly the API calls listed in
//! tests/fixtures/api-calls.toml (which must name every source file of the workspace that calls the API).

use crate::support::packaging as packaging_support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use k8s_openapi::api::core::v1::{PodSpec, ServiceAccount, Volume};
use k8s_openapi::api::rbac::v1::PolicyRule;
use packaging_support::rbac::{self, Request, Scope, Where};
use packaging_support::{
    load, manifest_docs, manifest_docs_in, metric_names, repo, typed, All, MANIFEST_COMPONENTS,
};
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

/// `kubectl kustomize manifests`, as documents (what `kubectl apply -k manifests` applies).
fn kustomized() -> Vec<(String, Value)> {
    kustomize(&repo().join("manifests"))
}

/// `kubectl kustomize DIR`, as documents.
fn kustomize(dir: &std::path::Path) -> Vec<(String, Value)> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    packaging_support::yaml_docs("kustomize", &String::from_utf8_lossy(&out.stdout))
}

/// An overlay of `manifests/` with every component of [`MANIFEST_COMPONENTS`] enabled, rendered.
fn kustomized_with_components() -> Vec<(String, Value)> {
    let dir = tempfile::tempdir().unwrap();
    packaging_support::write_overlay(dir.path(), MANIFEST_COMPONENTS);
    kustomize(dir.path())
}

#[test]
fn kustomize_rbac_grants_every_inventoried_call() {
    let a = load(&kustomized());
    let c = rbac::check(&a, "nodekeeper", &rbac::inventory());
    assert!(
        c.missing.is_empty(),
        "calls in tests/fixtures/api-calls.toml the manifests' RBAC denies:\n{}",
        c.missing.join("\n")
    );
    assert!(
        c.unexpected.is_empty(),
        "calls marked granted = false that the RBAC allows:\n{}",
        c.unexpected.join("\n")
    );
}

#[test]
fn kustomize_rbac_grants_nothing_the_inventory_does_not_use() {
    let a = load(&kustomized());
    let c = rbac::check(&a, "nodekeeper", &rbac::inventory());
    assert!(
        c.unused.is_empty(),
        "granted, but no row of tests/fixtures/api-calls.toml needs it (or not that widely):\n{}",
        c.unused.join("\n")
    );
    // Nothing bound to anyone else, nothing left unbound.
    assert_eq!(
        rbac::subjects(&a),
        BTreeSet::from([
            "nodekeeper/nodekeeper-agent".to_string(),
            "nodekeeper/nodekeeper-controller".to_string()
        ])
    );
    assert_eq!(rbac::unbound_roles(&a), Vec::<String>::new());
    // Events about Nodes only in default; the Lease only in the controller's namespace.
    let ctl = rbac::bound_rules(&a, "nodekeeper", "nodekeeper-controller");
    let req = |group: &str, resource: &str, verb: &str, ns: &str| Request {
        verb: verb.into(),
        group: group.into(),
        resource: resource.into(),
        subresource: String::new(),
        scope: Scope::Namespace(ns.into()),
    };
    assert!(
        !rbac::allowed_by(&ctl, &req("events.k8s.io", "events", "create", "default")).is_empty()
    );
    assert!(rbac::allowed_by(
        &ctl,
        &req("events.k8s.io", "events", "create", "nodekeeper")
    )
    .is_empty());
    assert!(rbac::allowed_by(
        &ctl,
        &req("coordination.k8s.io", "leases", "update", "default")
    )
    .is_empty());
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(v(groups)),
        resources: Some(v(resources)),
        verbs: v(verbs),
        ..PolicyRule::default()
    }
}

#[test]
fn the_rbac_evaluator_follows_the_api_servers_rules() {
    let bound = |r: PolicyRule, at: Where| {
        vec![rbac::Bound {
            rule: r,
            scope: at,
            via: "t".into(),
        }]
    };
    let req = |resource: &str, sub: &str, verb: &str, scope: Scope| Request {
        verb: verb.into(),
        group: String::new(),
        resource: resource.into(),
        subresource: sub.into(),
        scope,
    };
    let ns = |n: &str| Scope::Namespace(n.into());
    let everywhere = bound(
        rule(&[""], &["pods"], &["create", "list"]),
        Where::Everywhere,
    );
    // A subresource is its own resource: `pods` does not grant `pods/eviction`.
    assert!(rbac::allowed_by(
        &everywhere,
        &req("pods", "eviction", "create", Scope::AnyNamespace)
    )
    .is_empty());
    assert!(
        !rbac::allowed_by(&everywhere, &req("pods", "", "create", Scope::AnyNamespace)).is_empty()
    );
    assert!(!rbac::allowed_by(&everywhere, &req("pods", "", "list", Scope::Cluster)).is_empty());
    assert!(rbac::allowed_by(&everywhere, &req("pods", "", "watch", Scope::Cluster)).is_empty());
    let ev = bound(
        rule(&[""], &["pods/eviction"], &["create"]),
        Where::Everywhere,
    );
    assert!(!rbac::allowed_by(&ev, &req("pods", "eviction", "create", ns("shop"))).is_empty());
    assert!(rbac::allowed_by(&ev, &req("pods", "", "create", ns("shop"))).is_empty());
    // `*/status` matches any resource's status; the group must match.
    let st = bound(rule(&[""], &["*/status"], &["patch"]), Where::Everywhere);
    assert!(!rbac::allowed_by(&st, &req("nodes", "status", "patch", Scope::Cluster)).is_empty());
    let other = bound(rule(&["apps"], &["nodes"], &["get"]), Where::Everywhere);
    assert!(rbac::allowed_by(&other, &req("nodes", "", "get", Scope::Cluster)).is_empty());
    // A RoleBinding grants only in its namespace: not cluster-wide, not in every namespace.
    let in_ns = bound(
        rule(&[""], &["pods"], &["get", "list"]),
        Where::Namespace("nk".into()),
    );
    assert!(!rbac::allowed_by(&in_ns, &req("pods", "", "get", ns("nk"))).is_empty());
    assert!(rbac::allowed_by(&in_ns, &req("pods", "", "get", ns("default"))).is_empty());
    assert!(rbac::allowed_by(&in_ns, &req("pods", "", "list", Scope::Cluster)).is_empty());
    assert!(rbac::allowed_by(&in_ns, &req("pods", "", "get", Scope::AnyNamespace)).is_empty());
    // resourceNames never match these nameless requests.
    let mut named = rule(&[""], &["nodes"], &["list"]);
    named.resource_names = Some(vec!["n1".into()]);
    assert!(rbac::allowed_by(
        &bound(named, Where::Everywhere),
        &req("nodes", "", "list", Scope::Cluster)
    )
    .is_empty());
    // Least privilege: a grant everywhere is too wide for a call into one namespace.
    let atom = rbac::Atom {
        at: Where::Everywhere,
        group: String::new(),
        resource: "pods".into(),
        verb: "get".into(),
    };
    assert!(!rbac::uses(&req("pods", "", "get", ns("nk")), &atom));
    assert!(rbac::uses(
        &req("pods", "", "get", Scope::AnyNamespace),
        &atom
    ));
}

/// Where a site's function is defined: `fn NAME` followed by `(` or `<`.
fn defines(text: &str, function: &str) -> bool {
    let re = regex::Regex::new(&format!(r"\bfn {}\s*[(<]", regex::escape(function))).unwrap();
    re.is_match(text)
}

#[test]
fn every_file_with_api_calls_is_in_the_inventory() {
    let inv = rbac::inventory();
    let pattern = rbac::api_call_pattern();
    let listed: BTreeMap<&str, Vec<&rbac::Call>> = inv.iter().fold(BTreeMap::new(), |mut m, c| {
        m.entry(c.file()).or_default().push(c);
        m
    });
    let mut calling = BTreeSet::new();
    for f in rbac::SOURCE_DIRS
        .iter()
        .flat_map(|d| rbac::rust_files(&repo().join(d)))
    {
        let text = std::fs::read_to_string(repo().join(&f)).unwrap();
        if let Some(m) = pattern.find(&text) {
            let line = text[..m.start()].lines().count().max(1);
            assert!(
                listed.contains_key(f.as_str()),
                "{f}:{line}: `{}` calls the Kubernetes API but tests/fixtures/api-calls.toml has no row for {f}",
                m.as_str()
            );
            calling.insert(f);
        }
    }
    for (file, rows) in &listed {
        let text = std::fs::read_to_string(repo().join(file))
            .unwrap_or_else(|e| panic!("tests/fixtures/api-calls.toml names {file}: {e}"));
        assert!(
            calling.contains(*file),
            "{file} is in tests/fixtures/api-calls.toml but calls no Kubernetes API any more"
        );
        for c in rows {
            assert!(
                defines(&text, c.function()),
                "tests/fixtures/api-calls.toml: {} — no fn {} in {file}",
                c.site,
                c.function()
            );
        }
    }
    // The calls the shipped RBAC must serve are there.
    let has = |who: &str, verb: &str, group: &str, res: &str, sub: &str| {
        inv.iter().any(|c| {
            c.made_by(who)
                && c.verb == verb
                && c.group == group
                && c.resource == res
                && c.subresource == sub
        })
    };
    assert!(has("controller", "create", "", "pods", "eviction"));
    assert!(has(
        "controller",
        "delete",
        "karpenter.sh",
        "nodeclaims",
        ""
    ));
    assert!(has("agent", "watch", "", "nodes", ""));
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
    assert_agent_tokens(pod);

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
    // The report API (every replica) and the OCI Events deliveries (the leader's pod only).
    let selectors: Vec<(String, Option<String>)> = a
        .services
        .iter()
        .map(|s| {
            let sel = s
                .spec
                .as_ref()
                .unwrap()
                .selector
                .clone()
                .unwrap_or_default();
            (
                s.metadata.name.clone().unwrap(),
                sel.get("nodekeeper.io/leader").cloned(),
            )
        })
        .collect();
    assert_eq!(
        selectors,
        [
            ("nodekeeper-controller".to_string(), None),
            (
                "nodekeeper-controller-events".to_string(),
                Some("true".to_string())
            ),
        ]
    );

    packaging_support::assert_admission_policy(&a, "nodekeeper");
    packaging_support::assert_flow_schemas(&a, "nodekeeper");
}

/// The bus address and its mount agree, and the checks read the node (kustomize's render and the files).
#[test]
fn every_host_path_the_agent_names_is_mounted_from_that_host_path() {
    packaging_support::assert_agent_host_paths(&load_all());
    packaging_support::assert_agent_host_paths(&load(&kustomized()));
}

fn volume<'a>(pod: &'a PodSpec, name: &str) -> &'a Volume {
    pod.volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

fn mount_path(pod: &PodSpec, name: &str) -> String {
    let m = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == name);
    let m = m.unwrap_or_else(|| panic!("volume {name} not mounted"));
    assert_eq!(m.read_only, Some(true), "{name}");
    m.mount_path.clone()
}

/// The agent pod: no automatic token; an API token where in-cluster clients look (kube-rs
/// `Client::try_default`) and the audience-`nodekeeper` token for the controller beside it.
fn assert_agent_tokens(pod: &PodSpec) {
    assert_eq!(pod.automount_service_account_token, Some(false));
    let api = volume(pod, "kube-api-access").projected.as_ref().unwrap();
    let src = api.sources.as_ref().unwrap();
    assert_eq!(src.len(), 3);
    let t = src[0].service_account_token.as_ref().unwrap();
    assert_eq!(
        (t.audience.as_deref(), t.expiration_seconds, t.path.as_str()),
        (None, Some(3607), "token"),
        "the API server's default audience, the automounted token's lifetime"
    );
    let ca = src[1].config_map.as_ref().unwrap();
    assert_eq!(ca.name, "kube-root-ca.crt");
    let item = &ca.items.as_ref().unwrap()[0];
    assert_eq!(
        (item.key.as_str(), item.path.as_str()),
        ("ca.crt", "ca.crt")
    );
    let ns = &src[2]
        .downward_api
        .as_ref()
        .unwrap()
        .items
        .as_ref()
        .unwrap()[0];
    assert_eq!(ns.path, "namespace");
    assert_eq!(
        ns.field_ref.as_ref().unwrap().field_path,
        "metadata.namespace"
    );
    assert_eq!(
        mount_path(pod, "kube-api-access"),
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );

    let ctl = volume(pod, "controller-token").projected.as_ref().unwrap();
    let t = ctl
        .sources
        .iter()
        .flatten()
        .find_map(|s| s.service_account_token.as_ref());
    assert_eq!(t.unwrap().audience.as_deref(), Some("nodekeeper"));
    assert_eq!(
        mount_path(pod, "controller-token"),
        "/var/run/secrets/nodekeeper"
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
    let agent =
        packaging_support::validate_config("agent config.toml", &cfgs["nodekeeper-agent"]).agent;
    // Atomic renames need state_dir and the drop-in dir on one mount: the DaemonSet's /etc/crio
    // hostPath volume (each volume is a mount of its own).
    let ds = packaging_support::agent_pod(&a);
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
    )
    .controller;
    let c = ctl.controller.unwrap();
    assert_eq!(
        c.service_account,
        "system:serviceaccount:nodekeeper:nodekeeper-agent"
    );
    assert!(c.dry_run, "the shipped controller config starts in dry-run");
    assert_eq!(ctl.budgets.group_by, "karpenter.sh/nodepool");
}

/// The kubectl from `scripts/setup-kubectl.sh` (scripts/setup.sh installs it before the tests;
/// no test installs anything): a missing one fails the test.
fn kubectl() -> std::path::PathBuf {
    crate::support::kubectl_bin()
}

/// The `resources` a kustomization.yaml lists.
fn listed_resources(kustomization: &std::path::Path) -> BTreeSet<String> {
    let k: Value = serde_yaml::from_str(&std::fs::read_to_string(kustomization).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", kustomization.display()));
    k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

/// `Kind/namespace/name` and the object, sorted by that key.
fn keyed(docs: Vec<(String, Value)>) -> Vec<(String, Value)> {
    let key = |v: &Value| {
        format!(
            "{}/{}/{}",
            v["kind"].as_str().unwrap_or(""),
            v["metadata"]["namespace"].as_str().unwrap_or(""),
            v["metadata"]["name"].as_str().unwrap_or("")
        )
    };
    let mut out: Vec<(String, Value)> = docs.into_iter().map(|(_, v)| (key(&v), v)).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `rendered` holds exactly the objects of `files`, each unchanged.
fn assert_same_objects(rendered: Vec<(String, Value)>, files: Vec<(String, Value)>, what: &str) {
    let (got, want) = (keyed(rendered), keyed(files));
    assert_eq!(
        got.iter().map(|g| &g.0).collect::<Vec<_>>(),
        want.iter().map(|w| &w.0).collect::<Vec<_>>(),
        "{what}"
    );
    for ((id, g), (_, w)) in got.iter().zip(&want) {
        assert_eq!(g, w, "{what}: {id}: kustomize output differs from the file");
    }
}

#[test]
fn kustomize_renders_every_manifest_unchanged() {
    let repo = packaging_support::repo();
    // Every manifest file is listed in kustomization.yaml (and nothing else), and each
    // component's files in its own.
    let base: BTreeSet<String> = manifest_docs_in("").into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        listed_resources(&repo.join("manifests/kustomization.yaml")),
        base,
        "manifests/kustomization.yaml resources vs manifests/*.yaml"
    );
    for c in MANIFEST_COMPONENTS {
        let k = repo.join("manifests").join(c).join("kustomization.yaml");
        let files: BTreeSet<String> = manifest_docs_in(c)
            .into_iter()
            .map(|(f, _)| f.strip_prefix(&format!("{c}/")).unwrap().to_string())
            .collect();
        assert_eq!(listed_resources(&k), files, "{}", k.display());
        let kind: Value = serde_yaml::from_str(&std::fs::read_to_string(&k).unwrap()).unwrap();
        assert_eq!(kind["kind"], "Component", "{}", k.display());
    }
    // The default render is the base's files; with the components, every shipped file.
    assert_same_objects(
        kustomized(),
        manifest_docs_in(""),
        "kubectl kustomize manifests",
    );
    let all = kustomized_with_components();
    assert_same_objects(all.clone(), docs(), "manifests with its components");
    // And the render parses into the typed models like the files do.
    let typed_all = load(&all);
    assert_eq!(typed_all.prometheus_rules.len(), 1);
}

/// `kubectl apply -k manifests` must work on a cluster without the Prometheus Operator: its
/// objects come only with the opt-in component `components/monitoring`.
#[test]
fn monitoring_objects_come_only_with_the_opt_in_component() {
    let group = |docs: &[(String, Value)]| -> BTreeSet<String> {
        docs.iter()
            .filter(|(_, v)| {
                v["apiVersion"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("monitoring.coreos.com/"))
            })
            .map(|(_, v)| {
                format!(
                    "{}/{}",
                    v["kind"].as_str().unwrap(),
                    packaging_support::name(v)
                )
            })
            .collect()
    };
    assert_eq!(
        group(&kustomized()),
        BTreeSet::new(),
        "kubectl kustomize manifests renders Prometheus Operator objects"
    );
    let dir = tempfile::tempdir().unwrap();
    packaging_support::write_overlay(dir.path(), &["components/monitoring"]);
    let with = kustomize(dir.path());
    assert_eq!(
        group(&with),
        BTreeSet::from([
            "PrometheusRule/nodekeeper".to_string(),
            "ServiceMonitor/nodekeeper-controller".to_string()
        ])
    );
    // The component adds those two and changes nothing else.
    let rest: Vec<(String, Value)> = with
        .into_iter()
        .filter(|(_, v)| {
            !v["apiVersion"]
                .as_str()
                .unwrap()
                .starts_with("monitoring.coreos.com/")
        })
        .collect();
    assert_same_objects(
        rest,
        kustomized(),
        "manifests with components/monitoring, minus it",
    );
}

/// Every `nodekeeper_*` token in docs/catalog.md and in the sources (the names the binary exports).
fn known_metrics() -> BTreeSet<String> {
    let repo = packaging_support::repo();
    let mut text = std::fs::read_to_string(repo.join("docs/catalog.md")).unwrap();
    let mut stack: Vec<_> = rbac::SOURCE_DIRS.iter().map(|d| repo.join(d)).collect();
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
