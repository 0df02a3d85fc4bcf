//! The Helm chart (packaging/helm/nodekeeper) with real Helm v4 (PyPI `helm-python-sdk`, driven by
//! packaging/helm/render.py): it lints clean, renders with default and OKE-like values into
//! objects that parse into k8s-openapi types, matches the plain manifests (kinds, names, RBAC,
//! pod specs, configurations), maps `*.config` values 1:1 to the TOML configs, and its
//! values.schema.json agrees with the binary's config types.

use crate::support::packaging as packaging_support;

use std::collections::BTreeSet;

pub(crate) use packaging_support::helm::{assert_lint_clean, helm, CHART};
use packaging_support::rbac;
use packaging_support::{load, manifest_docs, repo, validate_config, All};
use serde_json::{json, Value};

pub(crate) const OKE_VALUES: &str = "packaging/helm/nodekeeper/values-oke.yaml";

/// The `spec` of each object, in order, as JSON.
fn specs<T: serde::Serialize>(objects: &[T]) -> Vec<Value> {
    objects
        .iter()
        .map(|o| serde_json::to_value(o).unwrap()["spec"].clone())
        .collect()
}

/// `Kind/namespace/name` with the namespace replaced by `ns`.
fn ids(a: &All, from_ns: &str, to_ns: &str) -> BTreeSet<String> {
    a.ids
        .iter()
        .filter(|id| !id.starts_with("Namespace/"))
        .map(|id| id.replace(&format!("/{from_ns}/"), &format!("/{to_ns}/")))
        .collect()
}

fn plain() -> All {
    load(&manifest_docs())
}

fn config_of(a: &All, name: &str) -> String {
    packaging_support::configs(a)
        .remove(name)
        .unwrap_or_else(|| panic!("no ConfigMap {name}"))
}

/// The pod spec of the first workload of `kind`, without what the chart adds on purpose.
fn pod_spec(a: &All, kind: &str) -> Value {
    let t = match kind {
        "DaemonSet" => serde_json::to_value(&a.daemonsets[0].spec.as_ref().unwrap().template),
        _ => serde_json::to_value(&a.deployments[0].spec.as_ref().unwrap().template),
    };
    let mut t = t.unwrap();
    for c in t["spec"]["containers"].as_array_mut().unwrap() {
        c.as_object_mut().unwrap().remove("imagePullPolicy");
    }
    t["spec"].clone()
}

#[test]
fn default_values_lint_clean_and_match_the_plain_manifests() {
    let r = helm("nodekeeper", None);
    assert_lint_clean(&r, "default values");
    let chart = load(&r.docs);
    let plain = plain();
    // Same objects, except the Namespace (the release namespace) and the Prometheus Operator
    // kinds (off by default: their CRDs may be missing).
    let want: BTreeSet<String> = ids(&plain, "nodekeeper", "nodekeeper")
        .into_iter()
        .filter(|id| !id.starts_with("ServiceMonitor/") && !id.starts_with("PrometheusRule/"))
        .collect();
    assert_eq!(ids(&chart, "nodekeeper", "nodekeeper"), want);
    for sa in ["nodekeeper-agent", "nodekeeper-controller"] {
        assert_eq!(
            rbac::atoms(&rbac::bound_rules(&chart, "nodekeeper", sa)),
            rbac::atoms(&rbac::bound_rules(&plain, "nodekeeper", sa)),
            "{sa} RBAC"
        );
    }
    assert_rbac_is_the_inventory(&chart, "nodekeeper");
    packaging_support::assert_agent_host_paths(&chart);
    packaging_support::assert_admission_policy(&chart, "nodekeeper");
    packaging_support::assert_flow_schemas(&chart, "nodekeeper");
    assert_eq!(specs(&chart.flow_schemas), specs(&plain.flow_schemas));
    assert_eq!(specs(&chart.priority_levels), specs(&plain.priority_levels));
    for kind in ["DaemonSet", "Deployment"] {
        assert_eq!(
            pod_spec(&chart, kind),
            pod_spec(&plain, kind),
            "{kind} pod spec"
        );
    }
    assert_eq!(
        serde_json::to_value(&chart.vaps[0].spec).unwrap(),
        serde_json::to_value(&plain.vaps[0].spec).unwrap()
    );
    // The rendered TOML configures exactly what the plain ConfigMaps do.
    for name in ["nodekeeper-agent", "nodekeeper-controller"] {
        let c = validate_config(&format!("chart {name}"), &config_of(&chart, name));
        let p = validate_config(&format!("manifests {name}"), &config_of(&plain, name));
        assert_eq!(c, p, "{name}: chart defaults vs manifests/");
    }
}

/// TOML → JSON with every number as f64 (Helm's values are JSON numbers).
fn toml_json(text: &str) -> Value {
    let t: toml::Value = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    numbers_as_f64(serde_json::to_value(t).unwrap())
}

fn numbers_as_f64(v: Value) -> Value {
    match v {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(a) => Value::Array(a.into_iter().map(numbers_as_f64).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, numbers_as_f64(v)))
                .collect(),
        ),
        v => v,
    }
}

/// Removes from `rendered[section]` the keys the chart fills in that `values` does not set.
fn drop_chart_defaults(rendered: &mut Value, values: &Value, section: &str, keys: &[&str]) {
    let r = rendered[section].as_object_mut().unwrap();
    for k in keys {
        if values[section].get(*k).is_none() {
            assert!(
                r.remove(*k).is_some(),
                "chart default {section}.{k} missing"
            );
        }
    }
}

#[test]
fn oke_values_render_one_to_one_into_the_toml_configs() {
    let ns = "nodekeeper-system";
    let r = helm(ns, Some(&repo().join(OKE_VALUES)));
    assert_lint_clean(&r, "OKE values");
    let chart = load(&r.docs);
    // Monitoring on: now every object of manifests/ is there (but the Namespace).
    assert_eq!(ids(&chart, ns, ns), ids(&plain(), "nodekeeper", ns));

    packaging_support::assert_agent_host_paths(&chart);
    let agent_toml = config_of(&chart, "nodekeeper-agent");
    let ctl_toml = config_of(&chart, "nodekeeper-controller");
    let agent = validate_config("chart agent", &agent_toml).agent;
    let ctl = validate_config("chart controller", &ctl_toml).controller;

    // 1:1: the rendered TOML is the values' config plus the chart's namespace-derived defaults.
    let want_agent = numbers_as_f64(r.values["agent"]["config"].clone());
    let mut got_agent = toml_json(&agent_toml);
    drop_chart_defaults(
        &mut got_agent,
        &want_agent,
        "report",
        &["url", "ca_file", "server_name", "token_file"],
    );
    assert_eq!(got_agent, want_agent, "agent config.toml vs agent.config");
    let want_ctl = numbers_as_f64(r.values["controller"]["config"].clone());
    let mut got_ctl = toml_json(&ctl_toml);
    drop_chart_defaults(
        &mut got_ctl,
        &want_ctl,
        "controller",
        &[
            "listen",
            "tls_cert_file",
            "tls_key_file",
            "service_account",
            "audience",
            "namespace",
        ],
    );
    assert_eq!(
        got_ctl, want_ctl,
        "controller config.toml vs controller.config"
    );

    // Integers stay integers (Helm's toToml would write 4096.0, which CRI-O rejects).
    assert!(agent_toml.contains("pids_limit = 4096\n"), "{agent_toml}");
    assert_eq!(agent.crio.dropins.len(), 2);
    assert_eq!(agent.checks.memory.min_available_percent, 7.5);
    // Namespace-derived wiring.
    let report = agent.report.unwrap();
    assert_eq!(
        report.url,
        "https://nodekeeper-controller.nodekeeper-system.svc:8443"
    );
    let c = ctl.controller.unwrap();
    assert_eq!(
        c.service_account,
        "system:serviceaccount:nodekeeper-system:nodekeeper-agent"
    );
    assert_eq!(c.namespace, ns);
    assert!(!c.dry_run);
    assert_eq!(c.token_cache_size, 5000);
    assert_eq!(ctl.budgets.groups["shared-spot"].len(), 2);
    assert_rbac_is_the_inventory(&chart, ns);
    packaging_support::assert_admission_policy(&chart, ns);
    packaging_support::assert_flow_schemas(&chart, ns);
    // Chart values reach the objects.
    let dep = chart.deployments[0].spec.as_ref().unwrap();
    assert_eq!(dep.replicas, Some(3));
    let image = dep.template.spec.as_ref().unwrap().containers[0]
        .image
        .clone();
    assert_eq!(
        image.as_deref(),
        Some("iad.ocir.io/example-tenancy/nodekeeper:0.1.0")
    );
    // the DaemonSet runs the agent build's image
    let ds = chart.daemonsets[0].spec.as_ref().unwrap();
    assert_eq!(
        ds.template.spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some("iad.ocir.io/example-tenancy/nodekeeper-agent:0.1.0")
    );
    let pod = dep.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    let limits = pod.containers[0].resources.as_ref().unwrap().limits.clone();
    assert_eq!(limits.unwrap()["memory"].0, "512Mi");
    let rule = &chart.prometheus_rules[0].spec.groups[0].rules[0];
    assert_eq!(
        (rule.alert.as_str(), rule.for_.as_deref()),
        ("NodekeeperNodeHeldTooLong", Some("45m"))
    );
    let release = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.labels.as_ref().and_then(|l| l.get("release").cloned())
    };
    assert_eq!(
        release(&chart.prometheus_rules[0].metadata).as_deref(),
        Some("kube-prometheus-stack")
    );
    let sm = &chart.service_monitors[0];
    assert_eq!(
        release(&sm.metadata).as_deref(),
        Some("kube-prometheus-stack")
    );
    assert_eq!(
        sm.spec.endpoints[0]
            .tls_config
            .as_ref()
            .unwrap()
            .server_name
            .as_deref(),
        Some("nodekeeper-controller.nodekeeper-system.svc")
    );
}

/// The chart's RBAC, installed in `ns`, grants exactly tests/fixtures/api-calls.toml.
fn assert_rbac_is_the_inventory(chart: &All, ns: &str) {
    let c = rbac::check(chart, ns, &rbac::inventory());
    assert!(
        c.missing.is_empty(),
        "{ns}: not granted:\n{}",
        c.missing.join("\n")
    );
    assert!(
        c.unexpected.is_empty(),
        "{ns}: granted although it must not be:\n{}",
        c.unexpected.join("\n")
    );
    assert!(
        c.unused.is_empty(),
        "{ns}: granted but unused:\n{}",
        c.unused.join("\n")
    );
    assert_eq!(
        rbac::subjects(chart),
        BTreeSet::from([
            format!("{ns}/nodekeeper-agent"),
            format!("{ns}/nodekeeper-controller")
        ])
    );
    assert_eq!(rbac::unbound_roles(chart), Vec::<String>::new());
}

#[test]
fn direct_label_mode_lets_the_agent_patch_only_its_own_node() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("direct.yaml");
    std::fs::write(&f, "agent:\n  config:\n    labels:\n      mode: direct\n").unwrap();
    let r = helm("nodekeeper", Some(&f));
    assert_lint_clean(&r, "direct label mode");
    let chart = load(&r.docs);
    let agent = validate_config("direct agent", &config_of(&chart, "nodekeeper-agent")).agent;
    assert_eq!(agent.labels.cleanup.len(), 1, "the default rule is kept");
    // Exactly one difference from the inventory: the direct-mode patch (a `granted = false` row)
    // is granted now, by one rule that no granted row uses.
    let c = rbac::check(&chart, "nodekeeper", &rbac::inventory());
    assert!(c.missing.is_empty(), "{c:?}");
    assert_eq!(c.unexpected.len(), 1, "{c:?}");
    assert!(c.unexpected[0].contains("PatchRemover::remove"), "{c:?}");
    assert_eq!(
        c.unused,
        [r#"agent: Atom { at: Everywhere, group: "", resource: "nodes", verb: "patch" }"#],
        "{c:?}"
    );
    // And the admission policy narrows it to an UPDATE of the Node the token is bound to.
    let vap = chart.vaps[0].spec.as_ref().unwrap();
    assert_eq!(vap.failure_policy.as_deref(), Some("Ignore"));
    let v = &vap.validations.as_ref().unwrap()[0].expression;
    for part in [
        "request.operation == 'UPDATE'",
        "(!has(request.subResource) || request.subResource == '')",
        "has(request.name)",
        "has(request.userInfo.extra)",
        "'authentication.kubernetes.io/node-name' in request.userInfo.extra",
        "request.userInfo.extra['authentication.kubernetes.io/node-name'].exists(n, n == request.name)",
    ] {
        assert!(v.contains(part), "{part} not in {v}");
    }
}

#[test]
fn the_schema_rejects_unknown_config_keys_and_wrong_types() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "controller:\n  config:\n    controller:\n      dryrun: true\n",
            "dryrun",
        ),
        (
            "agent:\n  config:\n    crio:\n      restart_timeout: 5\n",
            "restart_timeout",
        ),
        ("agent:\n  config:\n    cri0: {}\n", "cri0"),
        ("prometheusRule:\n  nodeHeldFor: soon\n", "nodeHeldFor"),
        (
            "controller:\n  affinity:\n    nodeAfinity: {}\n",
            "nodeAfinity",
        ),
        ("agent:\n  tolerations:\n    - operatr: Exists\n", "operatr"),
        (
            "controller:\n  resources:\n    request:\n      cpu: 1\n",
            "request",
        ),
        ("agent:\n  nodeSelector:\n    pool: 3\n", "pool"),
        ("podMonitor:\n  enabled: yes please\n", "enabled"),
        ("serviceMonitor:\n  lables: {}\n", "lables"),
        ("controller:\n  priorityClassName: 5\n", "priorityClassName"),
        ("extraObjects: {kind: ConfigMap}\n", "extraObjects"),
    ];
    for (i, (yaml, key)) in cases.iter().enumerate() {
        let f = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&f, yaml).unwrap();
        let r = helm("nodekeeper", Some(&f));
        let err = r
            .schema_error
            .unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(err.contains(key), "{key} not named in: {err}");
        assert!(r.docs.is_empty());
    }
}

/// JSON-schema type of a TOML value, as packaging/helm/gen-schema.py writes it.
fn schema_type(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "string",
        toml::Value::Integer(_) => "integer",
        toml::Value::Float(_) => "number",
        toml::Value::Boolean(_) => "boolean",
        toml::Value::Array(_) => "array",
        _ => "object",
    }
}

#[test]
fn the_schema_lists_exactly_the_config_keys_of_the_binary() {
    let text = std::fs::read_to_string(repo().join("packaging/helm/full-config.toml")).unwrap();
    let full = validate_config("full-config.toml", &text);
    let toml::Value::Table(t) = toml::Value::try_from(&full).unwrap() else {
        panic!("config is not a table")
    };
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join(CHART).join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let sections = &schema["$defs"]["config"]["properties"];
    let schema_sections: BTreeSet<&String> = sections.as_object().unwrap().keys().collect();
    assert_eq!(
        schema_sections,
        t.keys().collect::<BTreeSet<_>>(),
        "config sections (regenerate: packaging/helm/gen-schema.py)"
    );
    for (section, body) in &t {
        let body = body.as_table().unwrap();
        let props = sections[section]["properties"].as_object().unwrap();
        assert_eq!(
            props.keys().collect::<BTreeSet<_>>(),
            body.keys().collect::<BTreeSet<_>>(),
            "[{section}] keys (regenerate: packaging/helm/gen-schema.py)"
        );
        for (k, v) in body {
            assert_eq!(props[k]["type"], json!(schema_type(v)), "[{section}] {k}");
        }
        assert_eq!(sections[section]["additionalProperties"], json!(false));
    }
}

#[test]
fn the_chart_toml_renderer_keeps_tricky_values_exact() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("tricky.yaml");
    std::fs::write(
        &f,
        r##"
agent:
  config:
    crio:
      dropin:
        - name: 30-tricky.conf
          content: "# quotes \" backslash \\ tab \t unicode ü ☃ <&>\n[crio.runtime]\npids_limit = 1024\n"
        - name: 31-nested.conf
          settings:
            crio:
              runtime:
                default_ulimits: ["nofile=1048576:1048576"]
                pids_limit: -1
              image:
                short_name_mode: enforcing
    checks:
      systemd:
        unit:
          - name: kubelet.service
            condition_type: NodekeeperKubeletUnhealthy
          - name: crio.service
            condition_type: NodekeeperContainerRuntimeUnhealthy
controller:
  config:
    budgets:
      groups:
        pool.a-1:
          - nodes: "10%"
    repair:
      groups:
        pool.a-1:
          enabled: false
"##,
    )
    .unwrap();
    let r = helm("nodekeeper", Some(&f));
    assert_lint_clean(&r, "tricky values");
    let chart = load(&r.docs);
    let agent_toml = config_of(&chart, "nodekeeper-agent");
    let agent = validate_config("tricky agent", &agent_toml).agent;
    let mut got = toml_json(&agent_toml);
    let want = numbers_as_f64(r.values["agent"]["config"].clone());
    drop_chart_defaults(
        &mut got,
        &want,
        "report",
        &["url", "ca_file", "server_name", "token_file"],
    );
    assert_eq!(got, want);
    assert!(agent.crio.dropins[0]
        .content
        .as_deref()
        .unwrap()
        .contains("quotes \" backslash \\ tab \t unicode ü ☃ <&>"));
    let ctl = validate_config(
        "tricky controller",
        &config_of(&chart, "nodekeeper-controller"),
    )
    .controller;
    assert_eq!(ctl.budgets.groups["pool.a-1"].len(), 1);
    assert_eq!(ctl.repair.groups["pool.a-1"].enabled, Some(false));
}

/// The pod spec of the first `kind` workload, as JSON.
fn pod_json(a: &All, kind: &str) -> Value {
    match kind {
        "DaemonSet" => serde_json::to_value(&a.daemonsets[0].spec.as_ref().unwrap().template.spec),
        _ => serde_json::to_value(&a.deployments[0].spec.as_ref().unwrap().template.spec),
    }
    .unwrap()
}

#[test]
fn scheduling_monitoring_and_extra_objects_values_reach_the_objects() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("conventions.yaml");
    std::fs::write(
        &f,
        r#"
agent:
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions: [{key: node.kubernetes.io/instance-type, operator: NotIn, values: [VM.Standard.E2.1.Micro]}]
  resources: {requests: {cpu: 20m, memory: 40Mi}, limits: {memory: 100Mi}}
  priorityClassName: agent-critical
controller:
  nodeSelector: {node-role.example/system: "true"}
  tolerations: [{key: CriticalAddonsOnly, operator: Exists}]
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: topology.kubernetes.io/zone
            labelSelector: {matchLabels: {app.kubernetes.io/name: nodekeeper-controller}}
  resources: {requests: {cpu: 200m, memory: 100Mi}, limits: {memory: 1Gi}}
  priorityClassName: system-cluster-critical
podMonitor:
  enabled: true
  interval: 15s
  labels: {release: prom}
extraObjects:
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: "{{ .Release.Name }}-extra", namespace: "{{ .Release.Namespace }}"}
    data: {k: v}
  - |
    apiVersion: v1
    kind: ServiceAccount
    metadata:
      name: {{ .Release.Name }}-reader
      namespace: {{ .Release.Namespace }}
"#,
    )
    .unwrap();
    let r = helm("ops", Some(&f));
    assert_lint_clean(&r, "conventions");
    let chart = load(&r.docs);
    let ds = pod_json(&chart, "DaemonSet");
    let dep = pod_json(&chart, "Deployment");
    let want = |path: &str| -> Value {
        let mut v = r.values.clone();
        for k in path.split('.') {
            v = v[k].clone();
        }
        v
    };
    for (pod, who) in [(&ds, "agent"), (&dep, "controller")] {
        for (field, value) in [
            ("nodeSelector", "nodeSelector"),
            ("tolerations", "tolerations"),
            ("affinity", "affinity"),
            ("priorityClassName", "priorityClassName"),
        ] {
            assert_eq!(
                pod[field],
                want(&format!("{who}.{value}")),
                "{who}: {field}"
            );
        }
        assert_eq!(
            pod["containers"][0]["resources"],
            want(&format!("{who}.resources")),
            "{who}: resources"
        );
    }
    // Without controller.affinity the chart's own: replicas apart, off Karpenter's nodes.
    let plain_dep = pod_json(&load(&helm("ops", None).docs), "Deployment");
    assert!(plain_dep["affinity"]["podAntiAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]
        .is_array());
    assert_eq!(
        plain_dep["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
        "karpenter.sh/nodepool"
    );
    assert_eq!(plain_dep["priorityClassName"], Value::Null);

    // The PodMonitor scrapes the controller pods' https port, as the ServiceMonitor the Service's.
    assert!(chart.service_monitors.is_empty());
    assert_eq!(chart.pod_monitors.len(), 1);
    let pm = &chart.pod_monitors[0];
    assert_eq!(
        pm.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("release")
            .map(String::as_str),
        Some("prom")
    );
    let pod_labels = chart.deployments[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    for (k, v) in pm.spec.selector.match_labels.iter().flatten() {
        assert_eq!(
            pod_labels.get(k),
            Some(v),
            "PodMonitor selector {k}={v} vs pod labels"
        );
    }
    assert_eq!(
        pm.spec.namespace_selector.as_ref().unwrap().match_names,
        ["ops"]
    );
    let ep = &pm.spec.pod_metrics_endpoints[0];
    let ports: Vec<_> = dep["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].clone())
        .collect();
    assert!(
        ports.contains(&json!(ep.port)),
        "port {} not on the pod",
        ep.port
    );
    assert_eq!(
        (ep.path.as_str(), ep.scheme.as_str(), ep.interval.as_deref()),
        ("/metrics", "https", Some("15s"))
    );
    let tls = ep.tls_config.as_ref().unwrap();
    assert_eq!(
        tls.server_name.as_deref(),
        Some("nodekeeper-controller.ops.svc")
    );
    assert_eq!(
        tls.ca.as_ref().unwrap().config_map.as_ref().unwrap().name,
        "nodekeeper-controller-ca"
    );

    // extraObjects, a map and a string, through tpl.
    let cm = chart
        .configmaps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("nk-extra"))
        .expect("extraObjects ConfigMap nk-extra");
    assert_eq!(cm.metadata.namespace.as_deref(), Some("ops"));
    assert_eq!(cm.data.as_ref().unwrap()["k"], "v");
    assert!(
        chart
            .ids
            .contains(&"ServiceAccount/ops/nk-reader".to_string()),
        "{:?}",
        chart.ids
    );
}

#[test]
fn both_monitors_at_once_fail_the_render_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("both.yaml");
    std::fs::write(
        &f,
        "serviceMonitor:\n  enabled: true\npodMonitor:\n  enabled: true\n",
    )
    .unwrap();
    let r = helm("nodekeeper", Some(&f));
    assert_eq!(r.schema_error, None);
    let err = r.render_error.expect("rendered both monitors");
    assert!(
        err.contains("serviceMonitor.enabled and podMonitor.enabled"),
        "{err}"
    );
    assert!(r.docs.is_empty());
}
