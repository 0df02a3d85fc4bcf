//! `nodekeeper status` end to end: the real binary against the sim, through a kubeconfig, on
//! nodes carrying the annotations the policy writes (built with `policy::view::keys` and
//! `explain::Held::encode`).
//!
//! Sim only: nodes annotated by hand for every state the policy writes; `nodekeeper status` on a
//! live repair runs on both in `tests/e2e` (`repair`).
#![allow(clippy::unwrap_used)]

use crate::support::policy as policy_support;

use std::process::Stdio;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use nodekeeper_core::controller::policy::explain::{Blocker, Held};
use nodekeeper_core::controller::policy::view::{keys, NoticeKind, RecordedNotice};
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use serde_json::{json, Value};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn status(args: &[&str]) -> Out {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .arg("status")
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = Out {
        code: o.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    eprintln!(
        "$ nodekeeper status {} -> {}\n{}{}",
        args.join(" "),
        out.code,
        out.stdout,
        out.stderr
    );
    out
}

async fn status_async(args: Vec<String>) -> Out {
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        status(&a)
    })
    .await
    .unwrap()
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339()
}

fn held(b: Blocker, since: DateTime<Utc>) -> String {
    Held { blocker: b, since }.encode()
}

async fn node(c: &TestCluster, name: &str, pool: &str, ann: Value, unschedulable: bool) {
    let api: Api<Node> = Api::all(c.client.clone());
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool, "kubernetes.io/hostname": name},
                     "annotations": ann},
        "spec": {"unschedulable": unschedulable},
    }))
    .unwrap();
    api.create(&PostParams::default(), &n).await.unwrap();
}

/// The kinds of node of the brief (plus a short-circuited one), annotated as the policy would.
async fn seed(c: &TestCluster, now: DateTime<Utc>) {
    node(c, "idle-1", "general", json!({}), false).await;
    node(c, "admin-1", "general", json!({}), true).await;
    let budget = Blocker::Budget {
        group: "spot".into(),
        budget: 1,
        nodes: "1".into(),
        disrupting: 1,
        total: 3,
        opens_at: Some(now + Duration::hours(3)),
        timezone: Some("Asia/Shanghai".into()),
        nodepool: None,
    };
    node(
        c,
        "budget-1",
        "spot",
        json!({
            keys::BLOCKED: held(budget, now - Duration::minutes(4)),
        }),
        false,
    )
    .await;
    let pdb = Blocker::Pdb {
        pod: "shop/web-7".into(),
        pdb: "shop/web-pdb".into(),
        deadline: Some(now + Duration::minutes(8)),
    };
    node(
        c,
        "pdb-1",
        "spot",
        json!({
            keys::STATE: "repairing",
            keys::STATE_SINCE: rfc(now - Duration::minutes(30)),
            keys::REASON: "repair:Ready=False",
            keys::REPAIR_STEP: "drain",
            keys::REPAIR_STEP_SINCE: rfc(now - Duration::minutes(2)),
            keys::CORDONED_BY: keys::OWNER,
            keys::BLOCKED: held(pdb, now - Duration::minutes(1)),
        }),
        true,
    )
    .await;
    let short = Blocker::ShortCircuit {
        group: "gpu".into(),
        unhealthy: 2,
        total: 5,
        max_unhealthy: "20%".into(),
    };
    node(
        c,
        "gpu-1",
        "gpu",
        json!({ keys::BLOCKED: held(short, now - Duration::minutes(12)) }),
        false,
    )
    .await;
    let notice = RecordedNotice {
        kind: NoticeKind::Preemption,
        id: "aws-spot-i-0abc".into(),
        at: now + Duration::seconds(110),
    };
    node(
        c,
        "spot-1",
        "spot",
        json!({
            keys::STATE: "interrupted",
            keys::STATE_SINCE: rfc(now - Duration::seconds(10)),
            keys::REASON: "interruption:preemption",
            keys::CORDONED_BY: keys::OWNER,
            keys::LB_EXCLUDED_BY: keys::OWNER,
            keys::INTERRUPTION: notice.encode(),
            keys::REPLACEMENT_REQUESTED: rfc(now - Duration::seconds(9)),
        }),
        true,
    )
    .await;
}

fn line<'a>(text: &'a str, node: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(&format!("{node} ")))
        .unwrap_or_else(|| panic!("no line for {node} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_cli_against_the_sim() {
    let c = TestCluster::start(SimOptions::bare()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    c.write_kubeconfig(&kc).unwrap();
    let kcs = kc.to_str().unwrap().to_string();
    seed(&c, Utc::now()).await;

    // Text: every held node names its blocker, the summary counts.
    let o = status_async(vec!["--kubeconfig".into(), kcs.clone()]).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = &o.stdout;
    assert!(
        t.starts_with("NODE ") && t.lines().next().unwrap().ends_with("SINCE   NEXT"),
        "{t}"
    );
    assert!(line(t, "idle-1").contains(" idle "), "{t}");
    assert!(line(t, "admin-1").contains("idle,admin-cordoned"), "{t}");
    let b = line(t, "budget-1");
    assert!(
        b.contains("budget #1 nodes=1 of spot (1/3 disrupting), opens ") && b.contains(" CST"),
        "{b}"
    );
    assert!(
        b.contains("start when the budget window opens (in 2h59m)")
            || b.contains("start when the budget window opens (in 3h)"),
        "{b}"
    );
    let p = line(t, "pdb-1");
    assert!(p.contains("repairing,cordoned"), "{p}");
    assert!(p.contains("PDB shop/web-pdb (pod shop/web-7)"), "{p}");
    assert!(
        p.contains("evict shop/web-7 once PDB shop/web-pdb allows (in 7m)")
            || p.contains("(in 8m)"),
        "{p}"
    );
    let s = line(t, "spot-1");
    assert!(s.contains("interrupted,cordoned"), "{s}");
    assert!(
        s.contains("finish the drain before the preemption (in 1m)"),
        "{s}"
    );
    let g = line(t, "gpu-1");
    assert!(
        g.contains("short-circuit: 2/5 of gpu unhealthy (max 20%)")
            && g.contains(" 12m ")
            && g.contains("repair when at most 20% of group gpu are unhealthy"),
        "{g}"
    );
    assert!(t.ends_with("6 nodes, 2 acting, 3 held\n"), "{t}");

    // Wide: reason, step, notice, replacement.
    let o = status_async(vec![
        "--kubeconfig".into(),
        kcs.clone(),
        "-o".into(),
        "wide".into(),
    ])
    .await;
    assert_eq!(o.code, 0);
    let header: Vec<&str> = o
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NODE",
            "GROUP",
            "STATE",
            "BLOCKER",
            "SINCE",
            "NEXT",
            "REASON",
            "STEP",
            "NOTICE",
            "REPLACEMENT"
        ]
    );
    let p = line(&o.stdout, "pdb-1");
    assert!(
        p.contains("repair:Ready=False") && p.contains("drain (2m)"),
        "{p}"
    );
    let s = line(&o.stdout, "spot-1");
    assert!(
        s.contains("interruption:preemption") && s.contains("preemption at "),
        "{s}"
    );
    assert!(
        s.contains("requested ") && s.ends_with("s ago"),
        "replacement age in seconds: {s}"
    );

    // JSON: versioned, the full blocker (pod AND PDB, budget and window, deadline).
    let o = status_async(vec![
        "--kubeconfig".into(),
        kcs.clone(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    assert_eq!(o.code, 0);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["summary"], json!({"nodes": 6, "acting": 2, "held": 3}));
    let by_name = |n: &str| {
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == n)
            .unwrap()
            .clone()
    };
    let p = by_name("pdb-1");
    assert_eq!(p["held"]["reason"], "BlockedByPDB");
    assert_eq!(p["held"]["blocker"]["kind"], "pdb");
    assert_eq!(p["held"]["blocker"]["pod"], "shop/web-7");
    assert_eq!(p["held"]["blocker"]["pdb"], "shop/web-pdb");
    assert!(p["held"]["blocker"]["deadline"].is_string());
    assert_eq!(p["next"]["at"], p["held"]["blocker"]["deadline"]);
    let b = by_name("budget-1");
    assert_eq!(b["state"], "idle");
    assert_eq!(b["group"], "spot");
    assert_eq!(b["held"]["blocker"]["kind"], "budget");
    assert_eq!(b["held"]["blocker"]["timezone"], "Asia/Shanghai");
    assert!(b["held"]["message"]
        .as_str()
        .unwrap()
        .contains("window opens at"));
    let s = by_name("spot-1");
    assert_eq!(s["interruption"]["kind"], "preemption");
    assert_eq!(s["interruption"]["id"], "aws-spot-i-0abc");
    assert!(s["replacement_requested"].is_string());
    assert_eq!(s["next"]["at"], s["interruption"]["at"]);
    let g = by_name("gpu-1");
    assert_eq!(g["held"]["reason"], "RepairShortCircuited");
    assert_eq!(g["held"]["blocker"]["unhealthy"], 2);
    assert_eq!(g["held"]["blocker"]["max_unhealthy"], "20%");
    assert_eq!(by_name("admin-1")["cordoned_by"], "admin");
    assert!(by_name("idle-1")["held"].is_null());

    // Selector and pagination: 7 more nodes, fetched 2 per request.
    for i in 0..7 {
        node(&c, &format!("extra-{i}"), "batch", json!({}), false).await;
    }
    let o = status_async(vec![
        "--kubeconfig".into(),
        kcs.clone(),
        "--chunk-size".into(),
        "2".into(),
    ])
    .await;
    assert_eq!(o.code, 0);
    assert!(
        o.stdout.ends_with("13 nodes, 2 acting, 3 held\n"),
        "{}",
        o.stdout
    );
    let o = status_async(vec![
        "--kubeconfig".into(),
        kcs.clone(),
        "-l".into(),
        "karpenter.sh/nodepool=spot".into(),
    ])
    .await;
    assert_eq!(o.code, 0);
    assert!(
        o.stdout.ends_with("3 nodes, 2 acting, 2 held\n"),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("extra-") && !o.stdout.contains("idle-1"));
    // A custom group label.
    let o = status_async(vec![
        "--kubeconfig".into(),
        kcs.clone(),
        "--group-label".into(),
        "kubernetes.io/hostname".into(),
        "-l".into(),
        "karpenter.sh/nodepool=general".into(),
    ])
    .await;
    assert!(
        line(&o.stdout, "idle-1").starts_with("idle-1    idle-1 "),
        "{}",
        o.stdout
    );
}

#[test]
fn errors_exit_1_naming_the_file_or_server_and_usage_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("garbage");
    std::fs::write(&bad, "this: [is not a kubeconfig").unwrap();
    let o = status(&["--kubeconfig", bad.to_str().unwrap()]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.starts_with("error: kubeconfig "), "{}", o.stderr);
    assert!(o.stderr.contains(bad.to_str().unwrap()), "{}", o.stderr);
    assert!(o.stdout.is_empty());

    let missing = dir.path().join("missing");
    let o = status(&["--kubeconfig", missing.to_str().unwrap()]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains(missing.to_str().unwrap()), "{}", o.stderr);

    // A server nobody listens on: a port bound here, never listening (connections refused).
    let (_held, addr) = crate::support::refused_addr();
    let port = addr.port();
    let kc = dir.path().join("kc");
    nodekeeper_sim::apiserver::write_kubeconfig(&kc, &format!("http://127.0.0.1:{port}")).unwrap();
    let started = std::time::Instant::now();
    let o = status(&["--kubeconfig", kc.to_str().unwrap()]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains(&format!(
            "cannot list nodes from the API server http://127.0.0.1:{port}/"
        )),
        "{}",
        o.stderr
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));

    let o = status(&["--kubeconfig", kc.to_str().unwrap(), "--context", "nope"]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("nope"), "{}", o.stderr);

    let o = status(&["-o", "yaml"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("yaml"), "{}", o.stderr);
}

/// Closes the loop with the real decision core: `policy::decide` on a cluster with two failing
/// nodes, a `nodes = "1"` budget and a preemption notice; the actions are applied as the actor
/// would; the resulting Nodes go to the sim; `nodekeeper status` must explain them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_explains_what_the_policy_decided() {
    use nodekeeper_core::controller::policy::config::Quantity;
    use policy_support as ps;

    let now = Utc::now();
    let mut c = ps::cfg();
    c.repair.max_unhealthy = Quantity::Percent(100);
    c.budgets.default = ps::budgets(r#"[{ nodes = "1" }]"#);
    let mut a = ps::node("general-a", "general", now);
    ps::ready(&mut a, "False", now - Duration::minutes(12));
    let mut b = ps::node("general-b", "general", now);
    ps::ready(&mut b, "False", now - Duration::minutes(11));
    let mut s = ps::node("spot-a", "spot", now);
    s.notices.push(ps::notice(
        "aws-spot-1",
        NoticeKind::Preemption,
        Some(now + Duration::minutes(2)),
        now,
    ));
    let mut v = ps::view(vec![a, b, ps::node("general-c", "general", now), s]);
    let ds = ps::run(&v, &c, now);
    ps::apply(&mut v, &ds);

    let cl = TestCluster::start(SimOptions::bare()).await.unwrap();
    let api: Api<Node> = Api::all(cl.client.clone());
    for n in &v.nodes {
        let obj: Node = serde_json::from_value(json!({
            "metadata": {"name": n.name, "labels": n.labels, "annotations": n.annotations},
            "spec": {"unschedulable": n.unschedulable},
        }))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    cl.write_kubeconfig(&kc).unwrap();
    let kcs = kc.to_str().unwrap().to_string();

    let o = status_async(vec![
        "--kubeconfig".into(),
        kcs.clone(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let doc: Value = serde_json::from_str(&o.stdout).unwrap();
    let by_name = |name: &str| {
        doc["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .unwrap()
            .clone()
    };
    let a = by_name("general-a");
    assert_eq!(a["state"], "repairing", "{a:#}");
    assert_eq!(a["cordoned_by"], "nodekeeper", "{a:#}");
    let b = by_name("general-b");
    assert_eq!(b["held"]["blocker"]["kind"], "budget", "{b:#}");
    assert_eq!(b["held"]["blocker"]["nodes"], "1");
    assert_eq!(b["held"]["blocker"]["group"], "general");
    assert_eq!(
        b["next"]["action"],
        "start when a disruption in group general finishes"
    );
    let s = by_name("spot-a");
    assert_eq!(s["state"], "interrupted", "{s:#}");
    assert_eq!(s["interruption"]["kind"], "preemption");
    assert_eq!(s["interruption"]["id"], "aws-spot-1");
    assert_eq!(by_name("general-c")["state"], "idle");
    assert_eq!(doc["summary"]["acting"], 2);
    assert_eq!(doc["summary"]["held"], 1);

    let o = status_async(vec!["--kubeconfig".into(), kcs]).await;
    let b = line(&o.stdout, "general-b");
    assert!(
        b.contains("budget #0 nodes=1 of general (1/3 disrupting)"),
        "{}",
        o.stdout
    );
}

/// `--config`: the budgets in force per group of the listed nodes and where each comes from; with
/// `source = "nodepool"` read from the NodePools (a refused one shown as the hold it causes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_config_shows_the_budgets_in_force_and_their_source() {
    use kube::core::DynamicObject;
    use nodekeeper_core::controller::state::nodepools::nodepool_resource;
    let c = TestCluster::start(SimOptions::bare()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    c.write_kubeconfig(&kc).unwrap();
    for (name, pool) in [
        ("s-0", "spot"),
        ("s-1", "spot"),
        ("s-2", "spot"),
        ("b-0", "bad"),
        ("g-0", "general"),
    ] {
        node(&c, name, pool, json!({}), false).await;
    }
    let pools: Api<DynamicObject> = Api::all_with(c.client.clone(), &nodepool_resource());
    for (name, budgets) in [
        (
            "spot",
            json!([{"nodes": "50%"}, {"nodes": "1", "schedule": "@daily", "duration": "1h", "reasons": ["Drifted"]}]),
        ),
        ("bad", json!([{"nodes": "1", "schedule": "@daily"}])),
    ] {
        let o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"disruption": {"budgets": budgets}},
        }))
        .unwrap();
        pools.create(&PostParams::default(), &o).await.unwrap();
    }
    let cfg = dir.path().join("controller.toml");
    std::fs::write(
        &cfg,
        r#"[budgets]
source = "nodepool"
budgets = [{ nodes = "2" }]
[budgets.groups]
spot = [{ nodes = "0", schedule = "0 23 * * *", duration = "10h", timezone = "Asia/Shanghai", reasons = ["repair"] }]
"#,
    )
    .unwrap();
    let args = |o: &str| {
        vec![
            "--kubeconfig".to_string(),
            kc.to_str().unwrap().into(),
            "--config".into(),
            cfg.to_str().unwrap().into(),
            "-o".into(),
            o.into(),
        ]
    };
    let o = status_async(args("text")).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = &o.stdout;
    let (nodes, budgets) = t
        .split_once("\n\n")
        .expect("a budgets section after a blank line");
    assert!(nodes.ends_with("5 nodes, 0 acting, 0 held"), "{t}");
    let lines: Vec<&str> = budgets.lines().collect();
    assert!(
        lines[0].starts_with("GROUP ") && lines[0].ends_with("ACTIVE   ALLOWS"),
        "{t}"
    );
    let cells = |l: &str| {
        l.split("   ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        cells(lines[1]),
        [
            "bad",
            "NodePool bad (invalid)",
            "#0",
            "0",
            "always",
            "all",
            "yes",
            "0"
        ],
        "{t}"
    );
    assert_eq!(
        cells(lines[2]),
        ["general", "config", "#0", "2", "always", "all", "yes", "2"],
        "{t}"
    );
    assert_eq!(
        cells(lines[3]),
        [
            "spot",
            "NodePool spot",
            "#0",
            "50%",
            "always",
            "all",
            "yes",
            "2"
        ],
        "{t}"
    );
    assert_eq!(
        cells(lines[4])[..6],
        [
            "spot",
            "NodePool spot",
            "#1",
            "1",
            "@daily for 1h (UTC)",
            "Drifted"
        ],
        "{t}"
    );
    assert_eq!(
        cells(lines[4])[7],
        "-",
        "a Karpenter reason never gates a repair: {t}"
    );
    assert_eq!(
        cells(lines[5])[..6],
        [
            "spot",
            "config",
            "#0",
            "0",
            "0 23 * * * for 10h (Asia/Shanghai)",
            "repair"
        ],
        "{t}"
    );
    assert_eq!(
        lines[6],
        "NodePool bad: spec.disruption.budgets[0].schedule: 'schedule' must be set with 'duration': disruptions of group bad are held",
        "{t}"
    );
    // JSON: the same as `budgets[]`.
    let o = status_async(args("json")).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["budgets"].as_array().unwrap().len(), 5, "{v}");
    assert_eq!(v["budgets"][2]["source"], "NodePool spot");
    assert_eq!(v["budgets"][2]["repair_max"], 2);
    // Without --config: no budgets.
    let o = status_async(vec![
        "--kubeconfig".into(),
        kc.to_str().unwrap().into(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    assert!(serde_json::from_str::<Value>(&o.stdout)
        .unwrap()
        .get("budgets")
        .is_none());
}
