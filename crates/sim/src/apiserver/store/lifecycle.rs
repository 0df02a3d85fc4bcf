//! What the store does for a resource beyond storing it: kube-apiserver's per-resource registry
//! "strategy", as one tag on each [`ResourceDef`](super::super::resources::ResourceDef) that the
//! store's write paths ask, instead of comparing the definition against well-known resources.

/// A resource's lifecycle in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lifecycle {
    /// Stored as written; deleted at once unless finalizers hold it.
    #[default]
    Plain,
    /// Pods: deleted gracefully (`deletionTimestamp` + grace, finished by the node's kubelet when
    /// one runs it) and indexed by `spec.nodeName`.
    Pod,
    /// Namespaces: deleting one deletes its contents; held by finalizers it is `Terminating`.
    Namespace,
    /// `events.k8s.io/v1` Events: each write is mirrored into the core `v1` Event of that name.
    MirroredEvent,
}

impl Lifecycle {
    /// Deletion sets `deletionTimestamp` and a grace period; the kubelet finishes it.
    pub fn graceful_deletion(self) -> bool {
        self == Lifecycle::Pod
    }

    /// Kept in the store's `spec.nodeName` index (a field selector on it reads the index).
    pub fn indexed_by_node(self) -> bool {
        self == Lifecycle::Pod
    }

    /// Deleting an object deletes the namespace's contents.
    pub fn cascades(self) -> bool {
        self == Lifecycle::Namespace
    }

    /// Written through to the core `v1` Event.
    pub fn mirrored_to_core_events(self) -> bool {
        self == Lifecycle::MirroredEvent
    }
}
