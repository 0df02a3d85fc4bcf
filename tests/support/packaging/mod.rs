//! Shared by tests/host/manifests.rs and tests/host/helm_chart.rs: YAML streams parsed into typed
//! Kubernetes objects (k8s-openapi, plus the three Prometheus Operator kinds modelled here), with
//! a round trip that fails on unknown or misspelt fields.
#![allow(dead_code)]

pub mod grafana;
pub mod helm;
pub mod rbac;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapKeySelector, Namespace, SecretKeySelector, Service, ServiceAccount,
};
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every document of a YAML stream (null documents dropped), labelled with `source`.
pub fn yaml_docs(source: &str, text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for d in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{source}: {e}"));
        if !v.is_null() {
            out.push((source.to_string(), v));
        }
    }
    out
}

/// The kustomize components of `manifests/components/` (opt-in: `kubectl apply -k manifests` leaves
/// them out), relative to `manifests/`.
pub const MANIFEST_COMPONENTS: &[&str] = &["components/monitoring"];

/// The YAML files of `dir` (kustomization.yaml excluded), in name order.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    files
}

/// The documents of the YAML files of `manifests/SUBDIR` (`""`: the base), each labelled with its
/// path relative to `manifests/`.
pub fn manifest_docs_in(subdir: &str) -> Vec<(String, Value)> {
    let root = repo().join("manifests");
    yaml_files(&root.join(subdir))
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let rel = f
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            yaml_docs(&rel, &text)
        })
        .collect()
}

/// Every object the plain manifests ship: the base `manifests/*.yaml` (what `kubectl apply -k
/// manifests` applies) and then each of [`MANIFEST_COMPONENTS`].
pub fn manifest_docs() -> Vec<(String, Value)> {
    let mut docs = manifest_docs_in("");
    for c in MANIFEST_COMPONENTS {
        docs.extend(manifest_docs_in(c));
    }
    docs
}

/// `to` relative to `from` (kustomize refuses absolute resource paths).
pub fn relative(from: &Path, to: &Path) -> String {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".into(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// Writes `dir/kustomization.yaml`: an overlay of the shipped `manifests/` that enables
/// `components` (paths relative to `manifests/`, e.g. `components/monitoring`), as a user's
/// overlay does (docs/install.md).
pub fn write_overlay(dir: &Path, components: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let manifests = repo().join("manifests");
    let list = |paths: Vec<String>| {
        paths
            .iter()
            .map(|p| format!("\n  - {p}"))
            .collect::<String>()
    };
    let text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:{}\ncomponents:{}\n",
        list(vec![relative(dir, &manifests)]),
        list(
            components
                .iter()
                .map(|c| relative(dir, &manifests.join(c)))
                .collect()
        ),
    );
    std::fs::write(dir.join("kustomization.yaml"), text).unwrap();
}

/// Parses `v` as `T` and requires the round trip to reproduce it exactly: a misspelt or unknown
/// field is dropped by the typed model and shows up as a difference.
pub fn typed<T: DeserializeOwned + Serialize>(file: &str, v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        &back, v,
        "{file}: fields lost in the typed round trip (unknown field?)"
    );
    t
}

/// `metadata.name` of a raw object.
pub fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or("")
}

/// `monitoring.coreos.com/v1` ServiceMonitor (the fields nodekeeper uses; unknown ones fail).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ServiceMonitorSpec,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    pub selector: LabelSelector,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<NamespaceSelector>,
    pub endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceSelector {
    pub match_names: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoint {
    pub port: String,
    pub path: String,
    pub scheme: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_config: Option<TlsConfig>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<SecretOrConfigMap>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretOrConfigMap {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKeySelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretKeySelector>,
}

/// `monitoring.coreos.com/v1` PodMonitor (the chart's `podMonitor`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PodMonitorSpec,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodMonitorSpec {
    pub selector: LabelSelector,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<NamespaceSelector>,
    pub pod_metrics_endpoints: Vec<Endpoint>,
}

/// `monitoring.coreos.com/v1` PrometheusRule.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusRule {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PrometheusRuleSpec,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusRuleSpec {
    pub groups: Vec<RuleGroup>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleGroup {
    pub name: String,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub alert: String,
    pub expr: String,
    #[serde(rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Every object of a set of documents, by kind.
#[derive(Default)]
pub struct All {
    /// `Kind/namespace/name` of every object, in order.
    pub ids: Vec<String>,
    pub namespaces: Vec<Namespace>,
    pub service_accounts: Vec<ServiceAccount>,
    pub cluster_roles: Vec<ClusterRole>,
    pub roles: Vec<Role>,
    pub crbs: Vec<ClusterRoleBinding>,
    pub rbs: Vec<RoleBinding>,
    pub daemonsets: Vec<DaemonSet>,
    pub deployments: Vec<Deployment>,
    pub configmaps: Vec<ConfigMap>,
    pub vaps: Vec<ValidatingAdmissionPolicy>,
    pub vapbs: Vec<ValidatingAdmissionPolicyBinding>,
    pub flow_schemas: Vec<FlowSchema>,
    pub priority_levels: Vec<PriorityLevelConfiguration>,
    pub pdbs: Vec<PodDisruptionBudget>,
    pub services: Vec<Service>,
    pub service_monitors: Vec<ServiceMonitor>,
    pub pod_monitors: Vec<PodMonitor>,
    pub prometheus_rules: Vec<PrometheusRule>,
}

/// Parses every document into its typed model; an unknown kind fails.
pub fn load(docs: &[(String, Value)]) -> All {
    let mut a = All::default();
    for (file, v) in docs {
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let ns = v["metadata"]["namespace"].as_str().unwrap_or("");
        a.ids.push(format!("{kind}/{ns}/{}", name(v)));
        let f = format!("{file} {kind}/{}", name(v));
        match kind.as_str() {
            "Namespace" => a.namespaces.push(typed(&f, v)),
            "ServiceAccount" => a.service_accounts.push(typed(&f, v)),
            "ClusterRole" => a.cluster_roles.push(typed(&f, v)),
            "Role" => a.roles.push(typed(&f, v)),
            "ClusterRoleBinding" => a.crbs.push(typed(&f, v)),
            "RoleBinding" => a.rbs.push(typed(&f, v)),
            "DaemonSet" => a.daemonsets.push(typed(&f, v)),
            "Deployment" => a.deployments.push(typed(&f, v)),
            "ConfigMap" => a.configmaps.push(typed(&f, v)),
            "Service" => a.services.push(typed(&f, v)),
            "PodDisruptionBudget" => a.pdbs.push(typed(&f, v)),
            "ValidatingAdmissionPolicy" => a.vaps.push(typed(&f, v)),
            "ValidatingAdmissionPolicyBinding" => a.vapbs.push(typed(&f, v)),
            "FlowSchema" => a.flow_schemas.push(typed(&f, v)),
            "PriorityLevelConfiguration" => a.priority_levels.push(typed(&f, v)),
            "ServiceMonitor" => a.service_monitors.push(typed(&f, v)),
            "PodMonitor" => a.pod_monitors.push(typed(&f, v)),
            "PrometheusRule" => a.prometheus_rules.push(typed(&f, v)),
            other => panic!("{f}: kind {other} has no typed check"),
        }
    }
    a
}

/// `metric_name` tokens (`nodekeeper_*`) in a PromQL expression.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\bnodekeeper_[a-z0-9_]+").unwrap();
    re.find_iter(expr).map(|m| m.as_str().to_string()).collect()
}

/// The `config.toml` of every ConfigMap, by ConfigMap name.
pub fn configs(a: &All) -> BTreeMap<String, String> {
    a.configmaps
        .iter()
        .map(|cm| {
            let n = cm.metadata.name.clone().unwrap_or_default();
            let text = cm
                .data
                .as_ref()
                .and_then(|d| d.get("config.toml"))
                .unwrap_or_else(|| panic!("ConfigMap {n}: no config.toml"))
                .clone();
            (n, text)
        })
        .collect()
}

/// Loads a TOML config as `nodekeeper validate` does; fails on errors **and** warnings.
pub fn validate_config(label: &str, text: &str) -> nodekeeper_core::config_file::Config {
    let env = nodekeeper_core::config::Env::default();
    let l = nodekeeper_core::config_file::Config::load_str(Path::new(label), text, &env)
        .unwrap_or_else(|e| panic!("{label}: {e}\n{text}"));
    assert!(
        l.warnings.is_empty(),
        "{label}: warnings {:?}\n{text}",
        l.warnings
    );
    l.config
}

/// The admission policy: only the agent's requests are evaluated (a condition that cannot fail,
/// and Ignore if it ever does), every Node write of the agent is denied, and it is bound.
pub fn assert_admission_policy(a: &All, ns: &str) {
    let vap = a.vaps[0].spec.as_ref().unwrap();
    assert_eq!(vap.failure_policy.as_deref(), Some("Ignore"));
    let mc = vap.match_conditions.as_ref().unwrap();
    assert_eq!(mc.len(), 1);
    assert_eq!(
        mc[0].expression,
        format!(
            "has(request.userInfo.username) && \
             request.userInfo.username == 'system:serviceaccount:{ns}:nodekeeper-agent'"
        )
    );
    let rr = vap
        .match_constraints
        .as_ref()
        .unwrap()
        .resource_rules
        .as_ref()
        .unwrap();
    assert_eq!(rr.len(), 1);
    let strs = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
    assert_eq!(strs(&rr[0].api_groups), [""]);
    assert_eq!(strs(&rr[0].resources), ["nodes", "nodes/*"]);
    assert_eq!(strs(&rr[0].operations), ["CREATE", "UPDATE", "DELETE"]);
    let v = vap.validations.as_ref().unwrap();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].expression, "false", "the agent writes no Node");
    assert_eq!(v[0].reason.as_deref(), Some("Forbidden"));
    let b = a.vapbs[0].spec.as_ref().unwrap();
    assert_eq!(b.policy_name.as_deref(), a.vaps[0].metadata.name.as_deref());
    assert_eq!(
        b.validation_actions.as_deref(),
        Some(&["Deny".to_string()][..])
    );
    assert!(b.match_resources.is_none() && b.param_ref.is_none());
}

/// The controller's FlowSchemas, for its ServiceAccount in `ns` only, one flow per user each: its
/// Lease calls at `leader-election`; at `workload-high` the reports' calls (TokenReviews, status
/// writes, its agents' pods read and watched); the drains' evictions, pod deletions and their pod
/// and PodDisruptionBudget reads at `nodekeeper-drains`; and everything else at `workload-high` —
/// matched in that order. `nodekeeper-drains` is the one priority level shipped: limited, queuing,
/// lending half its seats and borrowing none.
pub fn assert_flow_schemas(a: &All, ns: &str) {
    assert_eq!(a.priority_levels.len(), 1);
    let level = &a.priority_levels[0];
    assert_eq!(level.metadata.name.as_deref(), Some("nodekeeper-drains"));
    let spec = level.spec.as_ref().expect("nodekeeper-drains spec");
    assert_eq!(spec.type_, "Limited");
    let limited = spec.limited.as_ref().expect("nodekeeper-drains is limited");
    assert_eq!(limited.nominal_concurrency_shares, Some(20));
    assert_eq!(limited.lendable_percent, Some(50));
    assert_eq!(limited.borrowing_limit_percent, Some(0));
    let queuing = limited
        .limit_response
        .as_ref()
        .filter(|r| r.type_ == "Queue")
        .and_then(|r| r.queuing.as_ref())
        .expect("nodekeeper-drains queues");
    assert!(queuing.queues.unwrap_or(0) > 0 && queuing.queue_length_limit.unwrap_or(0) > 0);
    // (name, priority level, [(groups, resources, verbs, namespaces)]; "cluster": cluster scope)
    type Rule<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    let ns_only = [ns];
    let want: [(&str, &str, Vec<Rule>); 4] = [
        (
            "nodekeeper-controller-leader-election",
            "leader-election",
            vec![(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "watch", "create", "update"],
                &ns_only,
            )],
        ),
        (
            "nodekeeper-controller-reports",
            "workload-high",
            vec![
                (
                    &["authentication.k8s.io"],
                    &["tokenreviews"],
                    &["create"],
                    &["cluster"],
                ),
                (&[""], &["nodes/status"], &["patch"], &["cluster"]),
                (&[""], &["pods"], &["get", "list", "watch"], &ns_only),
            ],
        ),
        (
            "nodekeeper-controller-drains",
            "nodekeeper-drains",
            vec![
                (
                    &[""],
                    &["pods/eviction", "pods"],
                    &["create", "delete"],
                    &["*"],
                ),
                (
                    &[""],
                    &["pods"],
                    &["get", "list", "watch"],
                    &["cluster", "*"],
                ),
                (
                    &["policy"],
                    &["poddisruptionbudgets"],
                    &["get", "list", "watch"],
                    &["cluster", "*"],
                ),
            ],
        ),
        (
            "nodekeeper-controller",
            "workload-high",
            vec![(&["*"], &["*"], &["*"], &["cluster", "*"])],
        ),
    ];
    assert_eq!(a.flow_schemas.len(), want.len());
    let mut precedence = 0;
    for (name, level, rules) in want {
        let spec = a
            .flow_schemas
            .iter()
            .find(|f| f.metadata.name.as_deref() == Some(name))
            .and_then(|f| f.spec.as_ref())
            .unwrap_or_else(|| panic!("no FlowSchema {name}"));
        assert_eq!(spec.priority_level_configuration.name, level, "{name}");
        assert_eq!(
            spec.distinguisher_method.as_ref().map(|d| d.type_.as_str()),
            Some("ByUser"),
            "{name}"
        );
        let p = spec.matching_precedence.unwrap_or(1000);
        assert!(p > precedence, "{name} is matched after the one before it");
        precedence = p;
        let got = spec.rules.as_deref().unwrap_or_default();
        assert_eq!(got.len(), 1, "{name}");
        let subjects: Vec<_> = got[0]
            .subjects
            .iter()
            .map(|s| {
                s.service_account
                    .as_ref()
                    .map(|sa| (sa.namespace.as_str(), sa.name.as_str()))
            })
            .collect();
        assert_eq!(subjects, [Some((ns, "nodekeeper-controller"))], "{name}");
        let rr: Vec<_> = got[0]
            .resource_rules
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|r| {
                let mut scope = Vec::new();
                if r.cluster_scope == Some(true) {
                    scope.push("cluster".to_string());
                }
                scope.extend(r.namespaces.unwrap_or_default());
                (r.api_groups, r.resources, r.verbs, scope)
            })
            .collect();
        let strings = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let want: Vec<_> = rules
            .iter()
            .map(|(g, r, v, n)| (strings(g), strings(r), strings(v), strings(n)))
            .collect();
        assert_eq!(rr, want, "{name}");
    }
}

/// The agent DaemonSet's pod spec.
pub fn agent_pod(a: &All) -> &k8s_openapi::api::core::v1::PodSpec {
    a.daemonsets[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

/// Every host path the agent's config names (the bus socket, the drop-in and state directories, CRI-O's socket,
/// the disk paths under `checks.host_root`, `/dev/kmsg`) is, in the agent's container, a hostPath mount of that
/// same host path: the bus address the agent dials and the mount that carries the socket agree.
pub fn assert_agent_host_paths(a: &All) {
    use nodekeeper_core::agent::checks::HostRoot;
    use nodekeeper_core::agent::host::DEFAULT_SYSTEM_BUS;
    let pod = agent_pod(a);
    let c = &pod.containers[0];
    let cfg = validate_config("agent config.toml", &configs(a)["nodekeeper-agent"]);
    // The host path behind `inside` (a path in the container): the longest mount above it, if a hostPath.
    let host_of = |inside: &Path| -> Option<PathBuf> {
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| inside.starts_with(&m.mount_path))
            .max_by_key(|m| m.mount_path.len())?;
        let v = pod.volumes.iter().flatten().find(|v| v.name == m.name)?;
        let rest = inside.strip_prefix(&m.mount_path).ok()?;
        let base = PathBuf::from(&v.host_path.as_ref()?.path);
        Some(if rest.as_os_str().is_empty() {
            base
        } else {
            base.join(rest)
        })
    };
    let bus = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "DBUS_SYSTEM_BUS_ADDRESS")
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| DEFAULT_SYSTEM_BUS.to_string());
    let bus = PathBuf::from(
        bus.strip_prefix("unix:path=")
            .unwrap_or_else(|| panic!("the agent's bus is not a unix:path= address: {bus}")),
    );
    let mut want: Vec<(String, PathBuf, PathBuf)> = vec![
        ("system bus".into(), bus.clone(), bus),
        (
            "crio.dropin_dir".into(),
            cfg.agent.crio.dropin_dir.clone(),
            cfg.agent.crio.dropin_dir.clone(),
        ),
        (
            "crio.state_dir".into(),
            cfg.agent.crio.state_dir.clone(),
            cfg.agent.crio.state_dir.clone(),
        ),
        (
            "crio.socket".into(),
            cfg.agent.crio.socket.clone(),
            cfg.agent.crio.socket.clone(),
        ),
        (
            "checks.kmsg.path".into(),
            cfg.agent.checks.kmsg.path.clone(),
            cfg.agent.checks.kmsg.path.clone(),
        ),
    ];
    let host = HostRoot::new(&cfg.agent.checks.host_root);
    for p in &cfg.agent.checks.disk.paths {
        want.push((
            format!("checks.disk.paths {}", p.display()),
            host.join(p),
            p.clone(),
        ));
    }
    for f in ["proc/meminfo", "proc/loadavg"] {
        want.push((
            format!("checks.host_root {f}"),
            host.join(f),
            Path::new("/").join(f),
        ));
    }
    for (what, inside, on_host) in want {
        assert_eq!(
            host_of(&inside).as_deref(),
            Some(on_host.as_path()),
            "{what}: {} in the agent's container must be a hostPath mount of {} on the node",
            inside.display(),
            on_host.display()
        );
    }
}
