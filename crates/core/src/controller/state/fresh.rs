//! The newest copy of each Node that the controller's own writes returned.
//!
//! The Node watch delivers a write of ours a moment (under load, seconds) after kube-apiserver
//! answered it. Until then the answer is newer than the watch cache: the engine decides on it (so
//! that a reconcile right after a write never decides on stale state) and the actor computes a
//! taint patch from it (so that the patch's `resourceVersion` precondition holds). Every writer of
//! Nodes in the controller records its answers here: the actor, and the node-state layer's
//! condition and label writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;

/// The newest Node object each write of this process returned, by node name (shared, so that a
/// reconcile reading it copies nothing).
#[derive(Debug, Default)]
pub struct FreshNodes(Mutex<HashMap<String, Arc<Node>>>);

fn rv(n: &Node) -> Option<u64> {
    n.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok())
}

impl FreshNodes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Node>>> {
        crate::sync::lock(&self.0)
    }

    /// Records the object a write returned, unless a newer one is recorded already (two writes of
    /// one node may answer out of order).
    pub fn record(&self, n: Node) {
        let Some(name) = n.metadata.name.clone() else {
            return;
        };
        let mut m = self.lock();
        match m.get(&name) {
            Some(old) if rv(old) >= rv(&n) && rv(&n).is_some() => {}
            _ => {
                m.insert(name, Arc::new(n));
            }
        }
    }

    /// The recorded object, if it is newer than `cached` (by resourceVersion); an older one is
    /// forgotten (the watch has caught up).
    pub fn fresher(&self, cached: &Node) -> Option<Arc<Node>> {
        let name = cached.metadata.name.as_deref()?;
        let mut m = self.lock();
        let f = m.get(name)?;
        match (rv(f), rv(cached)) {
            (Some(a), Some(b)) if a > b => Some(Arc::clone(f)),
            _ => {
                m.remove(name);
                None
            }
        }
    }

    /// Forgets the nodes that are gone.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|n, _| keep(n));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node(name: &str, rv: &str, label: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "resourceVersion": rv, "labels": { "l": label } }
        }))
        .unwrap()
    }

    fn label(n: &Node) -> &str {
        n.metadata.labels.as_ref().unwrap()["l"].as_str()
    }

    #[test]
    fn the_newest_answer_wins_and_is_dropped_once_the_cache_has_caught_up() {
        let f = FreshNodes::default();
        f.record(node("a", "12", "second"));
        f.record(node("a", "11", "first"));
        let cached = node("a", "10", "cache");
        assert_eq!(
            label(&f.fresher(&cached).unwrap()),
            "second",
            "out of order"
        );
        assert!(f.fresher(&node("a", "12", "cache")).is_none(), "caught up");
        assert!(
            f.fresher(&cached).is_none(),
            "forgotten once the cache caught up"
        );
        f.record(node("b", "5", "b"));
        f.retain(|n| n != "b");
        assert!(f.fresher(&node("b", "1", "cache")).is_none(), "gone");
    }
}
