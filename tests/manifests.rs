//! Every manifest parses into its k8s-openapi type without unknown or dropped fields, the
//! embedded configurations are valid, and the RBAC is least-privilege.

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn docs() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for d in serde_yaml::Deserializer::from_str(&text) {
            let v: Value = Value::deserialize(d).unwrap();
            if !v.is_null() {
                out.push((f.file_name().unwrap().to_string_lossy().into_owned(), v));
            }
        }
    }
    out
}
use serde::Deserialize;

/// Parses `v` as `T` and requires the round trip to reproduce it exactly: a misspelt or unknown
/// field is dropped by the typed model and shows up as a difference.
fn typed<T: DeserializeOwned + Serialize>(file: &str, v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        &back, v,
        "{file}: fields lost in the typed round trip (unknown field?)"
    );
    t
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or("")
}

#[derive(Default)]
struct All {
    cluster_roles: Vec<ClusterRole>,
    roles: Vec<Role>,
    crbs: Vec<ClusterRoleBinding>,
    rbs: Vec<RoleBinding>,
    daemonsets: Vec<DaemonSet>,
    deployments: Vec<Deployment>,
    configmaps: Vec<ConfigMap>,
    vaps: Vec<ValidatingAdmissionPolicy>,
    vapbs: Vec<ValidatingAdmissionPolicyBinding>,
    pdbs: Vec<PodDisruptionBudget>,
    services: Vec<Service>,
}

fn load() -> All {
    let mut a = All::default();
    for (file, v) in docs() {
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let f = format!("{file} {kind}/{}", name(&v));
        match kind.as_str() {
            "Namespace" => drop(typed::<Namespace>(&f, &v)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(&f, &v)),
            "ClusterRole" => a.cluster_roles.push(typed(&f, &v)),
            "Role" => a.roles.push(typed(&f, &v)),
            "ClusterRoleBinding" => a.crbs.push(typed(&f, &v)),
            "RoleBinding" => a.rbs.push(typed(&f, &v)),
            "DaemonSet" => a.daemonsets.push(typed(&f, &v)),
            "Deployment" => a.deployments.push(typed(&f, &v)),
            "ConfigMap" => a.configmaps.push(typed(&f, &v)),
            "Service" => a.services.push(typed(&f, &v)),
            "PodDisruptionBudget" => a.pdbs.push(typed(&f, &v)),
            "ValidatingAdmissionPolicy" => a.vaps.push(typed(&f, &v)),
            "ValidatingAdmissionPolicyBinding" => a.vapbs.push(typed(&f, &v)),
            other => panic!("{f}: kind {other} has no typed check"),
        }
    }
    a
}

#[test]
fn typed_round_trip_rejects_unknown_fields() {
    let v = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}, "automountToken": false});
    let r = std::panic::catch_unwind(|| typed::<ServiceAccount>("t", &v));
    assert!(r.is_err(), "a misspelt field must fail");
}

fn rules_of<'a>(a: &'a All, name: &str) -> Vec<&'a PolicyRule> {
    let mut out: Vec<&PolicyRule> = Vec::new();
    for r in a
        .cluster_roles
        .iter()
        .filter(|r| r.metadata.name.as_deref() == Some(name))
    {
        out.extend(r.rules.iter().flatten());
    }
    for r in a
        .roles
        .iter()
        .filter(|r| r.metadata.name.as_deref() == Some(name))
    {
        out.extend(r.rules.iter().flatten());
    }
    out
}

fn grants(rules: &[&PolicyRule]) -> BTreeSet<String> {
    let mut g = BTreeSet::new();
    for r in rules {
        assert!(r.non_resource_urls.is_none());
        for group in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for verb in &r.verbs {
                    assert!(
                        group != "*" && res != "*" && verb != "*",
                        "wildcard in {r:?}"
                    );
                    g.insert(format!("{group}/{res}:{verb}"));
                }
            }
        }
    }
    g
}

#[test]
fn manifests_parse_and_rbac_is_least_privilege() {
    let a = load();
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
    let a = load();
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
    let a = load();
    let env = nodekeeper::config::Env::default();
    let mut seen = 0;
    for cm in &a.configmaps {
        let text = &cm.data.as_ref().unwrap()["config.toml"];
        let l =
            nodekeeper::config::Config::load_str(Path::new("config.toml"), text, &env, &|| None)
                .unwrap_or_else(|e| panic!("{:?}: {e}", cm.metadata.name));
        match cm.metadata.name.as_deref() {
            Some("nodekeeper-agent") => assert_eq!(
                l.config.report.unwrap().server_name.as_deref(),
                Some("nodekeeper-controller.nodekeeper.svc")
            ),
            Some("nodekeeper-controller") => assert_eq!(
                l.config.controller.unwrap().service_account,
                "system:serviceaccount:nodekeeper:nodekeeper-agent"
            ),
            other => panic!("unexpected ConfigMap {other:?}"),
        }
        seen += 1;
    }
    assert_eq!(seen, 2);
}
