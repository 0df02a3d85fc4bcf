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

/// Object key inside a resource: (namespace or "", name).
pub type Key = (String, String);

/// Kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created (or entered a selector).
    Added,
    /// Object changed.
    Modified,
    /// Object removed (or left a selector).
    Deleted,
}

impl EventType {
    /// Wire name (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as fanned out to watchers and kept in the history ring.
#[derive(Debug)]
pub struct WatchEvent {
    /// Index of the resource in [`RESOURCES`].
    pub res: usize,
    /// What happened.
    pub kind: EventType,
    /// resourceVersion of the change.
    pub rv: u64,
    /// The object after the change (the last state for deletions).
    pub object: Arc<StoredObject>,
    /// The object before the change, if any.
    pub prev: Option<Arc<StoredObject>>,
}

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

/// The start of a watch: backlog to send first, live receiver, resourceVersion at subscription.
pub type WatchStart = (
    Vec<Arc<WatchEvent>>,
    broadcast::Receiver<Arc<WatchEvent>>,
    u64,
);

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

/// Where a watch starts.
#[derive(Debug, Clone, Copy)]
pub enum WatchFrom {
    /// Synthetic ADDED events for all current objects, then live.
    Current,
    /// Events after this resourceVersion.
    After(u64),
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
        if let (Some(node), true) = (node, std::ptr::eq(res, well_known::pods())) {
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

    /// Starts a watch: returns the backlog to send first and the live receiver (no gap, no duplicate).
    pub fn watch(
        &self,
        res: &ResourceDef,
        filter: &Filter,
        from: WatchFrom,
    ) -> ApiResult<WatchStart> {
        let inner = self.read();
        let rx = self.tx.subscribe();
        let idx = res.index();
        let backlog = match from {
            WatchFrom::After(rv) => {
                if rv < inner.compacted_rv {
                    return Err(ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        inner.compacted_rv
                    )));
                }
                inner
                    .history
                    .iter()
                    .filter(|e| e.res == idx && e.rv > rv)
                    .cloned()
                    .collect()
            }
            WatchFrom::Current => inner.tables[idx]
                .objects
                .iter()
                .filter(|(k, _)| filter.namespace.as_ref().is_none_or(|ns| *ns == k.0))
                .map(|(_, o)| {
                    Arc::new(WatchEvent {
                        res: idx,
                        kind: EventType::Added,
                        rv: o.summary().rv,
                        object: o.clone(),
                        prev: None,
                    })
                })
                .collect(),
        };
        Ok((backlog, rx, inner.rv))
    }

    /// Forgets the whole watch history (watches from older versions then get 410 Gone).
    pub fn compact(&self) {
        let mut inner = self.write();
        inner.compacted_rv = inner.rv;
        inner.history.clear();
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

/// A write transaction (holds the store's write lock).
pub struct Txn<'a> {
    inner: &'a mut Inner,
    store: &'a Store,
}

impl Txn<'_> {
    /// Current simulated time as a metadata timestamp.
    pub fn now(&self) -> String {
        self.store.clock.stamp()
    }

    /// Current simulated time as a MicroTime (Event `eventTime`).
    pub fn now_micro(&self) -> String {
        super::clock::fmt_micro(self.store.clock.now())
    }

    /// One object.
    pub fn get(&self, res: &ResourceDef, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.get_stored(res, ns, name).map(parsed)
    }

    fn get_stored(&self, res: &ResourceDef, ns: &str, name: &str) -> Option<&Arc<StoredObject>> {
        self.inner.tables[res.index()]
            .objects
            .get(&(ns.to_string(), name.to_string()))
    }

    /// Whether an object exists.
    pub fn exists(&self, res: &ResourceDef, ns: &str, name: &str) -> bool {
        self.get_stored(res, ns, name).is_some()
    }

    /// All objects of a resource in a namespace (or all namespaces).
    pub fn list(&self, res: &ResourceDef, ns: Option<&str>) -> Vec<Arc<Value>> {
        self.inner.tables[res.index()]
            .objects
            .iter()
            .filter(|(k, _)| ns.is_none_or(|n| n == k.0))
            .map(|(_, v)| parsed(v))
            .collect()
    }

    /// Pods bound to a node.
    pub fn pods_on_node(&self, node: &str) -> Vec<Arc<Value>> {
        let table = &self.inner.tables[well_known::pods().index()];
        table
            .by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| table.objects.get(k).map(parsed))
            .collect()
    }

    fn commit(
        &mut self,
        res: &ResourceDef,
        key: Key,
        mut obj: Value,
        kind: EventType,
    ) -> Arc<Value> {
        self.inner.rv += 1;
        let rv = self.inner.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let idx = res.index();
        let is_pod = std::ptr::eq(res, well_known::pods());
        let stored = Arc::new(StoredObject::new(&obj));
        let table = &mut self.inner.tables[idx];
        table.last_write = rv;
        let prev = if kind == EventType::Deleted {
            table.objects.remove(&key)
        } else {
            table.objects.insert(key.clone(), stored.clone())
        };
        if is_pod {
            if let Some(old) = prev.as_ref().and_then(|p| p.summary().node()) {
                if let Some(set) = table.by_node.get_mut(old) {
                    set.remove(&key);
                    if set.is_empty() {
                        table.by_node.remove(old);
                    }
                }
            }
            if let (Some(n), false) = (stored.summary().node(), kind == EventType::Deleted) {
                table.by_node.entry(n.to_string()).or_default().insert(key);
            }
        }
        let obj = Arc::new(obj);
        let ev = Arc::new(WatchEvent {
            res: idx,
            kind,
            rv,
            object: stored,
            prev,
        });
        self.inner.history.push_back(ev.clone());
        while self.inner.history.len() > self.store.opts.history {
            if let Some(old) = self.inner.history.pop_front() {
                self.inner.compacted_rv = old.rv;
            }
        }
        // No receivers is fine.
        let _ = self.store.tx.send(ev);
        if std::ptr::eq(res, well_known::new_events()) {
            self.mirror_event(&obj, kind);
        }
        obj
    }

    /// Keeps the core v1 copy of an events.k8s.io Event in step.
    fn mirror_event(&mut self, ev: &Value, kind: EventType) {
        let core = well_known::events();
        let key = (
            meta_str(ev, "namespace").unwrap_or_default().to_string(),
            meta_str(ev, "name").unwrap_or_default().to_string(),
        );
        let existing = self.get(core, &key.0, &key.1);
        if kind == EventType::Deleted {
            if let Some(old) = existing {
                self.commit(core, key, (*old).clone(), EventType::Deleted);
            }
            return;
        }
        let mut obj = super::events::to_core(ev);
        obj["apiVersion"] = json!("v1");
        obj["kind"] = json!("Event");
        let base = existing.as_deref().cloned().unwrap_or_else(
            || json!({"metadata": {"uid": new_uid(), "creationTimestamp": self.now()}}),
        );
        obj["metadata"]["uid"] = base["metadata"]["uid"].clone();
        obj["metadata"]["creationTimestamp"] = base["metadata"]["creationTimestamp"].clone();
        let kind = if existing.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.commit(core, key, obj, kind);
    }

    /// Creates an object (fills name from generateName, uid, timestamps, resourceVersion, defaults).
    pub fn create(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        mut obj: Value,
    ) -> ApiResult<Arc<Value>> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        check_shape(&obj)?;
        if let Some(kind) = obj.get("kind").and_then(Value::as_str) {
            if kind != res.kind {
                return Err(ApiError::bad_request(format!(
                    "the kind {kind:?} of the object does not match the resource {} ({})",
                    res.qualified(),
                    res.kind
                )));
            }
        }
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        let ns = self.check_namespace(res, ns, &obj)?;
        let name = match meta_str(&obj, "name").filter(|n| !n.is_empty()) {
            Some(n) => n.to_string(),
            None => {
                let prefix = meta_str(&obj, "generateName")
                    .unwrap_or_default()
                    .to_string();
                if prefix.is_empty() {
                    return Err(ApiError::invalid(
                        res,
                        "",
                        "metadata.name",
                        "name or generateName is required",
                    ));
                }
                // As ValidateObjectMeta: the prefix, a trailing '-' allowed, must itself be a valid name.
                let masked = match prefix.strip_suffix('-') {
                    Some(p) => format!("{p}a"),
                    None => prefix.clone(),
                };
                if !valid_object_name(&masked) {
                    return Err(ApiError::invalid(res, &format!("{prefix}xxxxx"), "metadata.generateName",
                        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
                }
                // As the apiserver's name generator: the prefix is cut to 58 characters.
                let mut cut = prefix.len().min(MAX_GENERATE_NAME_PREFIX);
                while !prefix.is_char_boundary(cut) {
                    cut -= 1;
                }
                let prefix = &prefix[..cut];
                let mut name = format!("{prefix}{}", random_suffix());
                while self.exists(res, &ns, &name) {
                    name = format!("{prefix}{}", random_suffix());
                }
                name
            }
        };
        if !valid_object_name(&name) {
            return Err(ApiError::invalid(res, &name, "metadata.name",
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"));
        }
        super::validate::on_create(res, &ns, &name, &obj)?;
        if self.exists(res, &ns, &name) {
            return Err(ApiError::already_exists(res, &name));
        }
        let now = self.now();
        let m = &mut obj["metadata"];
        m["name"] = json!(name);
        if res.namespaced {
            m["namespace"] = json!(ns);
        }
        m["uid"] = json!(new_uid());
        m["creationTimestamp"] = json!(now);
        m["generation"] = json!(1);
        if let Some(mm) = m.as_object_mut() {
            mm.remove("deletionTimestamp");
            mm.remove("deletionGracePeriodSeconds");
            mm.remove("resourceVersion");
        }
        super::defaults::apply(res, &mut obj);
        Ok(self.commit(res, (ns, name), obj, EventType::Added))
    }

    /// Creates an object exported from another cluster (a snapshot replay): like
    /// [`Txn::create`], but it keeps the object's `uid`, `creationTimestamp` and `generation`.
    pub fn restore(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        obj: Value,
    ) -> ApiResult<Arc<Value>> {
        let kept: Vec<(&str, Value)> = ["uid", "creationTimestamp", "generation"]
            .into_iter()
            .filter_map(|k| {
                let v = obj.get("metadata")?.get(k)?;
                (v.is_string() || v.is_u64()).then(|| (k, v.clone()))
            })
            .collect();
        let created = self.create(res, ns, obj)?;
        if kept.is_empty() {
            return Ok(created);
        }
        let mut o = (*created).clone();
        for (k, v) in kept {
            o["metadata"][k] = v;
        }
        let key = (
            meta_str(&o, "namespace").unwrap_or_default().to_string(),
            meta_str(&o, "name").unwrap_or_default().to_string(),
        );
        Ok(self.commit(res, key, o, EventType::Modified))
    }

    fn check_namespace(&self, res: &ResourceDef, ns: &str, obj: &Value) -> ApiResult<String> {
        if !res.namespaced {
            return Ok(String::new());
        }
        let body_ns = meta_str(obj, "namespace").filter(|s| !s.is_empty());
        let ns = match (ns, body_ns) {
            ("", Some(b)) => b.to_string(),
            ("", None) => "default".to_string(),
            (u, Some(b)) if u != b => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            (u, _) => u.to_string(),
        };
        if !self.exists(well_known::namespaces(), "", &ns) {
            return Err(ApiError::not_found(well_known::namespaces(), &ns));
        }
        if self.namespace_terminating(&ns) {
            let name = meta_str(obj, "name").unwrap_or_default();
            return Err(ApiError::namespace_terminating(res, name, &ns));
        }
        Ok(ns)
    }

    /// Whether namespace `ns` is being deleted (phase `Terminating`: a finalizer holds it).
    pub fn namespace_terminating(&self, ns: &str) -> bool {
        self.get(well_known::namespaces(), "", ns).is_some_and(|n| {
            n.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating")
        })
    }

    /// Replaces an object with optimistic concurrency: a non-empty resourceVersion in `desired` must match.
    pub fn update(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        mut desired: Value,
        target: WriteTarget,
    ) -> ApiResult<Arc<Value>> {
        let key = (ns.to_string(), name.to_string());
        let old = self
            .get(res, ns, name)
            .ok_or_else(|| ApiError::not_found(res, name))?;
        if !desired.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        check_shape(&desired)?;
        if !desired.get("metadata").is_some_and(Value::is_object) {
            desired["metadata"] = json!({});
        }
        if let Some(n) = meta_str(&desired, "name").filter(|n| !n.is_empty() && *n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(rv) = meta_str(&desired, "resourceVersion").filter(|s| !s.is_empty()) {
            if rv != rv_of(&old).to_string() {
                return Err(ApiError::conflict(res, name,
                    "the object has been modified; please apply your changes to the latest version and try again"));
            }
        }
        let mut new = match target {
            WriteTarget::Status => {
                let mut n = (*old).clone();
                n["status"] = desired.get("status").cloned().unwrap_or(Value::Null);
                n
            }
            WriteTarget::Main | WriteTarget::Internal => desired,
        };
        new["apiVersion"] = json!(res.api_version());
        new["kind"] = json!(res.kind);
        if res.group.is_empty() && res.kind == "Secret" {
            super::defaults::secret(&mut new);
        }
        for f in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            match old["metadata"].get(f) {
                Some(v) => new["metadata"][f] = v.clone(),
                None => {
                    if let Some(m) = new["metadata"].as_object_mut() {
                        m.remove(f);
                    }
                }
            }
        }
        if target == WriteTarget::Main && res.has_status {
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        let spec_changed = new.get("spec") != old.get("spec");
        new["metadata"]["generation"] = json!(if spec_changed {
            generation + 1
        } else {
            generation
        });
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if new == *old {
            return Ok(old);
        }
        if target != WriteTarget::Internal {
            super::validate::on_update(res, ns, name, &new)?;
        }
        let obj = self.commit(res, key.clone(), new, EventType::Modified);
        self.finish_if_done(res, key, &obj);
        Ok(self.get(res, ns, name).unwrap_or(obj))
    }

    /// Runs `f` on the current object and writes its result with [`Txn::update`].
    pub fn modify(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        target: WriteTarget,
        f: impl FnOnce(&Value) -> ApiResult<Value>,
    ) -> ApiResult<Arc<Value>> {
        let old = self
            .get(res, ns, name)
            .ok_or_else(|| ApiError::not_found(res, name))?;
        let new = f(&old)?;
        self.update(res, ns, name, new, target)
    }

    /// Removes an object whose deletion is complete (deletionTimestamp set, no finalizers).
    fn finish_if_done(&mut self, res: &ResourceDef, key: Key, obj: &Value) {
        let terminating = obj.pointer("/metadata/deletionTimestamp").is_some();
        let finalizers = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if !terminating || finalizers {
            return;
        }
        if std::ptr::eq(res, well_known::pods()) && self.pod_needs_kubelet(obj) {
            let due = obj
                .pointer("/metadata/deletionTimestamp")
                .and_then(Value::as_str)
                .and_then(parse_time)
                .is_some_and(|t| t <= self.store.clock.now());
            if !due {
                return;
            }
        }
        if std::ptr::eq(res, well_known::namespaces()) {
            self.delete_namespace_contents(&key.1);
        }
        self.commit(res, key, obj.clone(), EventType::Deleted);
    }

    fn pod_needs_kubelet(&self, pod: &Value) -> bool {
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.store.opts.graceful_pod_deletion
            && node_of(pod).is_some()
            && phase != "Succeeded"
            && phase != "Failed"
    }

    /// Removes an object at once (used by loops when a graceful deletion is over).
    pub fn remove(&mut self, res: &ResourceDef, ns: &str, name: &str) -> Option<Arc<Value>> {
        let key = (ns.to_string(), name.to_string());
        let obj = self.get_stored(res, ns, name)?.value();
        Some(self.commit(res, key, obj, EventType::Deleted))
    }

    /// Deletes an object: finalizers and graceful pod termination set `deletionTimestamp` first.
    pub fn delete(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<Arc<Value>> {
        let key = (ns.to_string(), name.to_string());
        let old = self
            .get(res, ns, name)
            .ok_or_else(|| ApiError::not_found(res, name))?;
        if opts
            .uid
            .as_deref()
            .is_some_and(|u| Some(u) != meta_str(&old, "uid"))
        {
            return Err(ApiError::conflict(res, name, "Precondition failed: UID in precondition does not match the UID in record. The object might have been deleted and then recreated"));
        }
        if opts
            .resource_version
            .as_deref()
            .is_some_and(|r| r != rv_of(&old).to_string())
        {
            return Err(ApiError::conflict(res, name, "Precondition failed: the ResourceVersion in the precondition does not match the ResourceVersion in record. The object might have been modified"));
        }
        let is_pod = std::ptr::eq(res, well_known::pods());
        let grace = if is_pod {
            opts.grace_seconds
                .or_else(|| {
                    old.pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
                .max(0)
        } else {
            0
        };
        let has_finalizers = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        let graceful = is_pod && grace > 0 && self.pod_needs_kubelet(&old);
        if !has_finalizers && !graceful {
            if std::ptr::eq(res, well_known::namespaces()) {
                self.delete_namespace_contents(name);
            }
            return Ok(self.commit(res, key, (*old).clone(), EventType::Deleted));
        }
        let now = self.store.clock.now();
        let due = now + chrono::Duration::seconds(grace);
        let mut new = (*old).clone();
        let current_due = old
            .pointer("/metadata/deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(parse_time);
        if current_due.is_none_or(|c| due < c) {
            new["metadata"]["deletionTimestamp"] = json!(fmt_time(due));
            new["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        }
        if std::ptr::eq(res, well_known::namespaces()) {
            // Held by a finalizer: Terminating, so NamespaceLifecycle refuses new content. Its
            // content stays until the finalizers are gone (a stuck namespace controller).
            new["status"]["phase"] = json!("Terminating");
        }
        if new == *old {
            return Ok(old);
        }
        let obj = self.commit(res, key.clone(), new, EventType::Modified);
        self.finish_if_done(res, key, &obj);
        Ok(obj)
    }

    fn delete_namespace_contents(&mut self, ns: &str) {
        for res in RESOURCES.iter().filter(|r| r.namespaced) {
            let keys: Vec<Key> = self.inner.tables[res.index()]
                .objects
                .keys()
                .filter(|k| k.0 == ns)
                .cloned()
                .collect();
            for k in keys {
                self.remove(res, &k.0, &k.1);
            }
        }
    }

    /// Finishes graceful pod deletions that are due (the simulated kubelet's job); returns how many.
    pub fn reap_terminated_pods(&mut self, node_alive: impl Fn(&str) -> bool) -> usize {
        let now = self.store.clock.now();
        let table = &self.inner.tables[well_known::pods().index()];
        // Only terminating pods without finalizers are parsed (to read their deletionTimestamp).
        let due: Vec<Key> = table
            .objects
            .iter()
            .filter(|(_, p)| {
                let s = p.summary();
                s.terminating && !s.finalizers && s.node().is_none_or(&node_alive)
            })
            .filter(|(_, p)| {
                p.value()
                    .pointer("/metadata/deletionTimestamp")
                    .and_then(Value::as_str)
                    .and_then(parse_time)
                    .is_some_and(|t| t <= now)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &due {
            self.remove(well_known::pods(), &k.0, &k.1);
        }
        due.len()
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
