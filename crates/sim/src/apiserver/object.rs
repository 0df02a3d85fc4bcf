//! Stored objects: the serialized JSON of an object plus the few fields that indexes, selectors and
//! the control loops read without parsing it.
//!
//! A `serde_json::Value` tree of a small pod takes about 11 KB (each JSON object is a `BTreeMap`
//! whose first node alone is ~600 bytes); its serialized form takes about 1 KB. The store keeps the
//! bytes, so lists, gets and watches write them out directly, and parses them only where an
//! object is read as a whole (patches, updates, the loops' detailed checks).

use bytes::Bytes;
use serde_json::Value;

use nodekeeper_core::k8s::selectors::{
    field_value, labels_of, FieldSelector, LabelSelector, Requirement,
};

/// The fields read without parsing the object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// `metadata.resourceVersion` as a number (0 when absent or not a number).
    pub rv: u64,
    /// `metadata.name`.
    pub name: Box<str>,
    /// `metadata.namespace` ("" for cluster-scoped objects).
    pub namespace: Box<str>,
    /// `metadata.labels`, sorted by key (non-string values read as "").
    pub labels: Box<[(Box<str>, Box<str>)]>,
    /// `spec.nodeName` as a field selector sees it ("" when absent).
    pub node_field: Box<str>,
    /// `spec.nodeName` is a non-empty string (the pod is bound and indexed under it).
    pub bound: bool,
    /// `status.phase` as a field selector sees it ("" when absent).
    pub phase: Box<str>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `metadata.finalizers` is a non-empty list.
    pub finalizers: bool,
}

impl Summary {
    /// Reads the summary of a JSON object.
    pub fn of(obj: &Value) -> Self {
        let meta = |f: &str| field_value(obj, &format!("metadata.{f}")).into_boxed_str();
        let rv = obj
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let labels: Vec<(Box<str>, Box<str>)> = labels_of(obj)
            .into_iter()
            .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
            .collect();
        Summary {
            rv,
            name: meta("name"),
            namespace: meta("namespace"),
            labels: labels.into_boxed_slice(),
            node_field: field_value(obj, "spec.nodeName").into_boxed_str(),
            bound: obj
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty()),
            phase: field_value(obj, "status.phase").into_boxed_str(),
            terminating: obj.pointer("/metadata/deletionTimestamp").is_some(),
            finalizers: obj
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty()),
        }
    }

    /// The node a pod is bound to, if any.
    pub fn node(&self) -> Option<&str> {
        self.bound.then_some(&*self.node_field)
    }

    /// The value of a label.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.labels[i].1)
    }

    /// Whether the labels satisfy every requirement of `sel` (same rules as [`LabelSelector::matches`]).
    pub fn labels_match(&self, sel: &LabelSelector) -> bool {
        let has = |vs: &[String], l: &str| vs.iter().any(|v| v == l);
        sel.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => self.label(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => self.label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => self.label(k).is_some_and(|l| has(vs, l)),
            Requirement::NotIn(k, vs) => self.label(k).is_none_or(|l| !has(vs, l)),
            Requirement::Exists(k) => self.label(k).is_some(),
            Requirement::NotExists(k) => self.label(k).is_none(),
        })
    }

    /// The value of an indexed field, or `None` when the field is not indexed.
    pub fn field(&self, field: &str) -> Option<&str> {
        match field {
            "metadata.name" => Some(&self.name),
            "metadata.namespace" => Some(&self.namespace),
            "spec.nodeName" => Some(&self.node_field),
            "status.phase" => Some(&self.phase),
            _ => None,
        }
    }

    /// Whether the fields satisfy `sel`, or `None` when `sel` names a field that is not indexed.
    pub fn fields_match(&self, sel: &FieldSelector) -> Option<bool> {
        let mut ok = true;
        for r in &sel.0 {
            let got = self.field(&r.field)?;
            ok &= (got == r.value) != r.negated;
        }
        Some(ok)
    }
}

/// One object as the store keeps it: serialized JSON and its [`Summary`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    raw: Bytes,
    summary: Summary,
}

impl StoredObject {
    /// Serializes `obj` and reads its summary.
    pub fn new(obj: &Value) -> Self {
        // Serializing a `Value` cannot fail (its map keys are strings).
        let raw = serde_json::to_vec(obj).unwrap_or_else(|_| b"null".to_vec());
        StoredObject {
            raw: Bytes::from(raw.into_boxed_slice()),
            summary: Summary::of(obj),
        }
    }

    /// The serialized JSON.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// The indexed fields.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// Parses the object (the bytes were written by [`StoredObject::new`], so this cannot fail;
    /// `null` is returned if it ever did).
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.raw).unwrap_or_else(|e| {
            tracing::error!(error = %e, name = %self.summary.name, "stored object does not parse");
            Value::Null
        })
    }

    /// Whether the object passes both selectors; parses it only when a field is not indexed.
    pub fn matches(&self, labels: &LabelSelector, fields: &FieldSelector) -> bool {
        if !self.summary.labels_match(labels) {
            return false;
        }
        match self.summary.fields_match(fields) {
            Some(ok) => ok,
            None => fields.matches(&self.value()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "42",
                "labels": {"app": "web", "tier": "front", "n": 5}, "finalizers": ["f"]},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.0.0.1"}})
    }

    #[test]
    fn roundtrip_and_summary() {
        let o = StoredObject::new(&pod());
        assert_eq!(o.value(), pod());
        assert_eq!(o.raw().as_ref(), serde_json::to_vec(&pod()).unwrap());
        let s = o.summary();
        assert_eq!(s.rv, 42);
        assert_eq!((&*s.name, &*s.namespace), ("p", "ns"));
        assert_eq!(s.node(), Some("n1"));
        assert_eq!(&*s.phase, "Running");
        assert!(s.finalizers && !s.terminating);
        assert_eq!(s.label("tier"), Some("front"));
        assert_eq!(
            s.label("n"),
            Some(""),
            "non-string values read as \"\" like labels_of"
        );
        assert_eq!(s.label("nope"), None);
        let unbound = Summary::of(&json!({"spec": {"nodeName": ""}}));
        assert_eq!(unbound.node(), None);
        assert_eq!(Summary::of(&json!({"spec": {"nodeName": 5}})).node(), None);
    }

    /// The indexed paths agree with the Value-based selectors on every selector tried.
    #[test]
    fn selectors_agree_with_value_matching() {
        let o = StoredObject::new(&pod());
        let labels = [
            "",
            "app=web",
            "app!=web",
            "app in (db,web)",
            "app notin (web)",
            "tier",
            "!tier",
            "!missing",
            "missing!=x",
            "app=web,tier=back",
        ];
        let fields = [
            "",
            "spec.nodeName=n1",
            "spec.nodeName!=n1",
            "status.phase=Running,metadata.namespace=ns",
            "metadata.name=q",
            "status.podIP=10.0.0.1",
            "status.podIP!=10.0.0.1",
        ];
        for l in labels {
            for f in fields {
                let ls = LabelSelector::parse(l).unwrap();
                let fs = FieldSelector::parse(f, "Pod").unwrap();
                let want = ls.matches_object(&pod()) && fs.matches(&pod());
                assert_eq!(o.matches(&ls, &fs), want, "labels {l:?} fields {f:?}");
            }
        }
    }
}
