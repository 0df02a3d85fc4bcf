//! `kubectl nodekeeper …`: the real kubectl finds the binary as `kubectl-nodekeeper` on `PATH`
//! (a symlink, as the packages ship it) and runs it with kubectl's global flags, against the real
//! control plane. Real only: the point is kubectl's own plugin lookup and a real API server's
//! Events field selectors; the sim's `status` is `status_cli`'s.
//!
//! The held node is written as the controller writes one (its annotations, the `NodekeeperHeld`
//! condition, an Event reported by `nodekeeper.io/controller`, its history ConfigMap), without a controller: what the
//! controller writes is `repair`'s to prove; this test proves what the plugin reads and prints.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chrono::Utc;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{Context, Kubeconfig, NamedCluster, NamedContext};
use nodekeeper_core::controller::act::history;
use nodekeeper_core::controller::policy::explain::{Blocker, Held};
use nodekeeper_core::controller::policy::view::keys;
use serde_json::json;

use crate::support::*;

/// A directory holding `kubectl-nodekeeper` and `kubectl_complete-nodekeeper` → the built
/// binary, for `PATH`.
fn plugin_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["kubectl-nodekeeper", "kubectl_complete-nodekeeper"] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nodekeeper"), bin.join(name)).unwrap();
    }
    bin
}

/// The real kubectl with `bin` first on `PATH`, `HOME` in `home`, no `KUBECONFIG`: only the flags
/// given choose the cluster. Prints the command and its output.
fn kubectl_with_plugin(bin: &Path, home: &Path, args: &[&str]) -> Output {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(crate::shared::kubectl_bin())
        .args(args)
        .env("PATH", path)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    eprintln!(
        "$ kubectl {} (exit {:?})\n{}{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The admin kubeconfig of `c` with a second context, `nowhere` (a server that refuses every
/// connection), made the current one: only `--context ADMIN` reaches the cluster.
fn two_context_kubeconfig(c: &Cluster, path: &Path, refused: std::net::SocketAddr) -> String {
    let mut kc = Kubeconfig::read_from(&c.kubeconfig).unwrap();
    let admin_ctx = kc.current_context.clone().expect("admin context");
    kc.clusters.push(NamedCluster {
        name: "nowhere".into(),
        cluster: Some(kube::config::Cluster {
            server: Some(format!("https://{refused}")),
            insecure_skip_tls_verify: Some(true),
            ..kube::config::Cluster::default()
        }),
        other: Default::default(),
    });
    let user = kc.contexts[0].context.as_ref().and_then(|x| x.user.clone());
    kc.contexts.push(NamedContext {
        name: "nowhere".into(),
        context: Some(Context {
            cluster: "nowhere".into(),
            user,
            ..Context::default()
        }),
        other: Default::default(),
    });
    kc.current_context = Some("nowhere".into());
    std::fs::write(path, serde_yaml::to_string(&kc).unwrap()).unwrap();
    admin_ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_runs_the_plugin_with_its_global_flags_on_the_real_cluster() {
    init_tracing();
    let c = cluster();
    // No engine may act on the held node while it exists (theirs act on every node).
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let name = format!("kp-{}", rand_id());
    let _nodes = c
        .create_nodes(&[kwok_node(
            &name,
            json!({ "karpenter.sh/nodepool": "kp-pool", "kubernetes.io/hostname": name }),
        )])
        .await;

    // A node held by its group's budget, as the controller records it.
    let now = Utc::now();
    let since = now - chrono::TimeDelta::minutes(5);
    let held = Held {
        blocker: Blocker::Budget {
            group: "kp-pool".into(),
            budget: 0,
            nodes: "1".into(),
            disrupting: 1,
            total: 3,
            opens_at: None,
            timezone: None,
            nodepool: None,
        },
        since,
    };
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                keys::REASON: "repair:Ready=False",
                keys::BLOCKED: serde_json::to_string(&held).unwrap(),
            }}})),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "NodekeeperHeld",
                "status": "True",
                "reason": "BlockedByBudget",
                "message": "budget #0 of group kp-pool allows 1 node at once; 1 of 3 disrupting",
                "lastTransitionTime": since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "lastHeartbeatTime": since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            }]}})),
        )
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let ev = |reason: &str, note: &str, ago: i64| Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{}", reason.to_lowercase())),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(
            k8s_openapi::jiff::Timestamp::from_second(
                (now - chrono::TimeDelta::minutes(ago)).timestamp(),
            )
            .unwrap(),
        )),
        action: Some("Hold".into()),
        reason: Some(reason.into()),
        note: Some(note.into()),
        type_: Some("Normal".into()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.clone()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some("nodekeeper.io/controller".into()),
        reporting_instance: Some("kp-test".into()),
        ..Event::default()
    };
    for e in [
        ev("RepairCancelled", "an older repair, cancelled", 9),
        ev("BlockedByBudget", "held by budget #0 of kp-pool", 4),
    ] {
        events.create(&PostParams::default(), &e).await.unwrap();
    }
    // Its history, older than any Event, as the controller's writer stores it.
    let histories = history::store::Histories::new(admin.clone(), NS);
    let _ = Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .delete(&history::store::name(&name), &Default::default())
        .await;
    let entry = |days: i64, action: &str, outcome: &str| history::Entry {
        step: Some("drain".into()),
        why: Some("repair:Ready=False".into()),
        outcome: outcome.into(),
        duration_ms: 1500,
        ..history::Entry::new(now - chrono::TimeDelta::days(days), action)
    };
    let recorded = [
        entry(3, "start_drain", "ok"),
        entry(2, "drain", "completed"),
    ];
    let limits = history::HistoryConfig::default().limits();
    histories
        .append(&name, &recorded, &limits, now)
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let bin = plugin_dir(dir.path());
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let (_refusing, refused) = crate::shared::refused_addr();
    let kc = dir.path().join("two-contexts.kubeconfig");
    let admin_ctx = two_context_kubeconfig(c, &kc, refused);
    let kc = kc.to_str().unwrap();
    let run = |args: &[&str]| kubectl_with_plugin(&bin, &home, args);

    // kubectl finds it.
    let out = run(&["plugin", "list", "--name-only"]);
    assert!(
        text(&out.stdout).lines().any(|l| l == "kubectl-nodekeeper"),
        "{out:?}"
    );

    // status: --kubeconfig and --context choose the cluster, -o json the output.
    let out = run(&[
        "nodekeeper",
        "--kubeconfig",
        kc,
        "--context",
        &admin_ctx,
        "status",
        "-o",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} in {doc}"));
    assert_eq!(row["group"], "kp-pool");
    assert_eq!(row["held"]["reason"], "BlockedByBudget");
    assert_eq!(
        row["next"]["action"],
        "start when a disruption in group kp-pool finishes"
    );
    // Without --context, the kubeconfig's current context (a server refusing connections).
    let out = run(&["nodekeeper", "--kubeconfig", kc, "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&refused.to_string()),
        "{}",
        text(&out.stderr)
    );

    // explain, text: why it is held and what happens next, its condition and Events.
    let out = run(&[
        "nodekeeper",
        "explain",
        &name,
        "--kubeconfig",
        kc,
        "--context",
        &admin_ctx,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for want in [
        format!("Node:        {name}\n"),
        "Group:       kp-pool\n".into(),
        "Reason:      repair:Ready=False\n".into(),
        "Held:        yes, BlockedByBudget since ".into(),
        "Blocker:     budget #0 nodes=1 of kp-pool (1/3 disrupting)\n".into(),
        "Next:        start when a disruption in group kp-pool finishes\n".into(),
        "  NodekeeperHeld=True BlockedByBudget: budget #0 of group kp-pool allows 1 node at once"
            .into(),
    ] {
        assert!(t.contains(&want), "{want:?} in\n{t}");
    }
    let newer = t
        .find("BlockedByBudget   1")
        .expect("the newer Event listed");
    let older = t.find("RepairCancelled").expect("the older Event listed");
    assert!(newer < older, "newest first:\n{t}");
    // explain -o json (the global flag before the command).
    let out = run(&[
        "nodekeeper",
        "-o",
        "json",
        "--context",
        &admin_ctx,
        "--kubeconfig",
        kc,
        "explain",
        &name,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let x: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(x["version"], 1);
    assert_eq!(x["node"]["held"]["blocker"]["kind"], "budget");
    assert_eq!(x["conditions"][0]["type"], "NodekeeperHeld");
    assert_eq!(x["recent_events"][0]["reason"], "BlockedByBudget");

    // history: the recorded actions, newest first, then the Events (-o json and text).
    let history = |node: &str, output: &str| {
        let flags = ["--kubeconfig", kc, "--context", &admin_ctx, "-o", output];
        run(&[&["nodekeeper", "history", node][..], &flags].concat())
    };
    let out = history(&name, "json");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let h: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let actions: Vec<&str> = h["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["drain", "start_drain"]);
    let reasons: Vec<&str> = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["BlockedByBudget", "RepairCancelled"]);
    let out = history(&name, "text");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].starts_with("WHEN"), "{t}");
    assert!(
        lines[1].contains("(2d ago)")
            && lines[1].contains(" drain ")
            && lines[1].contains("completed"),
        "{t}"
    );
    assert!(lines[2].contains("start_drain"), "{t}");
    assert!(t.contains("BlockedByBudget"), "the Events after it:\n{t}");
    // A node that does not exist: exit 1 naming it.
    let out = history("kp-missing", "text");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("node kp-missing not found"),
        "{}",
        text(&out.stderr)
    );

    // nodekeeper installed elsewhere than -n says: exit 1 naming the missing namespace.
    let out = run(&[
        "nodekeeper",
        "-n",
        "kp-elsewhere",
        "status",
        "--kubeconfig",
        kc,
        "--context",
        &admin_ctx,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("nodekeeper is not installed")
            && text(&out.stderr).contains("namespace \"kp-elsewhere\" not found"),
        "{}",
        text(&out.stderr)
    );

    // A namespace without nodekeeper's controller ServiceAccount: exit 1 naming it.
    let out = run(&[
        "nodekeeper",
        "--namespace=default",
        "explain",
        &name,
        "--kubeconfig",
        kc,
        "--context",
        &admin_ctx,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(
            "serviceaccount \"nodekeeper-controller\" not found in namespace \"default\""
        ),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());

    // kubectl's own completion of `kubectl nodekeeper …` (what its bash and zsh scripts call):
    // the commands, then node names of the cluster the typed flags choose.
    let out = run(&["__complete", "nodekeeper", ""]);
    let t = text(&out.stdout);
    assert!(t.lines().any(|l| l.starts_with("explain\t")), "{t}");
    assert!(t.lines().any(|l| l.starts_with("history\t")), "{t}");
    let out = run(&[
        "__complete",
        "nodekeeper",
        "--kubeconfig",
        kc,
        "--context",
        &admin_ctx,
        "explain",
        "kp-",
    ]);
    let t = text(&out.stdout);
    assert!(t.lines().any(|l| l == name), "{name} in {t}");

    // Completion scripts, through kubectl too.
    for shell in ["bash", "zsh"] {
        let out = run(&["nodekeeper", "completion", shell]);
        assert_eq!(out.status.code(), Some(0));
        let script = text(&out.stdout);
        assert!(
            script.contains("explain") && script.contains("--context"),
            "{shell}"
        );
    }

    events
        .delete_collection(
            &Default::default(),
            &kube::api::ListParams::default().fields(&format!("regarding.name={name}")),
        )
        .await
        .unwrap();
}

/// A cluster without nodekeeper (the same control plane, nothing installed): every command but
/// `completion` exits 1 naming what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_without_nodekeeper_the_plugin_names_what_is_missing() {
    init_tracing();
    let dir = std::env::temp_dir().join(format!("nodekeeper-bare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    crate::shared::k8s_cluster_up(
        &dir,
        &["--owner-pid".to_string(), std::process::id().to_string()],
    );
    let bare = real_cluster_at(&dir);
    let work = tempfile::tempdir().unwrap();
    let bin = plugin_dir(work.path());
    let kc = bare.kubeconfig.to_str().unwrap();
    for args in [
        &["nodekeeper", "status", "--kubeconfig", kc][..],
        &["nodekeeper", "--kubeconfig", kc, "explain", "any-node"],
        &[
            "nodekeeper",
            "--kubeconfig",
            kc,
            "history",
            "any-node",
            "-o",
            "json",
        ],
        &[
            "nodekeeper",
            "--kubeconfig",
            kc,
            "drain",
            "any-node",
            "--dry-run",
        ],
    ] {
        let out = kubectl_with_plugin(&bin, work.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!(
                "error: nodekeeper is not installed in the cluster at {}/: namespace \"nodekeeper\" not found",
                bare.server
            )),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    let down = Command::new(repo().join("scripts/k8s-cluster.sh"))
        .arg("down")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(down.status.success(), "{}", text(&down.stderr));
}
