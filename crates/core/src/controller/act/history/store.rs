//! Where a node's history is kept: the ConfigMap `nodekeeper-history-<node>` in the controller's
//! namespace, labelled [`LABEL`]`=true`, the node's name in the annotation [`NODE_ANNOTATION`]
//! and the entries, oldest first, as JSON in `data["entries.json"]`. Owned by nothing: it
//! outlives its node until its entries age out ([`Histories::sweep`]).
//!
//! Every write reads the ConfigMap, merges ([`super::entry::merge`]) and writes it back with
//! the `resourceVersion` it read as a precondition (PUT; 409 → read again, at most
//! [`ATTEMPTS`] times), so that two writers (an old and a new leader) never lose each other's
//! entries. The status CLI reads it with [`Histories::read`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};

use super::entry::{self, Entry, Limits};

/// Label of every history ConfigMap (value `true`): what [`Histories::sweep`] lists.
pub const LABEL: &str = "nodekeeper.io/history";
/// Annotation naming the node (a label value could not hold every node name: 63 characters).
pub const NODE_ANNOTATION: &str = "nodekeeper.io/node";
/// The data key holding the entries.
pub const DATA_KEY: &str = "entries.json";
/// Prefix of the ConfigMaps' names.
pub const PREFIX: &str = "nodekeeper-history-";
/// Read-merge-write attempts before a write is given up (counted as a failure).
pub const ATTEMPTS: u32 = 5;

/// Why a history could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// An API call failed.
    #[error("history of node {node} (configmap {namespace}/{name}): {action}: {source}")]
    Kube {
        /// The node.
        node: String,
        /// The ConfigMap's namespace.
        namespace: String,
        /// The ConfigMap's name.
        name: String,
        /// What was being done.
        action: &'static str,
        /// The API's answer.
        #[source]
        source: Box<kube::Error>,
    },
    /// The stored entries are not readable (written by a newer controller?): left as they are.
    #[error("history of node {node} (configmap {namespace}/{name}) is unreadable: {source}")]
    Unreadable {
        /// The node.
        node: String,
        /// The ConfigMap's namespace.
        namespace: String,
        /// The ConfigMap's name.
        name: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// Every attempt met a newer version.
    #[error("history of node {node} (configmap {namespace}/{name}): still conflicting after {ATTEMPTS} attempts")]
    Conflicts {
        /// The node.
        node: String,
        /// The ConfigMap's namespace.
        namespace: String,
        /// The ConfigMap's name.
        name: String,
    },
}

/// The ConfigMap name of `node`'s history: [`PREFIX`] and the node's name, or, past the 253
/// characters of a name, its first 200 and a hash of the whole.
pub fn name(node: &str) -> String {
    let full = format!("{PREFIX}{node}");
    if full.len() <= 253 {
        return full;
    }
    // FNV-1a: stable across releases and platforms (std's hasher is not).
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let head: String = node.chars().take(200).collect();
    format!("{PREFIX}{}-{hash:016x}", head.trim_end_matches(['.', '-']))
}

struct At<'a> {
    api: &'a Api<ConfigMap>,
    node: &'a str,
    name: String,
}

impl At<'_> {
    fn kube(&self, action: &'static str) -> impl FnOnce(kube::Error) -> HistoryError + '_ {
        move |source| HistoryError::Kube {
            node: self.node.to_string(),
            namespace: self.api_namespace(),
            name: self.name.clone(),
            action,
            source: Box::new(source),
        }
    }

    fn api_namespace(&self) -> String {
        self.api.namespace().unwrap_or_default().to_string()
    }

    fn entries(&self, cm: &ConfigMap) -> Result<Vec<Entry>, HistoryError> {
        entries_of(cm).map_err(|source| HistoryError::Unreadable {
            node: self.node.to_string(),
            namespace: self.api_namespace(),
            name: self.name.clone(),
            source,
        })
    }
}

/// The entries a ConfigMap holds (none without the key).
fn entries_of(cm: &ConfigMap) -> Result<Vec<Entry>, serde_json::Error> {
    match cm.data.as_ref().and_then(|d| d.get(DATA_KEY)) {
        Some(text) => entry::decode(text),
        None => Ok(Vec::new()),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The histories of one namespace (the controller's).
#[derive(Clone)]
pub struct Histories {
    api: Api<ConfigMap>,
}

impl Histories {
    /// The histories in `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Histories {
            api: Api::namespaced(client, namespace),
        }
    }

    /// `node`'s history, oldest first (empty when it has none).
    pub async fn read(&self, node: &str) -> Result<Vec<Entry>, HistoryError> {
        read(&self.api, node).await
    }

    /// Adds `new` to `node`'s history: read, merge, write back conditioned on the version read;
    /// returns how many conflicts it met.
    pub async fn append(
        &self,
        node: &str,
        new: &[Entry],
        limits: &Limits,
        now: DateTime<Utc>,
    ) -> Result<u32, HistoryError> {
        append(&self.api, node, new, limits, now).await
    }

    /// Ages every history out: entries past `limits` go, a history left empty is deleted.
    pub async fn sweep(&self, limits: &Limits, now: DateTime<Utc>) -> Result<Swept, kube::Error> {
        sweep(&self.api, limits, now).await
    }
}

/// `node`'s history, oldest first (empty when it has none).
async fn read(api: &Api<ConfigMap>, node: &str) -> Result<Vec<Entry>, HistoryError> {
    let at = At {
        api,
        node,
        name: name(node),
    };
    match api.get_opt(&at.name).await.map_err(at.kube("get"))? {
        Some(cm) => at.entries(&cm),
        None => Ok(Vec::new()),
    }
}

/// A new ConfigMap holding `entries` for `node`.
fn new_configmap(node: &str, entries: &[Entry]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name(node)),
            labels: Some(BTreeMap::from([
                (LABEL.to_string(), "true".to_string()),
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "nodekeeper".to_string(),
                ),
            ])),
            annotations: Some(BTreeMap::from([(
                NODE_ANNOTATION.to_string(),
                node.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            DATA_KEY.to_string(),
            entry::encode(entries),
        )])),
        ..ConfigMap::default()
    }
}

/// Adds `new` to `node`'s history (merged within `limits` at `now`): read, merge, write back
/// conditioned on the version read; returns how many conflicts it met.
async fn append(
    api: &Api<ConfigMap>,
    node: &str,
    new: &[Entry],
    limits: &Limits,
    now: DateTime<Utc>,
) -> Result<u32, HistoryError> {
    let at = At {
        api,
        node,
        name: name(node),
    };
    let pp = PostParams::default();
    for attempt in 0..ATTEMPTS {
        let written = match api.get_opt(&at.name).await.map_err(at.kube("get"))? {
            None => {
                let entries = entry::merge(Vec::new(), new, limits, now);
                api.create(&pp, &new_configmap(node, &entries)).await
            }
            Some(mut cm) => {
                let entries = entry::merge(at.entries(&cm)?, new, limits, now);
                cm.data
                    .get_or_insert_with(BTreeMap::new)
                    .insert(DATA_KEY.to_string(), entry::encode(&entries));
                cm.metadata.managed_fields = None;
                // `replace` sends the resourceVersion read: a PUT over a newer one is a 409.
                api.replace(&at.name, &pp, &cm).await
            }
        };
        match written {
            Ok(_) => return Ok(attempt),
            // 409: changed since read (or created meanwhile): read again.
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => return Err(at.kube("write")(e)),
        }
    }
    Err(HistoryError::Conflicts {
        node: node.to_string(),
        namespace: at.api_namespace(),
        name: at.name,
    })
}

/// What one [`Histories::sweep`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Histories read.
    pub seen: usize,
    /// Histories that lost entries to age.
    pub trimmed: usize,
    /// Histories deleted (every entry aged out: a node gone, or long left alone).
    pub deleted: usize,
}

/// Ages every history in `api`'s namespace out: the entries past `limits` go; a history left
/// empty is deleted (conditioned on the version read, so an entry written meanwhile survives).
/// A history that changed meanwhile, or is unreadable, is left for the next sweep.
async fn sweep(
    api: &Api<ConfigMap>,
    limits: &Limits,
    now: DateTime<Utc>,
) -> Result<Swept, kube::Error> {
    let list = api
        .list(&ListParams::default().labels(&format!("{LABEL}=true")))
        .await?;
    let mut done = Swept::default();
    for mut cm in list.items {
        done.seen += 1;
        let (Some(cm_name), Ok(old)) = (cm.metadata.name.clone(), entries_of(&cm)) else {
            continue;
        };
        let kept = entry::merge(old.clone(), &[], limits, now);
        if kept == old {
            continue;
        }
        let rv = cm.metadata.resource_version.clone();
        let r = if kept.is_empty() {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: rv,
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            api.delete(&cm_name, &dp).await.map(|_| done.deleted += 1)
        } else {
            cm.data
                .get_or_insert_with(BTreeMap::new)
                .insert(DATA_KEY.to_string(), entry::encode(&kept));
            cm.metadata.managed_fields = None;
            api.replace(&cm_name, &PostParams::default(), &cm)
                .await
                .map(|_| done.trimmed += 1)
        };
        match r {
            Ok(()) => {}
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_configmap_names_for_every_node_name() {
        assert_eq!(name("n1"), "nodekeeper-history-n1");
        let long = format!("{}.example.com", "a".repeat(240));
        let n = name(&long);
        assert!(n.len() <= 253, "{}", n.len());
        assert!(
            crate::k8s::validation::dns1123_subdomain(&n).is_empty(),
            "{n}"
        );
        assert_ne!(n, name(&format!("{}.example.org", "a".repeat(240))));
        assert_eq!(n, name(&long), "stable");
    }

    #[test]
    fn a_new_configmap_names_its_node_and_reads_back() {
        let e = Entry::new(Utc::now(), "cordon");
        let cm = new_configmap("n1", std::slice::from_ref(&e));
        assert_eq!(cm.metadata.labels.as_ref().unwrap()[LABEL], "true");
        assert_eq!(
            cm.metadata.annotations.as_ref().unwrap()[NODE_ANNOTATION],
            "n1"
        );
        assert_eq!(entries_of(&cm).unwrap(), vec![e]);
        assert!(entries_of(&ConfigMap::default()).unwrap().is_empty());
    }
}
