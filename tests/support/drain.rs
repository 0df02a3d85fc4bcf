//! Shared fixtures of the drain tests: nodes, pods (Running/Ready), PDBs seeded into the sim.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use nodekeeper_sim::apiserver::resources::well_known;
use nodekeeper_sim::apiserver::scenario::running_status;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use serde_json::{json, Value};

pub type Cluster = TestCluster;

/// [`client`], recording `METHOD URI` of every request on its way.
pub fn counting_client(c: &TestCluster) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let inner = client(c);
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let l = log.clone();
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        l.lock()
            .unwrap()
            .push(format!("{} {}", req.method(), req.uri()));
        let inner = inner.clone();
        async move { inner.send(req).await }
    });
    (kube::Client::new(svc, "default"), log)
}

/// The VolumeAttachment resource of the sim.
pub fn volumeattachments() -> &'static nodekeeper_sim::apiserver::resources::ResourceDef {
    nodekeeper_sim::apiserver::resources::find("storage.k8s.io", "v1", "volumeattachments").unwrap()
}

pub async fn cluster() -> TestCluster {
    TestCluster::start(SimOptions::bare()).await.unwrap()
}

/// A drain client for the sim (kube's own 429 retry off).
pub fn client(c: &TestCluster) -> kube::Client {
    let mut cfg = kube::Config::new(c.url.parse().unwrap());
    cfg.default_namespace = "default".into();
    nodekeeper_core::controller::act::drain::client(cfg).unwrap()
}

pub fn create(
    c: &TestCluster,
    res: &'static nodekeeper_sim::apiserver::resources::ResourceDef,
    ns: &str,
    obj: Value,
) -> Value {
    c.sim
        .store
        .txn(|t| t.create(res, ns, obj))
        .map(|o| (*o).clone())
        .unwrap()
}

pub fn node(c: &TestCluster, name: &str) {
    create(
        c,
        well_known::nodes(),
        "",
        json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {}}),
    );
    if c.sim
        .store
        .get(well_known::namespaces(), "", "kube-system")
        .is_none()
    {
        create(
            c,
            well_known::namespaces(),
            "",
            json!({"metadata": {"name": "kube-system"}}),
        );
    }
}

/// A pod spec builder.
#[derive(Clone)]
pub struct PodSpec {
    pub name: String,
    pub ns: String,
    pub app: String,
    pub owner: Option<(&'static str, String)>,
    pub priority: Option<&'static str>,
    pub tolerate_all: bool,
    pub annotations: Value,
    pub phase: &'static str,
    pub grace: i64,
    pub finalizer: bool,
}

pub fn pod(name: &str, app: &str) -> PodSpec {
    PodSpec {
        name: name.into(),
        ns: "default".into(),
        app: app.into(),
        owner: Some(("ReplicaSet", app.into())),
        priority: None,
        tolerate_all: false,
        annotations: json!({}),
        phase: "Running",
        grace: 30,
        finalizer: false,
    }
}

impl PodSpec {
    pub fn ds(mut self, ds: &str) -> Self {
        self.owner = Some(("DaemonSet", ds.into()));
        self.ns = "kube-system".into();
        self
    }
    pub fn critical(mut self) -> Self {
        self.priority = Some("system-node-critical");
        self.ns = "kube-system".into();
        self
    }
    pub fn tolerate_all(mut self) -> Self {
        self.tolerate_all = true;
        self
    }
    pub fn annotate(mut self, k: &str, v: &str) -> Self {
        self.annotations[k] = json!(v);
        self
    }
    pub fn mirror(mut self) -> Self {
        self.owner = Some(("Node", "n".into()));
        self.annotate("kubernetes.io/config.mirror", "abc")
    }
    pub fn phase(mut self, p: &'static str) -> Self {
        self.phase = p;
        self
    }
    pub fn grace(mut self, g: i64) -> Self {
        self.grace = g;
        self
    }
    pub fn finalizer(mut self) -> Self {
        self.finalizer = true;
        self
    }
    pub fn on(&self, c: &TestCluster, node: &str) -> Value {
        let now = c.sim.store.clock.stamp();
        let mut spec = json!({"nodeName": node, "containers": [{"name": "main", "image": "sim/x:1"}],
            "terminationGracePeriodSeconds": self.grace,
            "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]});
        if let Some(p) = self.priority {
            spec["priorityClassName"] = json!(p);
        }
        if self.tolerate_all {
            spec["tolerations"] = json!([{"operator": "Exists"}]);
        }
        let mut status = running_status(&now);
        if self.phase != "Running" {
            status = json!({"phase": self.phase});
        }
        let mut meta = json!({"name": self.name, "labels": {"app": self.app}, "annotations": self.annotations});
        if let Some((kind, name)) = &self.owner {
            let api = if *kind == "Node" { "v1" } else { "apps/v1" };
            meta["ownerReferences"] = json!([{"apiVersion": api, "kind": kind, "name": name,
                "uid": format!("uid-{name}"), "controller": true}]);
        }
        if self.finalizer {
            meta["finalizers"] = json!(["test.nodekeeper.io/kubelet"]);
        }
        create(
            c,
            well_known::pods(),
            &self.ns,
            json!({"metadata": meta, "spec": spec, "status": status}),
        )
    }
}

pub fn pdb(c: &TestCluster, name: &str, app: &str, spec: Value) {
    let mut s = spec;
    s["selector"] = json!({"matchLabels": {"app": app}});
    create(
        c,
        well_known::pdbs(),
        "default",
        json!({"metadata": {"name": name}, "spec": s}),
    );
}

/// Names (`ns/name`) of the pods bound to `node`.
pub fn pods_on(c: &TestCluster, node: &str) -> Vec<String> {
    c.sim
        .store
        .txn(|t| t.list(well_known::pods(), None))
        .into_iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
        .map(|p| {
            format!(
                "{}/{}",
                p["metadata"]["namespace"].as_str().unwrap(),
                p["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

pub fn unschedulable(c: &TestCluster, node: &str) -> bool {
    c.sim.store.get(well_known::nodes(), "", node).unwrap()["spec"]["unschedulable"] == json!(true)
}

/// The 110-pod node: 80 filler + 10 PDB-protected web pods, 6 DaemonSet pods, 4 critical pods,
/// 3 critical DaemonSet pods (103 to drain), plus 4 DaemonSet pods tolerating everything,
/// 2 mirror pods and 1 Succeeded pod (7 skipped). No PDB: add one with [`pdb`].
pub fn big_node(c: &TestCluster, n: &str) {
    node(c, n);
    for i in 0..80 {
        pod(&format!("filler-{n}-{i}"), "filler").on(c, n);
    }
    for i in 0..10 {
        pod(&format!("web-{n}-{i}"), "web").on(c, n);
    }
    for i in 0..6 {
        pod(&format!("logs-{n}-{i}"), "logs").ds("logs").on(c, n);
    }
    for i in 0..4 {
        pod(&format!("coredns-{n}-{i}"), "coredns")
            .critical()
            .on(c, n);
    }
    for i in 0..3 {
        pod(&format!("cni-{n}-{i}"), "cni")
            .ds("cni")
            .critical()
            .on(c, n);
    }
    for i in 0..4 {
        pod(&format!("exporter-{n}-{i}"), "exporter")
            .ds("exporter")
            .tolerate_all()
            .on(c, n);
    }
    for i in 0..2 {
        pod(&format!("static-{n}-{i}"), "static").mirror().on(c, n);
    }
    pod(&format!("job-{n}"), "job").phase("Succeeded").on(c, n);
}

/// A ReplicaSet stand-in: keeps `replicas` pods `app=<app>` (Running, Ready) by creating missing ones on `node`
/// every 50 ms. Abort the handle to stop it.
pub fn replicaset(
    c: &TestCluster,
    app: &str,
    replicas: usize,
    node: &str,
) -> tokio::task::JoinHandle<()> {
    let sim = c.sim.clone();
    let (app, node) = (app.to_string(), node.to_string());
    tokio::spawn(async move {
        let mut n = 0;
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let have = sim
                .store
                .txn(|t| t.list(well_known::pods(), Some("default")))
                .iter()
                .filter(|p| {
                    p["metadata"]["labels"]["app"] == json!(app)
                        && p["metadata"].get("deletionTimestamp").is_none()
                })
                .count();
            for _ in have..replicas {
                n += 1;
                let now = sim.store.clock.stamp();
                let pod = json!({"metadata": {"name": format!("{app}-new-{n}"), "labels": {"app": app}},
                    "spec": {"nodeName": node, "containers": [{"name": "main", "image": "sim/x:1"}]},
                    "status": running_status(&now)});
                let _ = sim
                    .store
                    .txn(|t| t.create(well_known::pods(), "default", pod));
            }
        }
    })
}
