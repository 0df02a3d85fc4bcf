//! The chart's Grafana dashboard: the committed packaging/helm/nodekeeper/dashboards/nodekeeper.json
//! is exactly what tools/grafana/dashboard.py (Grafana's foundation SDK, PyPI
//! `grafana-foundation-sdk`, installed by scripts/setup-grafana-sdk.sh) writes, it parses, every
//! panel has a query, and the chart ships it as a ConfigMap for Grafana's dashboard sidecar only
//! when `dashboard.enabled`. (Each panel's query returning data from a real Prometheus is
//! tests/e2e/prometheus.rs.)

use std::process::Command;

use serde_json::{json, Value};

use crate::support::packaging::grafana::{
    load_dashboard, panel_queries, parse_dashboard, variables, DASHBOARD,
};
use crate::support::packaging::helm::{assert_lint_clean, helm};
use crate::support::packaging::repo;

const GENERATOR: &str = "tools/grafana/dashboard.py";

/// The generator's output; a missing SDK fails naming the setup script.
fn generated() -> String {
    let python = repo().join(".cache/venv/bin/python");
    let out = Command::new(&python)
        .arg(repo().join(GENERATOR))
        .arg("--stdout")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run scripts/setup-grafana-sdk.sh",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "{GENERATOR} failed (scripts/setup-grafana-sdk.sh installs its SDK): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_committed_dashboard_is_the_generators_output_and_parses() {
    let path = repo().join(DASHBOARD);
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    assert!(
        committed == generated(),
        "{DASHBOARD} differs from {GENERATOR}'s output: run .cache/venv/bin/python {GENERATOR}"
    );
    let d = load_dashboard(&path).unwrap_or_else(|e| panic!("{e}"));
    let queries = panel_queries(&d).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    // Each section the dashboard promises (docs/operations.md) has its row.
    let rows: Vec<&str> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    for row in [
        "Repairs and their steps",
        "Drains and their blockers",
        "Notices → cordon",
        "Budgets",
        "Agent reports and silence",
        "API requests",
    ] {
        assert!(rows.contains(&row), "{DASHBOARD}: no row {row:?}: {rows:?}");
    }
    // Every query selects the release's namespace through the dashboard's variable.
    for q in &queries {
        assert!(
            q.expr.contains("nodekeeper_") && q.expr.contains(r#"namespace="$namespace""#),
            "{DASHBOARD}: panel {:?} {}: {}",
            q.panel,
            q.ref_id,
            q.expr
        );
    }
    let names: Vec<String> = variables(&d).into_iter().map(|v| v.0).collect();
    assert_eq!(names, ["datasource", "namespace"], "{DASHBOARD}");
    // Unique panel ids.
    let ids: std::collections::BTreeSet<i64> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["id"].as_i64())
        .collect();
    assert_eq!(
        ids.len(),
        d["panels"].as_array().unwrap().len(),
        "{DASHBOARD}: panel ids"
    );
}

#[test]
fn a_dashboard_that_does_not_parse_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("nodekeeper.json");
    std::fs::write(&bad, "{\"panels\": [ {\"title\": \"x\", ").unwrap();
    let err = load_dashboard(&bad).unwrap_err();
    assert!(err.contains(&bad.display().to_string()), "{err}");
    let err = parse_dashboard(DASHBOARD, "{\"title\": \"no panels\"}").unwrap_err();
    assert!(err.contains(DASHBOARD) && err.contains("panels"), "{err}");
    let no_query = json!({"panels": [{"type": "timeseries", "title": "empty", "targets": []}]});
    let err = panel_queries(&no_query).unwrap_err();
    assert!(err.contains("\"empty\""), "{err}");
}

/// The dashboard's ConfigMaps of a render.
fn dashboard_maps(docs: &[(String, Value)]) -> Vec<&Value> {
    docs.iter()
        .map(|(_, v)| v)
        .filter(|v| v["kind"] == "ConfigMap" && v["metadata"]["name"] == "nodekeeper-dashboard")
        .collect()
}

#[test]
fn the_chart_ships_the_dashboard_for_grafanas_sidecar_only_when_enabled() {
    let off = helm("nodekeeper", None);
    assert_lint_clean(&off, "defaults");
    assert!(
        dashboard_maps(&off.docs).is_empty(),
        "dashboard off by default"
    );

    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        "dashboard:\n  enabled: true\n  annotations: {grafana_folder: nodekeeper}\n",
    )
    .unwrap();
    let on = helm("monitoring", Some(&values));
    assert_lint_clean(&on, "dashboard on");
    let maps = dashboard_maps(&on.docs);
    assert_eq!(maps.len(), 1, "one dashboard ConfigMap");
    let cm = maps[0];
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        cm["metadata"]["annotations"]["grafana_folder"],
        "nodekeeper"
    );
    let shipped = parse_dashboard(
        "the ConfigMap's nodekeeper.json",
        cm["data"]["nodekeeper.json"].as_str().unwrap(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let committed = load_dashboard(&repo().join(DASHBOARD)).unwrap();
    assert_eq!(shipped, committed, "the ConfigMap carries {DASHBOARD}");

    // Another sidecar label.
    std::fs::write(
        &values,
        "dashboard:\n  enabled: true\n  label: example.com/dashboard\n  labelValue: nodekeeper\n",
    )
    .unwrap();
    let other = helm("nodekeeper", Some(&values));
    assert_lint_clean(&other, "dashboard label");
    let cm = dashboard_maps(&other.docs)[0];
    assert_eq!(
        cm["metadata"]["labels"]["example.com/dashboard"],
        "nodekeeper"
    );
    assert!(cm["metadata"]["labels"].get("grafana_dashboard").is_none());

    // The schema stays strict.
    for bad in [
        "dashboard:\n  enabled: true\n  lable: x\n",
        "dashboard:\n  enabled: \"yes\"\n",
        "dashboard:\n  label: \"not a label!\"\n",
    ] {
        std::fs::write(&values, bad).unwrap();
        let r = helm("nodekeeper", Some(&values));
        assert!(r.schema_error.is_some(), "{bad:?} passed the schema");
    }
}
