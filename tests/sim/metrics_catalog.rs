//! The controller's `/metrics` exposes exactly the documented catalog: every metric of the
//! tables in docs/catalog.md, with its type and labels, and nothing else.
//!
//! A controller with the engine and a webhook target acts on a preemption (so the labelled
//! families — actions, groups, notifications — have samples), then `/metrics` is read.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use nodekeeper_core::agent::sources::EventKind;
use nodekeeper_core::controller::act::notify::NotifyConfig;
use nodekeeper_core::controller::act::provider::fake::FakeProvider;
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_sim::apiserver::scenario::Scenario;

use crate::support::engine as engine_support;
use engine_support::*;

/// One documented metric: type and label names.
#[derive(Debug, PartialEq, Eq)]
struct Doc {
    kind: String,
    labels: BTreeSet<String>,
}

/// The rows of every `| metric | type | labels | meaning |` table in docs/catalog.md.
fn catalog() -> BTreeMap<String, Doc> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/catalog.md");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = BTreeMap::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("| metric | type | labels |") {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_string();
        let labels = label_names(cells[3]);
        let doc = Doc {
            kind: cells[2].to_string(),
            labels,
        };
        assert!(
            out.insert(name.clone(), doc).is_none(),
            "{name} twice in docs/catalog.md"
        );
    }
    assert!(out.len() > 20, "catalog tables not found: {out:?}");
    out
}

/// Label names of a labels cell: the backticked words outside parentheses
/// (`` `kind` (`a`, `b`), `result` `` → kind, result).
fn label_names(cell: &str) -> BTreeSet<String> {
    let mut depth = 0;
    let mut outside = String::new();
    for c in cell.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    outside
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// What `/metrics` exposes: `# TYPE` lines (the exposed names: counters with `_total`) and the
/// label names seen on each family's samples.
fn exposed(text: &str) -> BTreeMap<String, Doc> {
    let mut out: BTreeMap<String, Doc> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            out.insert(
                name.to_string(),
                Doc {
                    kind: kind.to_string(),
                    labels: BTreeSet::new(),
                },
            );
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, labels)) = line.split_once('{') else {
            continue;
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                series
                    .strip_suffix(s)
                    .filter(|f| out.get(*f).is_some_and(|d| d.kind == "histogram"))
            })
            .unwrap_or(series);
        let doc = out
            .get_mut(family)
            .unwrap_or_else(|| panic!("sample without # TYPE: {line}"));
        let labels = labels.split_once('}').unwrap().0;
        for pair in labels.split("\",") {
            let key = pair.split_once('=').unwrap().0.trim_matches(',');
            if key != "le" {
                doc.labels.insert(key.to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_exposes_exactly_the_catalog() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(l, Router::new().route("/hook", post(|| async { "ok" }))).await
    });
    let c = cluster(20.0, Scenario::default_mixed(), loops()).await;
    let mut cfg = controller_config("metrics-catalog");
    // the receiver is on loopback
    cfg.allow_loopback_destinations = true;
    cfg.notify = vec![toml::from_str::<NotifyConfig>(&format!("url = \"{url}\"")).unwrap()];
    let fake = std::sync::Arc::new(FakeProvider::new());
    let ctl = controller(&c, &cfg, PolicyConfig::default(), Some(fake)).await;
    let now = c.sim.store.clock.now();
    let ev = notice(
        "p-1",
        EventKind::Preemption,
        Some(now + chrono::Duration::seconds(600)),
        now,
    );
    assert!(ctl.app.states.ingest_event("spot-0", ev).await);
    let http = nodekeeper_core::http::client().unwrap();
    let scrape = || async {
        let r = http
            .get(format!("http://{}/metrics", ctl.addr))
            .send()
            .await
            .unwrap();
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
        r.text().await.unwrap()
    };
    wait_until(
        Duration::from_secs(60),
        "an action, a sent notification and the groups' node counts",
        || async {
            let t = scrape().await;
            t.contains("nodekeeper_engine_actions_total{")
                && t.contains("nodekeeper_engine_group_nodes{")
                && t.lines().any(|l| {
                    l.starts_with("nodekeeper_notifications_total{")
                        && l.contains("outcome=\"sent\"")
                        && !l.ends_with(" 0")
                })
        },
    )
    .await;
    let text = scrape().await;
    let got = exposed(&text);
    let want = catalog();
    let names = |m: &BTreeMap<String, Doc>| m.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        names(&got),
        names(&want),
        "exposed vs docs/catalog.md:\n{text}"
    );
    for (name, g) in &got {
        let w = &want[name];
        assert_eq!(g.kind, w.kind, "{name}: type");
        // Families without samples yet (no drain finished, nothing held) show no labels.
        assert!(
            g.labels.is_empty() || g.labels == w.labels,
            "{name}: labels {:?}, documented {:?}",
            g.labels,
            w.labels
        );
    }
    for labelled in [
        "nodekeeper_engine_actions_total",
        "nodekeeper_notifications_total",
        "nodekeeper_engine_group_nodes",
    ] {
        assert!(
            !got[labelled].labels.is_empty(),
            "{labelled} has no samples:\n{text}"
        );
    }
    ctl.stop().await;
}

#[test]
fn label_cells_are_parsed() {
    assert_eq!(
        label_names("`kind` (`annotate`, `cordon`), `result` (`ok`)"),
        ["kind", "result"].map(String::from).into()
    );
    assert!(label_names("").is_empty());
}
