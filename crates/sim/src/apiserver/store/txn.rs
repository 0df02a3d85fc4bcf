//! Write transactions: creates, updates, deletes with their preconditions, under the store's
//! write lock.

use super::*;

/// A write transaction (holds the store's write lock).
pub struct Txn<'a> {
    pub(super) inner: &'a mut Inner,
    pub(super) store: &'a Store,
}

impl Txn<'_> {
    /// Current simulated time as a metadata timestamp.
    pub fn now(&self) -> String {
        self.store.clock.stamp()
    }

    /// Current simulated time as a MicroTime (Event `eventTime`).
    pub fn now_micro(&self) -> String {
        crate::apiserver::clock::fmt_micro(self.store.clock.now())
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
        let indexed = res.lifecycle.indexed_by_node();
        let stored = Arc::new(StoredObject::new(&obj));
        let table = &mut self.inner.tables[idx];
        table.last_write = rv;
        let prev = if kind == EventType::Deleted {
            table.objects.remove(&key)
        } else {
            table.objects.insert(key.clone(), stored.clone())
        };
        if indexed {
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
        if res.lifecycle.mirrored_to_core_events() {
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
        let mut obj = crate::apiserver::events::to_core(ev);
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
        crate::apiserver::validate::on_create(res, &ns, &name, &obj)?;
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
        crate::apiserver::defaults::apply(res, &mut obj);
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
            crate::apiserver::defaults::secret(&mut new);
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
            crate::apiserver::validate::on_update(res, ns, name, &new)?;
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
        if res.lifecycle.graceful_deletion() && self.pod_needs_kubelet(obj) {
            let due = obj
                .pointer("/metadata/deletionTimestamp")
                .and_then(Value::as_str)
                .and_then(parse_time)
                .is_some_and(|t| t <= self.store.clock.now());
            if !due {
                return;
            }
        }
        if res.lifecycle.cascades() {
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
        let graceful_kind = res.lifecycle.graceful_deletion();
        let grace = if graceful_kind {
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
        let graceful = graceful_kind && grace > 0 && self.pod_needs_kubelet(&old);
        if !has_finalizers && !graceful {
            if res.lifecycle.cascades() {
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
        if res.lifecycle.cascades() {
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
