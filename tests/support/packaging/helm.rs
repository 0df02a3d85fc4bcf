//! The Helm chart (packaging/helm/nodekeeper) linted, validated and rendered with real Helm v4
//! (PyPI `helm-python-sdk`, driven by packaging/helm/render.py): for tests/host/helm_chart.rs,
//! tests/host/prometheus_rules.rs and the e2e Prometheus scenario.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;

use serde_json::{json, Value};

use super::{repo, yaml_docs};

pub const CHART: &str = "packaging/helm/nodekeeper";

/// The venv's Python with the real Helm SDK, which `scripts/setup-helm.sh` installs (scripts/setup.sh
/// runs it before the tests; no test installs anything): a missing one fails the test.
fn python() -> PathBuf {
    static CHECK: Once = Once::new();
    let python = repo().join(".cache/venv/bin/python");
    CHECK.call_once(|| {
        let ok = Command::new(&python)
            .args(["-c", "import helm_python"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "the Helm SDK is not installed in {}: run scripts/setup-helm.sh",
            python.display()
        );
    });
    python
}

pub struct Rendered {
    pub lint: Value,
    pub schema_error: Option<String>,
    /// A template's `fail` (or another render error) once the values passed the schema.
    pub render_error: Option<String>,
    pub docs: Vec<(String, Value)>,
    pub values: Value,
}

/// Lints, validates and renders the chart as release `nk` in `namespace`.
pub fn helm(namespace: &str, values: Option<&std::path::Path>) -> Rendered {
    let mut cmd = Command::new(python());
    cmd.arg(repo().join("packaging/helm/render.py"))
        .args([CHART, "nk", namespace])
        .current_dir(repo());
    if let Some(v) = values {
        cmd.arg(v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "render.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let manifests: BTreeMap<String, String> =
        serde_json::from_value(v["manifests"].clone()).unwrap();
    let docs = manifests
        .iter()
        .flat_map(|(path, text)| yaml_docs(path, text))
        .collect();
    Rendered {
        lint: v["lint"].clone(),
        schema_error: v["schema_error"].as_str().map(str::to_string),
        render_error: v["render_error"].as_str().map(str::to_string),
        docs,
        values: v["values"].clone(),
    }
}

pub fn assert_lint_clean(r: &Rendered, label: &str) {
    assert_eq!(
        r.lint["total_charts_linted"],
        json!(1),
        "{label}: {}",
        r.lint
    );
    assert_eq!(r.lint["errors"], json!([]), "{label}: {}", r.lint);
    for m in r.lint["messages"].as_array().unwrap() {
        // 1 = info (e.g. "icon is recommended"); 2 = warning, 3 = error.
        assert!(m["severity"].as_i64().unwrap() < 2, "{label}: lint {m}");
    }
    assert_eq!(r.schema_error, None, "{label}");
    assert_eq!(r.render_error, None, "{label}");
}
