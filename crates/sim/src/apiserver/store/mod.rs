//! The in-memory object store: objects as serialized JSON per resource ([`StoredObject`]), a global
//! resourceVersion, indexes and watch fan-out.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::clock::{fmt_time, parse_time, SimClock};
use super::error::{ApiError, ApiResult};
pub use super::object::{StoredObject, Summary};
use super::resources::{well_known, ResourceDef, RESOURCES};
use super::selectors::{FieldSelector, LabelSelector};

pub mod lifecycle;
mod txn;
mod watch;

pub use txn::Txn;
pub use watch::{EventType, WatchEvent, WatchFrom, WatchStart};

/// Object key inside a resource: (namespace or "", name).
pub type Key = (String, String);

#[derive(Debug, Default)]
struct Table {
    objects: BTreeMap<Key, Arc<StoredObject>>,
    /// resourceVersion of the last write to this resource.
    last_write: u64,
    /// Pods only: node name → pods bound to it.
    by_node: HashMap<String, BTreeSet<Key>>,
}

/// Store state behind the lock.
#[derive(Debug)]
pub struct Inner {
    rv: u64,
    tables: Vec<Table>,
    history: VecDeque<Arc<WatchEvent>>,
    compacted_rv: u64,
}

/// Tunables of the store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Number of events kept for watches that resume from a resourceVersion.
    pub history: usize,
    /// Capacity of the live fan-out channel (slower watchers are dropped and must resume).
    pub fanout: usize,
    /// Bound pods are deleted gracefully (a kubelet loop finishes them) instead of at once.
    pub graceful_pod_deletion: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            history: 20_000,
            fanout: 16_384,
            graceful_pod_deletion: false,
        }
    }
}

/// The object store shared by the HTTP handlers and the control loops.
#[derive(Debug)]
pub struct Store {
    inner: RwLock<Inner>,
    tx: broadcast::Sender<Arc<WatchEvent>>,
    /// Simulated clock used for timestamps.
    pub clock: Arc<SimClock>,
    opts: StoreOptions,
}

/// A filter for lists and watches.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Namespace, or all.
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether an object passes the selectors (namespace checked separately).
    pub fn matches(&self, obj: &Value) -> bool {
        self.fields.matches(obj) && self.labels.matches_object(obj)
    }

    /// Whether a stored object passes the selectors (namespace checked separately); parses it only
    /// when the field selector names a field that is not indexed.
    pub fn matches_stored(&self, obj: &StoredObject) -> bool {
        obj.matches(&self.labels, &self.fields)
    }

    /// Whether a stored object is in the filter's namespace (or the filter has none).
    pub fn in_namespace(&self, obj: &StoredObject) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| *obj.summary().namespace == *ns)
    }
}

/// One page of a list (parsed objects by default, [`StoredObject`]s from [`Store::list_stored`]).
#[derive(Debug)]
pub struct ListPage<T = Arc<Value>> {
    /// Matching objects.
    pub items: Vec<T>,
    /// Store resourceVersion at list time.
    pub rv: u64,
    /// Key to continue after, when the page was cut by `limit`.
    pub next: Option<Key>,
}

/// Options of a delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// Grace period override.
    pub grace_seconds: Option<i64>,
    /// Precondition on the uid.
    pub uid: Option<String>,
    /// Precondition on the resourceVersion.
    pub resource_version: Option<String>,
}

/// Which part of an object a write replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteTarget {
    /// The main resource (status is kept for kinds with a status subresource).
    Main,
    /// The `/status` subresource (only status changes).
    Status,
    /// Internal writes by the control loops (everything, no rules).
    Internal,
}

fn parsed(obj: &Arc<StoredObject>) -> Arc<Value> {
    Arc::new(obj.value())
}

fn rv_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

fn node_of(obj: &Value) -> Option<&str> {
    obj.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Top-level fields must have the right JSON type (a typed apiserver would fail to decode otherwise).
fn check_shape(obj: &Value) -> ApiResult<()> {
    for f in ["metadata", "spec", "status"] {
        if obj.get(f).is_some_and(|v| !v.is_object() && !v.is_null()) {
            return Err(ApiError::bad_request(format!(
                "invalid object: {f} must be an object"
            )));
        }
    }
    Ok(())
}

fn valid_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' || c == ':'
        })
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A random v4-style UUID.
pub fn new_uid() -> String {
    let b: [u8; 16] = rand::rng().random();
    let h = hex::encode(b);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// `generateName` prefixes are cut to this length (63 minus the 5 random characters).
const MAX_GENERATE_NAME_PREFIX: usize = 58;

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

impl Store {
    /// An empty store with the default namespaces.
    pub fn new(clock: Arc<SimClock>, opts: StoreOptions) -> Arc<Self> {
        let (tx, _) = broadcast::channel(opts.fanout.max(16));
        let inner = Inner {
            rv: 1,
            tables: RESOURCES.iter().map(|_| Table::default()).collect(),
            history: VecDeque::new(),
            compacted_rv: 0,
        };
        let store = Arc::new(Store {
            inner: RwLock::new(inner),
            tx,
            clock,
            opts,
        });
        store.txn(|t| {
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let obj = json!({"metadata": {"name": ns}});
                // Fresh store: these cannot collide.
                let _ = t.create(well_known::namespaces(), "", obj);
            }
        });
        store
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` under the write lock; all writes in it are atomic with respect to other requests.
    pub fn txn<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> R) -> R {
        let mut guard = self.write();
        let mut t = Txn {
            inner: &mut guard,
            store: self,
        };
        f(&mut t)
    }

    /// Current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.read().rv
    }

    /// One object.
    pub fn get(&self, res: &ResourceDef, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.get_stored(res, ns, name).as_ref().map(parsed)
    }

    /// One object as stored (serialized, with its summary).
    pub fn get_stored(&self, res: &ResourceDef, ns: &str, name: &str) -> Option<Arc<StoredObject>> {
        self.read().tables[res.index()]
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// resourceVersion of the last write to a resource (0 if none yet): a loop whose inputs did
    /// not change since its last pass can skip the pass.
    pub fn last_write(&self, res: &ResourceDef) -> u64 {
        self.read().tables[res.index()].last_write
    }

    /// The stored objects of a resource that pass `pred` (which sees only the summary), parsed.
    pub fn list_where(
        &self,
        res: &ResourceDef,
        pred: impl Fn(&Summary) -> bool,
    ) -> Vec<Arc<Value>> {
        let hits: Vec<Arc<StoredObject>> = self.read().tables[res.index()]
            .objects
            .values()
            .filter(|o| pred(o.summary()))
            .cloned()
            .collect();
        hits.iter().map(parsed).collect()
    }

    /// The summaries of all objects of a resource.
    pub fn summaries(&self, res: &ResourceDef) -> Vec<Arc<StoredObject>> {
        self.read().tables[res.index()]
            .objects
            .values()
            .cloned()
            .collect()
    }

    /// Number of objects of a resource.
    pub fn count(&self, res: &ResourceDef) -> usize {
        self.read().tables[res.index()].objects.len()
    }

    /// Lists objects, parsed (see [`Store::list_stored`]).
    pub fn list(
        &self,
        res: &ResourceDef,
        filter: &Filter,
        after: Option<&Key>,
        limit: Option<usize>,
    ) -> ListPage {
        let page = self.list_stored(res, filter, after, limit);
        ListPage {
            items: page.items.iter().map(parsed).collect(),
            rv: page.rv,
            next: page.next,
        }
    }

    /// Lists stored objects, using the pod-by-node index when the field selector pins `spec.nodeName`.
    pub fn list_stored(
        &self,
        res: &ResourceDef,
        filter: &Filter,
        after: Option<&Key>,
        limit: Option<usize>,
    ) -> ListPage<Arc<StoredObject>> {
        let inner = self.read();
        let table = &inner.tables[res.index()];
        let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut next = None;
        let mut push = |k: &Key, obj: &Arc<StoredObject>| -> bool {
            if items.len() >= limit {
                return false;
            }
            if filter.matches_stored(obj) {
                items.push(obj.clone());
                if items.len() == limit {
                    next = Some(k.clone());
                }
            }
            true
        };
        let node = filter
            .fields
            .equality("spec.nodeName")
            .filter(|n| !n.is_empty());
        if let (Some(node), true) = (node, res.lifecycle.indexed_by_node()) {
            let keys = table.by_node.get(node).into_iter().flatten();
            for k in keys.filter(|k| after.is_none_or(|a| *k > a)) {
                if filter.namespace.as_ref().is_some_and(|ns| *ns != k.0) {
                    continue;
                }
                if let Some(obj) = table.objects.get(k) {
                    if !push(k, obj) {
                        break;
                    }
                }
            }
        } else {
            let start = match (after, &filter.namespace) {
                (Some(a), _) => std::ops::Bound::Excluded(a.clone()),
                (None, Some(ns)) => std::ops::Bound::Included((ns.clone(), String::new())),
                (None, None) => std::ops::Bound::Unbounded,
            };
            for (k, obj) in table.objects.range((start, std::ops::Bound::Unbounded)) {
                if filter.namespace.as_ref().is_some_and(|ns| *ns != k.0) {
                    if filter.namespace.as_ref().is_some_and(|ns| k.0 > *ns) {
                        break;
                    }
                    continue;
                }
                if !push(k, obj) {
                    break;
                }
            }
        }
        // A full last page has no continuation.
        if next.is_some() && items.len() < limit {
            next = None;
        }
        ListPage {
            items,
            rv: inner.rv,
            next,
        }
    }

    /// Pods bound to a node.
    pub fn pods_on_node(&self, node: &str) -> Vec<Arc<Value>> {
        let hits: Vec<Arc<StoredObject>> = {
            let inner = self.read();
            let table = &inner.tables[well_known::pods().index()];
            table
                .by_node
                .get(node)
                .into_iter()
                .flatten()
                .filter_map(|k| table.objects.get(k).cloned())
                .collect()
        };
        hits.iter().map(parsed).collect()
    }

    /// Whether bound pods are deleted gracefully.
    pub fn graceful_pod_deletion(&self) -> bool {
        self.opts.graceful_pod_deletion
    }

    /// A dump of all objects, keyed by `apiVersion/plural`.
    pub fn dump(&self) -> Value {
        let inner = self.read();
        let mut out = serde_json::Map::new();
        for (r, t) in RESOURCES.iter().zip(&inner.tables) {
            if t.objects.is_empty() {
                continue;
            }
            let items: Vec<Value> = t.objects.values().map(|o| o.value()).collect();
            out.insert(
                format!("{}/{}", r.api_version(), r.plural),
                Value::Array(items),
            );
        }
        json!({"resourceVersion": inner.rv.to_string(), "objects": out})
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn store(graceful: bool) -> Arc<Store> {
        Store::new(
            Arc::new(SimClock::new(1.0)),
            StoreOptions {
                graceful_pod_deletion: graceful,
                ..Default::default()
            },
        )
    }

    fn pod(name: &str, node: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"app": "a"}}, "spec": {"nodeName": node, "containers": []}})
    }

    #[test]
    fn create_update_conflict_and_noop() {
        let s = store(false);
        let pods = well_known::pods();
        let p = s
            .txn(|t| t.create(pods, "default", pod("p1", "n1")))
            .unwrap();
        let rv1 = rv_of(&p);
        assert!(p["metadata"]["uid"].is_string());
        assert_eq!(p["status"]["phase"], "Pending");
        let same = s
            .txn(|t| t.update(pods, "default", "p1", (*p).clone(), WriteTarget::Main))
            .unwrap();
        assert_eq!(
            rv_of(&same),
            rv1,
            "no-op update must not bump the resourceVersion"
        );
        let mut changed = (*p).clone();
        changed["metadata"]["labels"]["x"] = json!("y");
        let p2 = s
            .txn(|t| t.update(pods, "default", "p1", changed.clone(), WriteTarget::Main))
            .unwrap();
        assert!(rv_of(&p2) > rv1);
        let err = s
            .txn(|t| t.update(pods, "default", "p1", changed, WriteTarget::Main))
            .unwrap_err();
        assert_eq!(err.code, 409);
        let dup = s
            .txn(|t| t.create(pods, "default", pod("p1", "n1")))
            .unwrap_err();
        assert_eq!(dup.reason, "AlreadyExists");
        let gen = s
            .txn(|t| {
                t.create(
                    pods,
                    "default",
                    json!({"metadata": {"generateName": "web-"}}),
                )
            })
            .unwrap();
        assert!(gen["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("web-"));
        // As the real apiserver: a prefix ending in '.' is not a valid name prefix (only '-' is).
        let dotted = s
            .txn(|t| {
                t.create(
                    pods,
                    "default",
                    json!({"metadata": {"generateName": "node-1."}}),
                )
            })
            .unwrap_err();
        assert_eq!((dotted.code, dotted.reason), (422, "Invalid"));
        assert!(
            dotted.message.contains("metadata.generateName"),
            "{}",
            dotted.message
        );
        let bad_ns = s
            .txn(|t| t.create(pods, "nope", pod("p9", "n1")))
            .unwrap_err();
        assert_eq!(bad_ns.code, 404);
        let bad_name = s
            .txn(|t| t.create(pods, "default", pod("Bad_Name", "n1")))
            .unwrap_err();
        assert_eq!(bad_name.code, 422);
    }

    #[test]
    fn status_subresource_rules() {
        let s = store(false);
        let nodes = well_known::nodes();
        let n = s
            .txn(|t| {
                t.create(
                    nodes,
                    "",
                    json!({"metadata": {"name": "n1"}, "status": {"phase": "A"}}),
                )
            })
            .unwrap();
        let mut w = (*n).clone();
        w["status"]["phase"] = json!("B");
        w["spec"] = json!({"unschedulable": true});
        let out = s
            .txn(|t| t.update(nodes, "", "n1", w.clone(), WriteTarget::Main))
            .unwrap();
        assert_eq!(out["status"]["phase"], "A");
        assert_eq!(out["spec"]["unschedulable"], true);
        w["metadata"]["resourceVersion"] = out["metadata"]["resourceVersion"].clone();
        w["spec"] = json!({});
        let out = s
            .txn(|t| t.update(nodes, "", "n1", w, WriteTarget::Status))
            .unwrap();
        assert_eq!(out["status"]["phase"], "B");
        assert_eq!(out["spec"]["unschedulable"], true);
    }

    #[test]
    fn pod_index_list_and_pagination() {
        let s = store(false);
        let pods = well_known::pods();
        s.txn(|t| {
            for i in 0..10 {
                t.create(
                    pods,
                    "default",
                    pod(&format!("p{i}"), if i % 2 == 0 { "even" } else { "odd" }),
                )
                .unwrap();
            }
        });
        let f = Filter {
            fields: FieldSelector::parse("spec.nodeName=even", "Pod").unwrap(),
            ..Default::default()
        };
        assert_eq!(s.list(pods, &f, None, None).items.len(), 5);
        let page = s.list(pods, &Filter::default(), None, Some(4));
        assert_eq!(page.items.len(), 4);
        let next = page.next.clone().unwrap();
        let page2 = s.list(pods, &Filter::default(), Some(&next), Some(4));
        assert_eq!(page2.items[0]["metadata"]["name"], "p4");
        let page3 = s.list(pods, &Filter::default(), page2.next.as_ref(), Some(4));
        assert_eq!(page3.items.len(), 2);
        assert!(page3.next.is_none());
        // Moving a pod updates the index.
        s.txn(|t| {
            t.modify(pods, "default", "p0", WriteTarget::Internal, |p| {
                let mut p = p.clone();
                p["spec"]["nodeName"] = json!("odd");
                Ok(p)
            })
        })
        .unwrap();
        assert_eq!(s.pods_on_node("even").len(), 4);
        assert_eq!(s.pods_on_node("odd").len(), 6);
    }

    #[test]
    fn finalizers_and_graceful_deletion() {
        let s = store(true);
        let pods = well_known::pods();
        s.txn(|t| t.create(pods, "default", pod("p1", "n1")))
            .unwrap();
        let d = s
            .txn(|t| {
                t.delete(
                    pods,
                    "default",
                    "p1",
                    &DeleteOptions {
                        grace_seconds: Some(0),
                        ..Default::default()
                    },
                )
            })
            .unwrap();
        assert_eq!(d["metadata"]["name"], "p1");
        assert!(
            s.get(pods, "default", "p1").is_none(),
            "grace 0 deletes at once"
        );
        s.txn(|t| t.create(pods, "default", pod("p2", "n1")))
            .unwrap();
        let d = s
            .txn(|t| t.delete(pods, "default", "p2", &DeleteOptions::default()))
            .unwrap();
        assert!(d["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 30);
        assert!(s.get(pods, "default", "p2").is_some());
        assert_eq!(s.txn(|t| t.reap_terminated_pods(|_| true)), 0);
        s.clock.advance(std::time::Duration::from_secs(31));
        assert_eq!(s.txn(|t| t.reap_terminated_pods(|_| true)), 1);
        let nodes = well_known::nodes();
        s.txn(|t| {
            t.create(
                nodes,
                "",
                json!({"metadata": {"name": "n1", "finalizers": ["keep"]}}),
            )
        })
        .unwrap();
        let n = s
            .txn(|t| t.delete(nodes, "", "n1", &DeleteOptions::default()))
            .unwrap();
        assert!(n["metadata"]["deletionTimestamp"].is_string());
        let mut cleared = (*n).clone();
        cleared["metadata"]["finalizers"] = json!([]);
        s.txn(|t| t.update(nodes, "", "n1", cleared, WriteTarget::Main))
            .unwrap();
        assert!(
            s.get(nodes, "", "n1").is_none(),
            "removing the last finalizer completes deletion"
        );
    }

    #[test]
    fn watch_backlog_and_gone() {
        let s = store(false);
        let nodes = well_known::nodes();
        let rv0 = s.resource_version();
        s.txn(|t| t.create(nodes, "", json!({"metadata": {"name": "a"}})))
            .unwrap();
        s.txn(|t| t.create(nodes, "", json!({"metadata": {"name": "b"}})))
            .unwrap();
        let (backlog, _rx, _) = s
            .watch(nodes, &Filter::default(), WatchFrom::After(rv0))
            .unwrap();
        assert_eq!(backlog.len(), 2);
        let (cur, _rx, _) = s
            .watch(nodes, &Filter::default(), WatchFrom::Current)
            .unwrap();
        assert_eq!(cur.len(), 2);
        s.compact();
        assert_eq!(
            s.watch(nodes, &Filter::default(), WatchFrom::After(rv0))
                .unwrap_err()
                .code,
            410
        );
    }
}
