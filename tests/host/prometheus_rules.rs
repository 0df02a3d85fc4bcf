//! The shipped alerts, proven by Prometheus itself: `promtool` from Debian's `prometheus` package
//! (2.42; scripts/setup.sh installs it). The rules are taken from the chart's rendered
//! PrometheusRule (its `spec.groups` written out as a Prometheus rule file), checked with
//! `promtool check rules`, and run through the unit tests of tests/fixtures/prometheus/alerts_test.yaml
//! with `promtool test rules`. Every alert must have a case there where it fires (labels and
//! annotations asserted) and one where it stays silent. The kustomize component's rules are the
//! chart's with default values, so both are covered.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::helm_chart::{assert_lint_clean, helm, OKE_VALUES};
use crate::support::packaging::{manifest_docs_in, repo};

/// The promtool unit tests, kept in the repository.
const UNIT_TESTS: &str = "tests/fixtures/prometheus/alerts_test.yaml";
/// The rule file they name (`rule_files`), written beside a copy of them.
const RULES_FILE: &str = "nodekeeper-rules.yaml";

/// Debian's promtool; a missing one fails the test (no test installs anything).
fn promtool() -> PathBuf {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("promtool not found on PATH: run scripts/setup.sh (Debian package `prometheus`)")
    })
}

/// Runs promtool with `args` in `dir`: its output, or its output as the error when it fails.
fn run_promtool(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// The rules of the one PrometheusRule in `docs`, as a Prometheus rule file (`groups:`), with the
/// file it came from.
fn rule_file(docs: &[(String, Value)]) -> (String, Value) {
    let rules: Vec<_> = docs
        .iter()
        .filter(|(_, v)| v["kind"] == "PrometheusRule")
        .collect();
    assert_eq!(rules.len(), 1, "one PrometheusRule expected");
    let (source, v) = rules[0];
    (
        source.clone(),
        serde_json::json!({"groups": v["spec"]["groups"].clone()}),
    )
}

/// Writes `rules` to `dir/RULES_FILE` and runs `promtool check rules` on it; the error names
/// `source` (the file the rules came from) and promtool's complaint.
fn check_rules(dir: &Path, source: &str, rules: &Value) -> Result<(), String> {
    std::fs::write(dir.join(RULES_FILE), serde_yaml::to_string(rules).unwrap()).unwrap();
    run_promtool(dir, &["check", "rules", RULES_FILE])
        .map(|_| ())
        .map_err(|out| format!("{source}: its rules fail `promtool check rules`:\n{out}"))
}

/// The chart's rules with `values` (YAML) on top of `prometheusRule.enabled: true`.
fn chart_rules(extra_values: Option<&Path>, label: &str) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("values.yaml");
    let mut text = extra_values
        .map(|p| std::fs::read_to_string(p).unwrap())
        .unwrap_or_default();
    if !text.contains("prometheusRule:") {
        text.push_str("\nprometheusRule:\n  enabled: true\n");
    }
    std::fs::write(&f, text).unwrap();
    let r = helm("nodekeeper", Some(&f));
    assert_lint_clean(&r, label);
    let (source, rules) = rule_file(&r.docs);
    (format!("packaging/helm/{source}"), rules)
}

/// tests/fixtures/prometheus/alerts_test.yaml, parsed; the error names the file.
fn load_unit_tests(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every alert name of a rule file.
fn alerts(rules: &Value) -> BTreeSet<String> {
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_shipped_rules_pass_promtool_check_and_their_unit_tests() {
    let (source, rules) = chart_rules(None, "prometheusRule on");
    // The plain manifests' component ships the same rules (the chart's defaults).
    let (component_file, component) = rule_file(&manifest_docs_in("components/monitoring"));
    let by_alert = |rules: &Value| -> Vec<(String, Value)> {
        let groups = rules["groups"].as_array().unwrap();
        groups
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .map(|r| (r["alert"].as_str().unwrap_or("").to_string(), r.clone()))
            .collect()
    };
    let (ours, theirs) = (by_alert(&component), by_alert(&rules));
    assert_eq!(
        ours.iter().map(|r| &r.0).collect::<Vec<_>>(),
        theirs.iter().map(|r| &r.0).collect::<Vec<_>>(),
        "alerts of manifests/{component_file} vs {source}"
    );
    for ((name, a), (_, b)) in ours.iter().zip(&theirs) {
        assert_eq!(
            a, b,
            "{name}: manifests/{component_file} vs {source} (default values)"
        );
    }
    assert_eq!(
        component, rules,
        "rule groups of manifests/{component_file} vs {source}"
    );

    // Other thresholds render valid rules too.
    let oke_dir = tempfile::tempdir().unwrap();
    let (oke_source, oke) = chart_rules(Some(&repo().join(OKE_VALUES)), "OKE values");
    check_rules(
        oke_dir.path(),
        &format!("{oke_source} ({OKE_VALUES})"),
        &oke,
    )
    .unwrap_or_else(|e| panic!("{e}"));

    // The default rules, then the unit tests beside them.
    let dir = tempfile::tempdir().unwrap();
    check_rules(dir.path(), &source, &rules).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(repo().join(UNIT_TESTS), dir.path().join("alerts_test.yaml")).unwrap();
    let out = run_promtool(dir.path(), &["test", "rules", "alerts_test.yaml"])
        .unwrap_or_else(|out| panic!("{UNIT_TESTS} fails on the rules of {source}:\n{out}"));
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_fires_in_one_unit_test_and_stays_silent_in_another() {
    let (source, rules) = chart_rules(None, "prometheusRule on");
    let names = alerts(&rules);
    assert!(names.len() >= 5, "{source}: {names:?}");
    let t = load_unit_tests(&repo().join(UNIT_TESTS)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        t["rule_files"],
        serde_json::json!([RULES_FILE]),
        "{UNIT_TESTS}: rule_files"
    );
    let cases: Vec<&Value> = t["tests"]
        .as_array()
        .unwrap_or_else(|| panic!("{UNIT_TESTS}: no tests"))
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for c in &cases {
        let name = c["alertname"].as_str().unwrap().to_string();
        assert!(
            names.contains(&name),
            "{UNIT_TESTS}: a test of {name}, which {source} does not define"
        );
        let expected = c["exp_alerts"].as_array().cloned().unwrap_or_default();
        if expected.is_empty() {
            silent.insert(name);
            continue;
        }
        for e in &expected {
            // promtool compares labels and annotations exactly: each firing case must state them.
            let labels = e["exp_labels"].as_object();
            assert!(
                labels.is_some_and(|l| l.contains_key("severity")),
                "{UNIT_TESTS}: {name} at {}: no exp_labels.severity",
                c["eval_time"]
            );
            let ann = e["exp_annotations"].as_object();
            assert!(
                ann.is_some_and(|a| a.contains_key("summary") && a.contains_key("description")),
                "{UNIT_TESTS}: {name} at {}: exp_annotations must give summary and description",
                c["eval_time"]
            );
        }
        fires.insert(name);
    }
    let missing = |have: &BTreeSet<String>| names.difference(have).cloned().collect::<Vec<_>>();
    assert_eq!(
        missing(&fires),
        Vec::<String>::new(),
        "{UNIT_TESTS}: alerts of {source} without a case where they fire"
    );
    assert_eq!(
        missing(&silent),
        Vec::<String>::new(),
        "{UNIT_TESTS}: alerts of {source} without a case where they stay silent"
    );
}

#[test]
fn a_rule_or_test_file_that_does_not_parse_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // PromQL that does not parse.
    let (source, mut rules) = chart_rules(None, "prometheusRule on");
    rules["groups"][0]["rules"][0]["expr"] =
        Value::from("sum by (reason (nodekeeper_engine_nodes_held");
    let err = check_rules(dir.path(), &source, &rules).unwrap_err();
    assert!(err.contains(&source), "{err}");
    assert!(err.contains("parse error"), "{err}");
    // A rule without its expression.
    let (_, mut rules) = chart_rules(None, "prometheusRule on");
    rules["groups"][0]["rules"][1]
        .as_object_mut()
        .unwrap()
        .remove("expr");
    let err = check_rules(dir.path(), &source, &rules).unwrap_err();
    assert!(err.contains(&source) && err.contains("expr"), "{err}");
    // A unit-test file that is not YAML.
    let bad = dir.path().join("alerts_test.yaml");
    std::fs::write(&bad, "tests:\n  - interval: 1m\n   input_series: [\n").unwrap();
    let err = load_unit_tests(&bad).unwrap_err();
    assert!(err.contains(&bad.display().to_string()), "{err}");
    let err = run_promtool(dir.path(), &["test", "rules", "alerts_test.yaml"]).unwrap_err();
    assert!(err.contains("alerts_test.yaml"), "{err}");
}
