//! A snapshot of a real cluster, as `kubectl get nodes,pods,pdb -A -o json` (or `-o yaml`)
//! exports it: one or more `List`s (JSON values one after the other, or YAML documents) whose
//! items are Nodes, Pods and PodDisruptionBudgets. Parsed and checked purely; every error names
//! the file and the line (syntax) or the list and item (content).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::Deserialize;
use serde_json::Value;

/// Errors of reading or checking a snapshot (all exit 2).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be read.
    #[error("cannot read snapshot {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Not JSON / YAML.
    #[error("{path}:{line}:{column}: invalid {format}: {message}")]
    Syntax {
        /// File.
        path: PathBuf,
        /// `JSON` or `YAML`.
        format: &'static str,
        /// Line (1-based).
        line: usize,
        /// Column (1-based).
        column: usize,
        /// Parser message.
        message: String,
    },
    /// Valid syntax, wrong content.
    #[error("{path}: {at}: {message}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// Where: `list 1`, `list 1 item 3 (Pod default/web-0)`.
        at: String,
        /// What is wrong.
        message: String,
    },
}

/// The objects of a snapshot, as exported (JSON, checked against the k8s-openapi types).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Nodes.
    pub nodes: Vec<Value>,
    /// Pods.
    pub pods: Vec<Value>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<Value>,
    /// Pods left out of the replay: bound to a Node the snapshot does not hold (a node deleted while
    /// the export ran; the pod garbage collector removes such pods), as `namespace/name`.
    pub left_out: Vec<String>,
}

/// The kinds a snapshot may hold.
pub const KINDS: [&str; 3] = ["Node", "Pod", "PodDisruptionBudget"];

impl Snapshot {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Snapshot, SnapshotError> {
        let text = std::fs::read_to_string(path).map_err(|source| SnapshotError::Read {
            path: path.into(),
            source,
        })?;
        Snapshot::parse(path, &text)
    }

    /// Parses `text` (JSON when it starts with `{` or `[`, YAML otherwise).
    pub fn parse(path: &Path, text: &str) -> Result<Snapshot, SnapshotError> {
        let docs = documents(path, text)?;
        let invalid = |at: String, message: String| SnapshotError::Invalid {
            path: path.into(),
            at,
            message,
        };
        if docs.is_empty() {
            return Err(invalid(
                "file".into(),
                "no List in the file (expected the output of `kubectl get nodes,pods,pdb -A -o json`)"
                    .into(),
            ));
        }
        let mut s = Snapshot::default();
        let mut seen = BTreeSet::new();
        for (li, doc) in docs.iter().enumerate() {
            let list_at = format!("list {}", li + 1);
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
            if !kind.ends_with("List") {
                let what = if kind.is_empty() {
                    "no kind".to_string()
                } else {
                    format!("kind {kind}")
                };
                return Err(invalid(
                    list_at,
                    format!("{what}: expected a List (`kubectl get nodes,pods,pdb -A -o json`)"),
                ));
            }
            // An API list (NodeList) names its items' kind only in its own.
            let implied = kind.strip_suffix("List").filter(|k| !k.is_empty());
            let items = match doc.get("items") {
                Some(Value::Array(a)) => a,
                Some(Value::Null) | None => continue,
                Some(_) => return Err(invalid(list_at, "items is not an array".into())),
            };
            for (ii, item) in items.iter().enumerate() {
                let kind = item
                    .get("kind")
                    .and_then(Value::as_str)
                    .or(implied)
                    .unwrap_or_default();
                let ns = item
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let name = item
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let id = if ns.is_empty() {
                    format!("{kind} {name}")
                } else {
                    format!("{kind} {ns}/{name}")
                };
                let at = format!("{list_at} item {} ({})", ii + 1, id.trim());
                if name.is_empty() {
                    return Err(invalid(at, "metadata.name is missing".into()));
                }
                let mut item = item.clone();
                if item.get("kind").is_none() {
                    item["kind"] = Value::String(kind.to_string());
                }
                let checked = match kind {
                    "Node" => typed::<Node>(&item).map(|_| &mut s.nodes),
                    "Pod" => typed::<Pod>(&item).map(|_| &mut s.pods),
                    "PodDisruptionBudget" => {
                        typed::<PodDisruptionBudget>(&item).map(|_| &mut s.pdbs)
                    }
                    "" => Err("the item has no kind".into()),
                    other => Err(format!(
                        "kind {other} is not replayed (a snapshot holds {})",
                        KINDS.join(", ")
                    )),
                };
                let target = checked.map_err(|m| invalid(at.clone(), m))?;
                if !seen.insert(id.clone()) {
                    return Err(invalid(at, format!("{id} appears twice")));
                }
                target.push(item);
            }
        }
        let nodes: BTreeSet<String> = s
            .nodes
            .iter()
            .filter_map(name_of)
            .map(str::to_string)
            .collect();
        let orphan = |p: &Value| {
            p.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty() && !nodes.contains(*n))
                .map(str::to_string)
        };
        let bound = s
            .pods
            .iter()
            .filter(|p| p.pointer("/spec/nodeName").is_some())
            .count();
        let orphans: Vec<(usize, String)> = s
            .pods
            .iter()
            .enumerate()
            .filter_map(|(i, p)| orphan(p).map(|n| (i, n)))
            .collect();
        // Every bound pod on a node the snapshot lacks: nodes and pods were not exported together.
        if let Some((i, n)) = orphans.first().filter(|_| orphans.len() == bound) {
            return Err(invalid(
                format!("Pod {}", key_of(&s.pods[*i])),
                format!(
                    "spec.nodeName {n:?} is not a Node of the snapshot (pod {} of {}); export nodes and pods together",
                    i + 1,
                    s.pods.len()
                ),
            ));
        }
        // A few: pods of nodes deleted while the export ran (the pod garbage collector removes them).
        if !orphans.is_empty() {
            let gone: BTreeSet<usize> = orphans.iter().map(|(i, _)| *i).collect();
            let mut kept = Vec::with_capacity(s.pods.len() - gone.len());
            for (i, p) in std::mem::take(&mut s.pods).into_iter().enumerate() {
                if gone.contains(&i) {
                    s.left_out.push(key_of(&p));
                } else {
                    kept.push(p);
                }
            }
            s.pods = kept;
        }
        if s.nodes.is_empty() {
            return Err(invalid(
                "file".into(),
                "no Node in the snapshot (export with `kubectl get nodes,pods,pdb -A -o json`)"
                    .into(),
            ));
        }
        Ok(s)
    }
}

/// `metadata.name`.
pub fn name_of(v: &Value) -> Option<&str> {
    v.pointer("/metadata/name").and_then(Value::as_str)
}

/// `namespace/name` (or `name`).
pub fn key_of(v: &Value) -> String {
    let name = name_of(v).unwrap_or_default();
    match v.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, String> {
    serde_json::from_value(v.clone()).map_err(|e| format!("not a valid {}: {e}", kind_name(v)))
}

fn kind_name(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("object")
}

/// The top-level values: a JSON stream, or YAML documents (empty ones dropped).
fn documents(path: &Path, text: &str) -> Result<Vec<Value>, SnapshotError> {
    let syntax = |format, line, column, message| SnapshotError::Syntax {
        path: path.into(),
        format,
        line,
        column,
        message,
    };
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut out = Vec::new();
        for v in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
            match v {
                Ok(Value::Array(a)) => out.extend(a),
                Ok(v) => out.push(v),
                Err(e) => return Err(syntax("JSON", e.line(), e.column(), e.to_string())),
            }
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    for d in serde_yaml::Deserializer::from_str(text) {
        match Value::deserialize(d) {
            Ok(Value::Null) => {}
            Ok(v) => out.push(v),
            Err(e) => {
                let (line, column) = e
                    .location()
                    .map(|l| (l.line(), l.column()))
                    .unwrap_or((0, 0));
                return Err(syntax("YAML", line, column, e.to_string()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Snapshot, String> {
        Snapshot::parse(Path::new("snap.json"), text).map_err(|e| e.to_string())
    }

    const NODE: &str = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n-0"}}"#;

    fn pod(node: &str) -> String {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p","namespace":"default"}},"spec":{{"nodeName":"{node}","containers":[{{"name":"c"}}]}}}}"#
        )
    }

    fn list(items: &[&str]) -> String {
        format!(
            r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
            items.join(",")
        )
    }

    #[test]
    fn reads_lists_json_stream_and_yaml() {
        let p = pod("n-0");
        let s = parse(&list(&[NODE, &p])).unwrap();
        assert_eq!((s.nodes.len(), s.pods.len()), (1, 1));
        // Two lists one after the other (`kubectl get nodes -o json; kubectl get pods -A -o json`).
        let two = format!("{}\n{}", list(&[NODE]), list(&[&p]));
        assert_eq!(parse(&two).unwrap().pods.len(), 1);
        // YAML, two documents; a NodeList's items carry no kind.
        let yaml = "kind: NodeList\nitems:\n- metadata: {name: n-0}\n---\nkind: List\nitems:\n- kind: PodDisruptionBudget\n  apiVersion: policy/v1\n  metadata: {name: b, namespace: default}\n  spec: {minAvailable: 1}\n";
        let s = Snapshot::parse(Path::new("s.yaml"), yaml).unwrap();
        assert_eq!((s.nodes.len(), s.pdbs.len()), (1, 1));
        assert_eq!(s.nodes[0]["kind"], "Node");
    }

    #[test]
    fn errors_name_file_line_and_item() {
        let e = parse("{\"kind\": \"List\",\n \"items\": [}\n").unwrap_err();
        assert!(e.starts_with("snap.json:2:"), "{e}");
        let e = parse(NODE).unwrap_err();
        assert!(
            e.contains("list 1") && e.contains("kind Node: expected a List"),
            "{e}"
        );
        let svc = r#"{"kind":"Service","metadata":{"name":"s","namespace":"default"}}"#;
        let e = parse(&list(&[NODE, svc])).unwrap_err();
        assert!(
            e.contains("list 1 item 2 (Service default/s)") && e.contains("not replayed"),
            "{e}"
        );
        let e = parse(&list(&[NODE, &pod("n-9")])).unwrap_err();
        assert!(e.contains("Pod default/p") && e.contains("\"n-9\""), "{e}");
        let bad = r#"{"kind":"Node","metadata":{"name":"n-1"},"spec":{"unschedulable":"yes"}}"#;
        let e = parse(&list(&[bad])).unwrap_err();
        assert!(e.contains("item 1 (Node n-1): not a valid Node"), "{e}");
        let e = parse(&list(&[NODE, NODE])).unwrap_err();
        assert!(e.contains("appears twice"), "{e}");
        let e = Snapshot::parse(Path::new("s.yaml"), "kind: List\nitems: [\n").unwrap_err();
        assert!(e.to_string().starts_with("s.yaml:"), "{e}");
    }
}
