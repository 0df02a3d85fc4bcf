//! Scenarios: node pools, workloads, PDBs and DaemonSets seeded into the store (TOML, `--scenario FILE`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::resources::well_known;
use super::{Sim, SimError};

/// Errors of loading or seeding a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not a valid scenario.
    #[error("invalid scenario {path}: {source}")]
    Parse {
        /// File.
        path: PathBuf,
        /// Cause.
        source: Box<toml::de::Error>,
    },
    /// An object could not be created.
    #[error("scenario object {what}: {message}")]
    Seed {
        /// Which object.
        what: String,
        /// API error message.
        message: String,
    },
}

/// A taint on a pool's nodes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value.
    #[serde(default)]
    pub value: String,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: String,
}

/// A node pool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    /// Pool name (node names are `<pool>-<n>`; label `karpenter.sh/nodepool`).
    pub name: String,
    /// Number of nodes.
    pub count: usize,
    /// Extra node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// CPU capacity (Kubernetes quantity).
    #[serde(default = "default_cpu")]
    pub cpu: String,
    /// Memory capacity.
    #[serde(default = "default_memory")]
    pub memory: String,
    /// Pod capacity.
    #[serde(default = "default_pods")]
    pub pods: u32,
    /// `karpenter.sh/capacity-type` (on-demand or spot).
    #[serde(default = "default_capacity_type")]
    pub capacity_type: String,
    /// Instance type label.
    #[serde(default = "default_instance_type")]
    pub instance_type: String,
}

fn default_cpu() -> String {
    "4".into()
}
fn default_memory() -> String {
    "16Gi".into()
}
fn default_pods() -> u32 {
    110
}
fn default_capacity_type() -> String {
    "on-demand".into()
}
fn default_instance_type() -> String {
    "sim.large".into()
}

/// A PDB attached to a workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PdbSpec {
    /// minAvailable (int or "N%").
    #[serde(default)]
    pub min_available: Option<toml::Value>,
    /// maxUnavailable (int or "N%").
    #[serde(default)]
    pub max_unavailable: Option<toml::Value>,
}

/// A Deployment (or bare ReplicaSet) workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Name (label `app=<name>`).
    pub name: String,
    /// Namespace (created when missing).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Replicas.
    pub replicas: u32,
    /// `Deployment` (default) or `ReplicaSet`.
    #[serde(default = "default_kind")]
    pub kind: String,
    /// nodeSelector.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerate every taint.
    #[serde(default)]
    pub tolerate_all: bool,
    /// Tolerate the taints with these keys (operator `Exists`, effect `NoSchedule`), e.g. a
    /// spot pool's: unlike `tolerate_all`, such pods are drained (they do not tolerate the
    /// drain taint).
    #[serde(default)]
    pub tolerate: Vec<String>,
    /// CPU request per pod.
    #[serde(default = "default_request")]
    pub cpu_request: String,
    /// terminationGracePeriodSeconds.
    #[serde(default = "default_grace")]
    pub termination_grace_seconds: i64,
    /// Optional PDB over the workload's pods.
    #[serde(default)]
    pub pdb: Option<PdbSpec>,
}

fn default_namespace() -> String {
    "default".into()
}
fn default_kind() -> String {
    "Deployment".into()
}
fn default_request() -> String {
    "100m".into()
}
fn default_grace() -> i64 {
    30
}

/// A DaemonSet.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DaemonSetSpec {
    /// Name.
    pub name: String,
    /// Namespace.
    #[serde(default = "default_ds_namespace")]
    pub namespace: String,
    /// Tolerate every taint (default true, like most node agents).
    #[serde(default = "default_true")]
    pub tolerate_all: bool,
    /// nodeSelector.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
}

fn default_ds_namespace() -> String {
    "kube-system".into()
}
fn default_true() -> bool {
    true
}

/// A whole scenario.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Node pools.
    #[serde(default)]
    pub pools: Vec<Pool>,
    /// Workloads.
    #[serde(default)]
    pub workloads: Vec<Workload>,
    /// DaemonSets.
    #[serde(default)]
    pub daemonsets: Vec<DaemonSetSpec>,
    /// Scale mode: pods created directly (Running, Ready) per node, owned by one ReplicaSet.
    #[serde(default)]
    pub filler_pods_per_node: usize,
}

impl Scenario {
    /// Nothing.
    pub fn empty() -> Self {
        Scenario::default()
    }

    /// Reads a TOML scenario.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ScenarioError::Parse {
            path: path.into(),
            source: Box::new(source),
        })
    }

    /// A small mixed cluster: on-demand and spot pools, a web Deployment with a PDB, a DaemonSet.
    pub fn default_mixed() -> Self {
        let pool = |name: &str, count, ct: &str| Pool {
            name: name.into(),
            count,
            labels: BTreeMap::new(),
            taints: vec![],
            cpu: default_cpu(),
            memory: default_memory(),
            pods: default_pods(),
            capacity_type: ct.into(),
            instance_type: default_instance_type(),
        };
        Scenario {
            pools: vec![pool("general", 3, "on-demand"), pool("spot", 2, "spot")],
            workloads: vec![Workload {
                name: "web".into(),
                namespace: "default".into(),
                replicas: 4,
                kind: "Deployment".into(),
                node_selector: BTreeMap::new(),
                tolerate_all: false,
                tolerate: Vec::new(),
                cpu_request: default_request(),
                termination_grace_seconds: 5,
                pdb: Some(PdbSpec {
                    min_available: None,
                    max_unavailable: Some(toml::Value::Integer(1)),
                }),
            }],
            daemonsets: vec![DaemonSetSpec {
                name: "node-exporter".into(),
                namespace: "kube-system".into(),
                tolerate_all: true,
                node_selector: BTreeMap::new(),
            }],
            filler_pods_per_node: 0,
        }
    }

    /// `--nodes N --pods-per-node M`: one pool of N nodes and M filler pods per node.
    pub fn scale(nodes: usize, pods_per_node: usize) -> Self {
        let mut s = Scenario::default_mixed();
        s.pools.truncate(1);
        s.pools[0].name = "scale".into();
        s.pools[0].count = nodes;
        s.pools[0].pods = u32::try_from(pods_per_node.max(110)).unwrap_or(u32::MAX);
        s.workloads.clear();
        s.daemonsets.clear();
        s.filler_pods_per_node = pods_per_node;
        s
    }
}

/// The Node object of a pool member (Ready, with capacity and pool labels).
pub fn node_object(pool: &Pool, name: &str, now: &str) -> Value {
    let mut labels: BTreeMap<String, String> = pool.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), name.into());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("karpenter.sh/nodepool".into(), pool.name.clone());
    labels.insert(
        "karpenter.sh/capacity-type".into(),
        pool.capacity_type.clone(),
    );
    labels.insert(
        "node.kubernetes.io/instance-type".into(),
        pool.instance_type.clone(),
    );
    let capacity = json!({"cpu": pool.cpu, "memory": pool.memory, "pods": pool.pods.to_string()});
    let cond = |t: &str, s: &str, r: &str| {
        json!({"type": t, "status": s, "reason": r, "message": "",
        "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({"metadata": {"name": name, "labels": labels},
        "spec": {"providerID": format!("sim:///{name}"), "taints": pool.taints},
        "status": {"capacity": capacity, "allocatable": capacity,
            "conditions": [cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                cond("Ready", "True", "KubeletReady")],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.33.0-sim", "containerRuntimeVersion": "cri-o://1.33.0",
                "osImage": "nodekeeper sim", "kernelVersion": "6.1.0", "operatingSystem": "linux",
                "architecture": "amd64", "machineID": "", "systemUUID": "", "bootID": "",
                "kubeProxyVersion": ""}}})
}

/// The NodeClaim of a pool member.
pub fn nodeclaim_object(pool: &Pool, node: &str) -> Value {
    json!({"metadata": {"name": node, "labels": {"karpenter.sh/nodepool": pool.name},
            "finalizers": [super::loops::provisioner::FINALIZER]},
        "spec": {"nodeClassRef": {"group": "sim.nodekeeper.dev", "kind": "SimNodeClass", "name": "default"},
                 "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": [pool.capacity_type]}]},
        "status": {"nodeName": node, "providerID": format!("sim:///{node}"),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "Ready"}]}})
}

fn toleration_all() -> Value {
    json!([{"operator": "Exists"}])
}

/// The pod template of a workload.
pub fn pod_template(
    app: &str,
    node_selector: &BTreeMap<String, String>,
    tolerate_all: bool,
    cpu: &str,
    grace: i64,
) -> Value {
    pod_template_tolerating(app, node_selector, tolerate_all, &[], cpu, grace)
}

/// [`pod_template`] that also tolerates the taints keyed `tolerate` (NoSchedule).
pub fn pod_template_tolerating(
    app: &str,
    node_selector: &BTreeMap<String, String>,
    tolerate_all: bool,
    tolerate: &[String],
    cpu: &str,
    grace: i64,
) -> Value {
    let mut spec = json!({"containers": [{"name": "main", "image": format!("sim/{app}:1"),
        "resources": {"requests": {"cpu": cpu}}}], "terminationGracePeriodSeconds": grace});
    if !node_selector.is_empty() {
        spec["nodeSelector"] = json!(node_selector);
    }
    if tolerate_all {
        spec["tolerations"] = toleration_all();
    } else if !tolerate.is_empty() {
        let keyed: Vec<Value> = tolerate
            .iter()
            .map(|k| json!({"key": k, "operator": "Exists", "effect": "NoSchedule"}))
            .collect();
        spec["tolerations"] = json!(keyed);
    }
    json!({"metadata": {"labels": {"app": app}}, "spec": spec})
}

fn int_or_str(v: &toml::Value) -> Value {
    match v {
        toml::Value::Integer(i) => json!(i),
        other => json!(other
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| other.to_string())),
    }
}

/// `plural/name` of an object, for errors.
fn describe(res: &super::resources::ResourceDef, obj: &Value) -> String {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str);
    format!("{}/{}", res.plural, name.unwrap_or("?"))
}

fn create(
    sim: &Sim,
    res: &'static super::resources::ResourceDef,
    ns: &str,
    obj: Value,
) -> Result<Value, ScenarioError> {
    let what = describe(res, &obj);
    sim.store
        .txn(|t| t.create(res, ns, obj))
        .map(|o| (*o).clone())
        .map_err(|e| ScenarioError::Seed {
            what,
            message: e.message,
        })
}

/// Seeds an object exported from a real cluster as it is (uid, creation time and generation kept),
/// creating their namespaces first.
pub fn restore(
    sim: &Sim,
    res: &'static super::resources::ResourceDef,
    obj: Value,
) -> Result<(), ScenarioError> {
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if res.namespaced {
        ensure_namespace(sim, if ns.is_empty() { "default" } else { &ns })?;
    }
    let what = describe(res, &obj);
    sim.store
        .txn(|t| t.restore(res, &ns, obj))
        .map(|_| ())
        .map_err(|e| ScenarioError::Seed {
            what,
            message: e.message,
        })
}

/// Makes sure a namespace exists.
pub fn ensure_namespace(sim: &Sim, ns: &str) -> Result<(), ScenarioError> {
    if sim.store.get(well_known::namespaces(), "", ns).is_none() {
        create(
            sim,
            well_known::namespaces(),
            "",
            json!({"metadata": {"name": ns}}),
        )?;
    }
    Ok(())
}

/// One object of a scenario: its resource, namespace ("" for cluster-scoped) and body.
pub type SeedObject = (&'static super::resources::ResourceDef, String, Value);

/// The objects of a scenario in creation order: namespaces, the pools' Nodes (Ready, with
/// capacity; with `nodeclaims`, a NodeClaim each), then each workload (Deployment or ReplicaSet)
/// and its PDB, then the DaemonSets. The sim seeds them into its store; `nodekeeper demo
/// --kubeconfig` creates them on a real API server (there KWOK plays the kubelets).
pub fn objects(sc: &Scenario, now: &str, nodeclaims: bool) -> Vec<SeedObject> {
    let mut out: Vec<SeedObject> = Vec::new();
    let mut namespaces: Vec<&str> = Vec::new();
    for ns in sc
        .workloads
        .iter()
        .map(|w| w.namespace.as_str())
        .chain(sc.daemonsets.iter().map(|d| d.namespace.as_str()))
    {
        if !namespaces.contains(&ns) {
            namespaces.push(ns);
            out.push((
                well_known::namespaces(),
                String::new(),
                json!({"metadata": {"name": ns}}),
            ));
        }
    }
    for pool in &sc.pools {
        for i in 0..pool.count {
            let name = format!("{}-{i}", pool.name);
            out.push((
                well_known::nodes(),
                String::new(),
                node_object(pool, &name, now),
            ));
            if nodeclaims {
                out.push((
                    well_known::nodeclaims(),
                    String::new(),
                    nodeclaim_object(pool, &name),
                ));
            }
        }
    }
    for w in &sc.workloads {
        let template = pod_template_tolerating(
            &w.name,
            &w.node_selector,
            w.tolerate_all,
            &w.tolerate,
            &w.cpu_request,
            w.termination_grace_seconds,
        );
        let res = if w.kind == "ReplicaSet" {
            well_known::replicasets()
        } else {
            well_known::deployments()
        };
        out.push((
            res,
            w.namespace.clone(),
            json!({"metadata": {"name": w.name, "labels": {"app": w.name}},
            "spec": {"replicas": w.replicas, "selector": {"matchLabels": {"app": w.name}}, "template": template}}),
        ));
        if let Some(p) = &w.pdb {
            let mut spec = json!({"selector": {"matchLabels": {"app": w.name}}});
            if let Some(v) = &p.min_available {
                spec["minAvailable"] = int_or_str(v);
            }
            if let Some(v) = &p.max_unavailable {
                spec["maxUnavailable"] = int_or_str(v);
            }
            out.push((
                well_known::pdbs(),
                w.namespace.clone(),
                json!({"metadata": {"name": format!("{}-pdb", w.name)}, "spec": spec}),
            ));
        }
    }
    for d in &sc.daemonsets {
        let template = pod_template(&d.name, &d.node_selector, d.tolerate_all, "10m", 5);
        out.push((
            well_known::daemonsets(),
            d.namespace.clone(),
            json!({"metadata": {"name": d.name, "labels": {"app": d.name}},
            "spec": {"selector": {"matchLabels": {"app": d.name}}, "template": template}}),
        ));
    }
    out
}

/// Seeds the scenario of `sim.opts` into the store.
pub fn seed(sim: &Sim) -> Result<(), SimError> {
    let sc = sim.opts.scenario.clone();
    let now = sim.store.clock.stamp();
    for (res, ns, obj) in objects(&sc, &now, sim.opts.loops.provisioner) {
        if res.kind == "Namespace" {
            let name = obj.pointer("/metadata/name").and_then(Value::as_str);
            ensure_namespace(sim, name.unwrap_or_default())?;
        } else {
            create(sim, res, &ns, obj)?;
        }
    }
    seed_filler(sim, &sc)?;
    Ok(())
}

/// Scale mode: Running, Ready pods bound to every node, owned by one ReplicaSet.
fn seed_filler(sim: &Sim, sc: &Scenario) -> Result<(), SimError> {
    if sc.filler_pods_per_node == 0 {
        return Ok(());
    }
    let nodes: Vec<String> = sc
        .pools
        .iter()
        .flat_map(|p| (0..p.count).map(move |i| format!("{}-{i}", p.name)))
        .collect();
    let total = nodes.len() * sc.filler_pods_per_node;
    let template = pod_template("filler", &BTreeMap::new(), false, "10m", 30);
    let rs = create(
        sim,
        well_known::replicasets(),
        "default",
        json!({"metadata": {"name": "filler", "labels": {"app": "filler"}},
        "spec": {"replicas": total, "selector": {"matchLabels": {"app": "filler"}}, "template": template}}),
    )?;
    let owner = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "filler",
        "uid": rs["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]);
    let now = sim.store.clock.stamp();
    sim.store.txn(|t| -> Result<(), SimError> {
        for node in &nodes {
            for j in 0..sc.filler_pods_per_node {
                let mut pod = template.clone();
                pod["metadata"]["name"] = json!(format!("filler-{node}-{j}"));
                pod["metadata"]["ownerReferences"] = owner.clone();
                pod["spec"]["nodeName"] = json!(node);
                pod["status"] = running_status(&now);
                t.create(well_known::pods(), "default", pod)
                    .map_err(|e| ScenarioError::Seed {
                        what: format!("pod filler-{node}-{j}"),
                        message: e.message,
                    })?;
            }
        }
        Ok(())
    })?;
    Ok(())
}

/// The status of a Running, Ready pod.
pub fn running_status(now: &str) -> Value {
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    json!({"phase": "Running", "startTime": now, "podIP": "10.0.0.1",
        "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")]})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_scenario_file() {
        let text = r#"
            [[pools]]
            name = "gpu"
            count = 2
            capacity_type = "spot"
            taints = [{ key = "gpu", value = "true", effect = "NoSchedule" }]
            labels = { "example.com/tier" = "gpu" }

            [[workloads]]
            name = "train"
            replicas = 2
            tolerate_all = true
            node_selector = { "example.com/tier" = "gpu" }
            pdb = { min_available = "50%" }

            [[daemonsets]]
            name = "agent"
        "#;
        let s: Scenario = toml::from_str(text).unwrap();
        assert_eq!(s.pools[0].taints[0].effect, "NoSchedule");
        assert_eq!(s.workloads[0].kind, "Deployment");
        assert_eq!(
            int_or_str(
                s.workloads[0]
                    .pdb
                    .as_ref()
                    .unwrap()
                    .min_available
                    .as_ref()
                    .unwrap()
            ),
            json!("50%")
        );
        assert_eq!(s.daemonsets[0].namespace, "kube-system");
        assert!(toml::from_str::<Scenario>("[[pools]]\nname='x'\ncount=1\nbogus=1\n").is_err());
        let n = node_object(&s.pools[0], "gpu-0", "2026-01-01T00:00:00Z");
        assert_eq!(
            n["metadata"]["labels"]["karpenter.sh/capacity-type"],
            "spot"
        );
        assert_eq!(n["spec"]["taints"][0]["key"], "gpu");
    }
}
