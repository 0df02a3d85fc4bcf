//! Migration-label rules: remove a label from this node once a condition holds (e.g. OKE's
//! `last-migration-failure` once the node's Cilium pod is Ready).
//!
//! [`evaluate`] is pure (node + pods on the node → removals). [`watch`] keeps a cache of the own
//! node and, while a rule's label is on it, of the pods on it (field selectors `metadata.name`
//! and `spec.nodeName`: the agent sees nothing else) and re-evaluates on every change. Removals
//! go into the node report for the controller, or — `mode = "direct"` — through
//! [`LabelRemover`] as a patch of the own node.

pub mod config;

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use tokio::sync::mpsc;

pub use config::{CleanupRule, LabelsConfig, RemovalMode};

use crate::k8s::selectors::LabelSelector;
use crate::wire::LabelRemoval;

/// Errors of the label rules; each names the node, label or selector.
#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    /// A rule's selector does not parse.
    #[error("label rule for `{label}`: {source}")]
    Selector {
        /// The label of the rule.
        label: String,
        /// The parse error.
        source: crate::k8s::selectors::SelectorError,
    },
    /// The API refused or failed the patch.
    #[error("cannot remove label `{label}` from node {node}: {source}")]
    Patch {
        /// The node.
        node: String,
        /// The label.
        label: String,
        /// The API error.
        source: kube::Error,
    },
}

/// A rule with its selector parsed.
#[derive(Debug, Clone)]
pub struct Rule {
    rule: CleanupRule,
    selector: Option<LabelSelector>,
}

/// Parses the rules (selectors were validated with the config; this re-parses for use).
pub fn compile(cfg: &LabelsConfig) -> Result<Vec<Rule>, LabelError> {
    cfg.cleanup
        .iter()
        .map(|r| {
            let selector = match &r.when_pod_ready {
                Some(p) => Some(LabelSelector::parse(&p.selector).map_err(|source| {
                    LabelError::Selector {
                        label: r.label.clone(),
                        source,
                    }
                })?),
                None => None,
            };
            Ok(Rule {
                rule: r.clone(),
                selector,
            })
        })
        .collect()
}

/// The removals the rules want now: a rule fires when its label is on the node and its
/// condition holds. Pods not bound to `node` are ignored, whatever the caller passed.
pub fn evaluate(rules: &[Rule], node: &Node, pods: &[Pod]) -> Vec<LabelRemoval> {
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let labels = node.metadata.labels.as_ref();
    let mut out = Vec::new();
    for r in rules {
        if !labels.is_some_and(|l| l.contains_key(&r.rule.label)) {
            continue;
        }
        let reason = match (&r.rule.when_pod_ready, &r.selector, &r.rule.when_condition) {
            (Some(p), Some(sel), _) => pods
                .iter()
                .filter(|pod| {
                    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name)
                })
                .filter(|pod| pod.metadata.namespace.as_deref() == Some(p.namespace.as_str()))
                .filter(|pod| pod.metadata.deletion_timestamp.is_none())
                .filter(|pod| sel.matches(pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
                .find(|pod| pod_ready(pod))
                .map(|pod| {
                    format!(
                        "pod {}/{} ({}) is Ready",
                        p.namespace,
                        pod.metadata.name.as_deref().unwrap_or("?"),
                        p.selector
                    )
                }),
            (_, _, Some(c)) => node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| {
                    cs.iter()
                        .find(|x| x.type_ == c.type_ && x.status == c.status)
                })
                .map(|_| format!("node condition {}={}", c.type_, c.status)),
            _ => None,
        };
        if let Some(reason) = reason {
            out.push(LabelRemoval {
                label: r.rule.label.clone(),
                reason,
            });
        }
    }
    out
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Carries out a removal on the own node.
pub trait LabelRemover: Send + Sync {
    /// Removes `label` from `node`.
    fn remove(
        &self,
        node: &str,
        label: &str,
    ) -> impl std::future::Future<Output = Result<(), LabelError>> + Send;
}

/// Removes by a JSON merge patch of the node (`mode = "direct"`).
#[derive(Clone)]
pub struct PatchRemover {
    nodes: Api<Node>,
}

impl PatchRemover {
    /// A remover using `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            nodes: Api::all(client),
        }
    }
}

impl LabelRemover for PatchRemover {
    async fn remove(&self, node: &str, label: &str) -> Result<(), LabelError> {
        let patch = serde_json::json!({ "metadata": { "labels": { label: null } } });
        self.nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|source| LabelError::Patch {
                node: node.to_string(),
                label: label.to_string(),
                source,
            })
    }
}

/// Whether the pods on `node` can matter now: a rule that waits for a pod has its label on the
/// node. Only then does [`watch`] watch the node's pods (most nodes carry no such label: their
/// agents watch their Node alone).
pub fn needs_pods(rules: &[Rule], node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    rules
        .iter()
        .any(|r| r.selector.is_some() && labels.is_some_and(|l| l.contains_key(&r.rule.label)))
}

type EventStream<K> = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>,
>;

/// The watch of the pods on the node, with its cache; started and dropped by [`watch`].
struct PodWatch {
    store: reflector::Store<Pod>,
    events: EventStream<Pod>,
}

impl PodWatch {
    fn start(client: &kube::Client, node: &str) -> Self {
        let (store, writer) = reflector::store::<Pod>();
        let cfg = watcher::Config::default()
            .fields(&format!("spec.nodeName={node}"))
            .timeout(crate::k8s::watch_timeout_secs());
        let events = reflector(writer, watcher(Api::<Pod>::all(client.clone()), cfg))
            .default_backoff()
            .boxed();
        PodWatch { store, events }
    }

    fn pods(&self) -> Vec<Pod> {
        self.store.state().iter().map(|p| (**p).clone()).collect()
    }
}

/// The next event of the pod watch, if one runs; never otherwise.
async fn next_pod_event(w: &mut Option<PodWatch>) -> Option<Result<(), watcher::Error>> {
    match w {
        Some(w) => w.events.next().await.map(|r| r.map(|_| ())),
        None => std::future::pending().await,
    }
}

/// Watches the own node, and the pods on it while [`needs_pods`], and sends the wanted removals
/// whenever they change (an empty list when none). Runs until `stop` is cancelled. With
/// `remover`, removals are also carried out directly (each label once per appearance; a failed
/// patch is retried with jittered backoff until it succeeds or the rule no longer fires).
pub async fn watch<R: LabelRemover>(
    client: kube::Client,
    node: String,
    rules: Vec<Rule>,
    remover: Option<R>,
    tx: mpsc::Sender<Vec<LabelRemoval>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let (node_store, node_writer) = reflector::store::<Node>();
    let node_cfg = watcher::Config::default()
        .fields(&format!("metadata.name={node}"))
        .timeout(crate::k8s::watch_timeout_secs());
    // Every watcher event counts, not only touched objects: the stores fill at `InitDone`.
    let mut nodes = reflector(
        node_writer,
        watcher(Api::<Node>::all(client.clone()), node_cfg),
    )
    .default_backoff()
    .boxed();
    let mut pods: Option<PodWatch> = None;
    let mut last: Option<Vec<LabelRemoval>> = None;
    let mut retry = Retry::default();
    loop {
        let retrying = tokio::select! {
            _ = stop.cancelled() => return,
            _ = retry.wait() => true,
            item = nodes.next() => match item {
                None => return,
                Some(Err(error)) => { tracing::warn!(%node, %error, "label rules: node watch error (retrying)"); continue; }
                Some(Ok(_)) => false,
            },
            item = next_pod_event(&mut pods) => match item {
                None => { pods = None; false }
                Some(Err(error)) => { tracing::warn!(%node, %error, "label rules: pod watch error (retrying)"); continue; }
                Some(Ok(())) => false,
            },
        };
        let Some(n) = node_store.get(&reflector::ObjectRef::new(&node)) else {
            continue;
        };
        match (needs_pods(&rules, &n), pods.is_some()) {
            (true, false) => {
                tracing::debug!(%node, "label rules: a rule's label is on the node; watching its pods");
                pods = Some(PodWatch::start(&client, &node));
            }
            (false, true) => {
                tracing::debug!(%node, "label rules: no rule's label left; pod watch stopped");
                pods = None;
            }
            _ => {}
        }
        let on_node = pods.as_ref().map(PodWatch::pods).unwrap_or_default();
        let wanted = evaluate(&rules, &n, &on_node);
        let changed = last.as_ref() != Some(&wanted);
        if !changed && !retrying {
            continue;
        }
        if let Some(r) = &remover {
            let failed = remove_all(r, &node, &wanted).await;
            retry.after(failed);
        }
        if !changed {
            continue;
        }
        for w in &wanted {
            tracing::info!(%node, label = %w.label, reason = %w.reason, "label rule fired");
        }
        if tx.send(wanted.clone()).await.is_err() {
            return;
        }
        last = Some(wanted);
    }
}

/// Carries out `wanted` on `node`; true when any removal failed (it is then retried).
async fn remove_all<R: LabelRemover>(r: &R, node: &str, wanted: &[LabelRemoval]) -> bool {
    let mut failed = false;
    for w in wanted {
        match r.remove(node, &w.label).await {
            Ok(()) => {
                tracing::info!(%node, label = %w.label, reason = %w.reason, "label removed")
            }
            Err(error) => {
                tracing::warn!(%error, "label removal failed; retrying");
                failed = true;
            }
        }
    }
    failed
}

/// Jittered exponential backoff for failed direct removals (a failed patch is retried even
/// when nothing else changes on the node).
#[derive(Debug, Default)]
struct Retry {
    failures: u32,
    at: Option<tokio::time::Instant>,
}

impl Retry {
    const BASE: std::time::Duration = std::time::Duration::from_millis(100);
    const MAX: std::time::Duration = std::time::Duration::from_secs(30);

    fn after(&mut self, failed: bool) {
        if !failed {
            *self = Retry::default();
            return;
        }
        self.failures = self.failures.saturating_add(1);
        // The first retry waits 2 × BASE, as before the shared rule (crates/core/src/backoff.rs).
        let delay = crate::backoff::delay(Self::BASE, Self::MAX, self.failures.saturating_add(1));
        self.at = Some(tokio::time::Instant::now() + delay);
    }

    /// Resolves when a retry is due; never while none is scheduled.
    async fn wait(&mut self) {
        match self.at {
            Some(at) => {
                tokio::time::sleep_until(at).await;
                self.at = None;
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::labels::config::{NodeConditionIs, PodReady};

    fn node(labels: &[(&str, &str)], conds: &[(&str, &str)]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "n1", "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>() },
            "status": { "conditions": conds.iter().map(|(t, s)| serde_json::json!({"type": t, "status": s})).collect::<Vec<_>>() }
        }))
        .unwrap()
    }

    fn pod(name: &str, ns: &str, node: &str, app: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": ns, "labels": { "k8s-app": app } },
            "spec": { "nodeName": node, "containers": [] },
            "status": { "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] }
        }))
        .unwrap()
    }

    fn rules() -> Vec<Rule> {
        compile(&LabelsConfig {
            mode: RemovalMode::Report,
            cleanup: vec![
                CleanupRule {
                    label: "last-migration-failure".into(),
                    when_pod_ready: Some(PodReady {
                        namespace: "kube-system".into(),
                        selector: "k8s-app=cilium".into(),
                    }),
                    when_condition: None,
                },
                CleanupRule {
                    label: "example.com/net-pending".into(),
                    when_pod_ready: None,
                    when_condition: Some(NodeConditionIs {
                        type_: "NetworkUnavailable".into(),
                        status: "False".into(),
                    }),
                },
            ],
        })
        .unwrap()
    }

    #[test]
    fn table() {
        let r = rules();
        let labelled = node(&[("last-migration-failure", "get_kubesvc_failure")], &[]);
        // (pods, expected removals)
        let cases: Vec<(Vec<Pod>, usize, &str)> = vec![
            (vec![], 0, "no cilium pod"),
            (
                vec![pod("c1", "kube-system", "n1", "cilium", false)],
                0,
                "cilium not Ready",
            ),
            (
                vec![pod("c1", "kube-system", "n2", "cilium", true)],
                0,
                "Ready cilium on another node",
            ),
            (
                vec![pod("c1", "default", "n1", "cilium", true)],
                0,
                "Ready pod in another namespace",
            ),
            (
                vec![pod("c1", "kube-system", "n1", "coredns", true)],
                0,
                "other app",
            ),
            (
                vec![pod("c1", "kube-system", "n1", "cilium", true)],
                1,
                "Ready cilium here",
            ),
        ];
        for (pods, want, why) in cases {
            assert_eq!(evaluate(&r, &labelled, &pods).len(), want, "{why}");
        }
        let unlabelled = node(&[], &[("NetworkUnavailable", "False")]);
        assert!(
            evaluate(
                &r,
                &unlabelled,
                &[pod("c1", "kube-system", "n1", "cilium", true)]
            )
            .is_empty(),
            "label absent"
        );
        let both = node(
            &[
                ("last-migration-failure", "x"),
                ("example.com/net-pending", ""),
            ],
            &[("NetworkUnavailable", "False")],
        );
        let got = evaluate(&r, &both, &[pod("c1", "kube-system", "n1", "cilium", true)]);
        assert_eq!(
            got.iter().map(|g| g.label.as_str()).collect::<Vec<_>>(),
            vec!["last-migration-failure", "example.com/net-pending"]
        );
        assert!(got[0].reason.contains("kube-system/c1"), "{got:?}");
    }

    #[test]
    fn the_pods_are_watched_only_while_a_pod_rules_label_is_on_the_node() {
        let r = rules();
        // (node labels, pods needed)
        let cases: [(&[(&str, &str)], bool); 4] = [
            (&[], false),
            (&[("pool", "spot")], false),
            // The condition rule's label: its condition is on the Node, no pod needed.
            (&[("example.com/net-pending", "")], false),
            (&[("last-migration-failure", "x"), ("pool", "spot")], true),
        ];
        for (labels, want) in cases {
            assert_eq!(needs_pods(&r, &node(labels, &[])), want, "{labels:?}");
        }
    }

    #[test]
    fn config_validation() {
        let bad = LabelsConfig {
            mode: RemovalMode::Report,
            cleanup: vec![
                CleanupRule {
                    label: "-bad".into(),
                    when_pod_ready: None,
                    when_condition: None,
                },
                CleanupRule {
                    label: "ok".into(),
                    when_pod_ready: Some(PodReady {
                        namespace: "kube-system".into(),
                        selector: "k8s-app in (a".into(),
                    }),
                    when_condition: None,
                },
            ],
        };
        let d = bad.validate();
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].message.contains("not a valid label key"));
        assert!(d[1].message.contains("exactly one of"));
        assert!(
            d[2].message.contains("unable to parse requirement"),
            "{d:?}"
        );
    }
}
