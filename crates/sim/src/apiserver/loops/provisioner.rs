//! A Karpenter-like provisioner: every scenario node has a NodeClaim (finalizer
//! `karpenter.sh/termination`).
//! - A NodeClaim someone else creates (no `status.nodeName` yet) is launched like Karpenter's own:
//!   `launch_delay` after its creation a Ready node of its pool, named after the claim, appears.
//! - Deleting a NodeClaim terminates its node as Karpenter v1.14.1 does (`pkg/controllers/node/termination`):
//!   the Node is deleted (it carries Karpenter's finalizer, so it stays with a `deletionTimestamp`),
//!   tainted `karpenter.sh/disrupted:NoSchedule` and labelled
//!   `node.kubernetes.io/exclude-from-external-load-balancers=karpenter`, then **drained**: the pods
//!   that do not tolerate the taint and are not mirror pods, in Karpenter's priority groups
//!   (non-critical, non-critical DaemonSet, critical, critical DaemonSet: the next group only once the
//!   previous one is gone), each through the Eviction API (so PodDisruptionBudgets hold: a 429 is
//!   retried on the next pass), with an `Evicted` Event (`Evicted pod: Forceful Termination`) per pod
//!   evicted and a `FailedDraining` Warning on the Node per refusal; pods marked
//!   `karpenter.sh/do-not-disrupt: "true"` are waited for, not evicted. Once no such pod is left and
//!   `terminate_delay` has passed since the deletion (the instance's termination), the node is
//!   removed and the claim released. Not modelled: the NodeClaim's `terminationGracePeriod` (pods
//!   deleted past it), VolumeAttachments, and the 5 s minimum drain time. Pods stuck terminating
//!   (more than a minute past their `deletionTimestamp`, e.g. on a node whose kubelet is gone) are
//!   not waited for, as Karpenter's `IsStuckTerminating`.
//! - Karpenter brings capacity only for pods left pending; the sim's stand-in for that is the pool's
//!   size: when the pool (with the claims still launching) is below its scenario count, a
//!   replacement node appears after `launch_delay`.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::recorder::{self, About};
use super::{name_of, ns_of, tolerates, LoopOptions};
use crate::apiserver::clock::parse_time;
use crate::apiserver::eviction;
use crate::apiserver::resources::well_known;
use crate::apiserver::scenario::{node_object, nodeclaim_object};
use crate::apiserver::selectors::FieldSelector;
use crate::apiserver::store::{Filter, WriteTarget};
use crate::apiserver::Sim;

/// Finalizer the provisioner puts on NodeClaims (and its termination on the Nodes it terminates).
pub const FINALIZER: &str = "karpenter.sh/termination";

/// The taint Karpenter's termination puts on a node before it drains it.
pub const DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";

/// The pod annotation that makes Karpenter's drain wait for a pod instead of evicting it.
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// The label Karpenter puts on a node it terminates (out of load balancers while it drains).
const LB_EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// State: replacements waiting for their launch time.
#[derive(Debug, Default)]
pub struct Provisioner {
    pending: Vec<(String, DateTime<Utc>)>,
    launched: u64,
    /// (node, pod) whose refused eviction was reported (one `FailedDraining` per pod and node, as
    /// Karpenter's recorder deduplicates its events).
    refused: HashSet<(String, String)>,
}

impl Provisioner {
    /// One pass.
    pub fn tick(&mut self, sim: &Sim, o: &LoopOptions) {
        let now = sim.store.clock.now();
        let terminate = chrono::Duration::from_std(o.terminate_delay).unwrap_or_default();
        let launch = chrono::Duration::from_std(o.launch_delay).unwrap_or_default();
        for claim in sim
            .store
            .list(well_known::nodeclaims(), &Filter::default(), None, None)
            .items
        {
            let Some(deleted) = claim
                .pointer("/metadata/deletionTimestamp")
                .and_then(Value::as_str)
                .and_then(parse_time)
            else {
                continue;
            };
            let node = claim
                .pointer("/status/nodeName")
                .and_then(Value::as_str)
                .unwrap_or(name_of(&claim))
                .to_string();
            if sim.store.get(well_known::nodes(), "", &node).is_some() {
                start_termination(sim, &node);
                if !self.drain(sim, &node) {
                    continue;
                }
            }
            if deleted + terminate > now {
                continue;
            }
            let pool = claim
                .pointer("/metadata/labels/karpenter.sh~1nodepool")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            sim.store.txn(|t| {
                t.remove(well_known::nodes(), "", &node);
                let _ = t.modify(
                    well_known::nodeclaims(),
                    "",
                    name_of(&claim),
                    WriteTarget::Internal,
                    |c| {
                        let mut c = c.clone();
                        let fins: Vec<Value> = c
                            .pointer("/metadata/finalizers")
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default();
                        c["metadata"]["finalizers"] =
                            Value::Array(fins.into_iter().filter(|f| f != FINALIZER).collect());
                        Ok(c)
                    },
                );
            });
            if !pool.is_empty() && self.below_size(sim, &pool) {
                self.pending.push((pool, now + launch));
            }
        }
        self.launch_created_claims(sim, now, launch);
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(p, _)| p.clone())
            .collect();
        self.pending.retain(|(_, at)| *at > now);
        for pool_name in due {
            self.launch(sim, &pool_name);
        }
    }

    /// Whether `pool` has fewer nodes (live, plus claims launching, plus replacements queued) than
    /// its scenario count.
    fn below_size(&self, sim: &Sim, pool: &str) -> bool {
        let Some(want) = sim
            .opts
            .scenario
            .pools
            .iter()
            .find(|p| p.name == pool)
            .map(|p| p.count)
        else {
            return false;
        };
        let live = sim
            .store
            .list(well_known::nodeclaims(), &Filter::default(), None, None)
            .items
            .iter()
            .filter(|c| {
                c.pointer("/metadata/labels/karpenter.sh~1nodepool")
                    .and_then(Value::as_str)
                    == Some(pool)
            })
            .filter(|c| c.pointer("/metadata/deletionTimestamp").is_none())
            .count();
        let queued = self.pending.iter().filter(|(p, _)| p == pool).count();
        live + queued < want
    }

    /// Launches the NodeClaims created by someone else (no node yet) once `launch` has passed.
    fn launch_created_claims(&mut self, sim: &Sim, now: DateTime<Utc>, launch: chrono::Duration) {
        for claim in sim
            .store
            .list(well_known::nodeclaims(), &Filter::default(), None, None)
            .items
        {
            if claim.pointer("/status/nodeName").is_some()
                || claim.pointer("/metadata/deletionTimestamp").is_some()
            {
                continue;
            }
            let created = claim
                .pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .and_then(parse_time);
            if created.is_some_and(|c| c + launch > now) {
                continue;
            }
            let name = name_of(&claim).to_string();
            let pool_name = claim
                .pointer("/metadata/labels/karpenter.sh~1nodepool")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(pool) = sim.opts.scenario.pools.iter().find(|p| p.name == pool_name) else {
                tracing::warn!(nodeclaim = %name, pool = pool_name, "NodeClaim of no scenario pool: not launched");
                continue;
            };
            let stamp = sim.store.clock.stamp();
            sim.store.txn(|t| {
                let _ = t.create(well_known::nodes(), "", node_object(pool, &name, &stamp));
                let _ = t.modify(
                    well_known::nodeclaims(),
                    "",
                    &name,
                    WriteTarget::Internal,
                    |c| {
                        let mut c = c.clone();
                        let launched = nodeclaim_object(pool, &name);
                        c["status"] = launched["status"].clone();
                        let fins = c["metadata"]["finalizers"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default();
                        if !fins.iter().any(|f| f == FINALIZER) {
                            let mut fins = fins;
                            fins.push(json!(FINALIZER));
                            c["metadata"]["finalizers"] = Value::Array(fins);
                        }
                        Ok(c)
                    },
                );
            });
        }
    }

    fn launch(&mut self, sim: &Sim, pool_name: &str) {
        let Some(pool) = sim.opts.scenario.pools.iter().find(|p| p.name == pool_name) else {
            tracing::warn!(
                pool = pool_name,
                "no such pool in the scenario: replacement not launched"
            );
            return;
        };
        self.launched += 1;
        let name = format!("{}-r{}", pool.name, self.launched);
        let now = sim.store.clock.stamp();
        sim.store.txn(|t| {
            let _ = t.create(well_known::nodes(), "", node_object(pool, &name, &now));
            let mut claim = nodeclaim_object(pool, &name);
            claim["metadata"]["finalizers"] = json!([FINALIZER]);
            let _ = t.create(well_known::nodeclaims(), "", claim);
        });
    }
}

/// Karpenter's NodeClaim finalizer deletes the Node (its finalizer keeps it, `deletionTimestamp`
/// set), and the Node's finalizer taints it `karpenter.sh/disrupted:NoSchedule` and labels it out of
/// load balancers. Idempotent.
fn start_termination(sim: &Sim, node: &str) {
    sim.store.txn(|t| {
        let Some(n) = t.get(well_known::nodes(), "", node) else {
            return;
        };
        let taints = n
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let tainted = taints
            .iter()
            .any(|x| x["key"] == DISRUPTED_TAINT && x["effect"] == "NoSchedule");
        let finalized = n
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER));
        let labelled = n
            .pointer("/metadata/labels")
            .and_then(|l| l.get(LB_EXCLUDE))
            == Some(&json!("karpenter"));
        if !(tainted && finalized && labelled) {
            let _ = t.modify(well_known::nodes(), "", node, WriteTarget::Internal, |n| {
                let mut n = n.clone();
                if !finalized {
                    let mut fins = n["metadata"]["finalizers"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    fins.push(json!(FINALIZER));
                    n["metadata"]["finalizers"] = Value::Array(fins);
                }
                if !tainted {
                    // Karpenter replaces a taint of the same key with another effect.
                    let mut ts: Vec<Value> = taints
                        .iter()
                        .filter(|x| x["key"] != DISRUPTED_TAINT)
                        .cloned()
                        .collect();
                    ts.push(json!({"key": DISRUPTED_TAINT, "effect": "NoSchedule"}));
                    n["spec"]["taints"] = Value::Array(ts);
                }
                n["metadata"]["labels"][LB_EXCLUDE] = json!("karpenter");
                Ok(n)
            });
        }
        if n.pointer("/metadata/deletionTimestamp").is_none() {
            let _ = t.delete(well_known::nodes(), "", node, &Default::default());
        }
    });
}

/// Karpenter's priority group of a pod: non-critical (0), non-critical DaemonSet (1), critical (2),
/// critical DaemonSet (3).
fn priority_group(pod: &Value) -> u8 {
    let critical = matches!(
        pod.pointer("/spec/priorityClassName")
            .and_then(Value::as_str),
        Some("system-cluster-critical" | "system-node-critical")
    );
    let daemon = owned_by(pod, "DaemonSet");
    u8::from(critical) * 2 + u8::from(daemon)
}

fn owned_by(pod: &Value, kind: &str) -> bool {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|os| os.iter().any(|o| o["kind"] == kind))
}

impl Provisioner {
    /// One pass of Karpenter's drain of `node`: true once no pod is left waiting for eviction.
    fn drain(&mut self, sim: &Sim, node: &str) -> bool {
        let Ok(fields) = FieldSelector::parse(&format!("spec.nodeName={node}"), "Pod") else {
            return false;
        };
        let filter = Filter {
            fields,
            ..Default::default()
        };
        let taint = json!({"key": DISRUPTED_TAINT, "effect": "NoSchedule"});
        let now = sim.store.clock.now();
        // Waiting for eviction (`IsWaitingEviction`): not terminal, not tolerating the taint, not a
        // mirror pod, not stuck terminating (its deletionTimestamp, which includes the grace period,
        // more than a minute ago: a dead kubelet's pods do not hold the node). Terminating pods are
        // otherwise still waited for.
        let waiting: Vec<_> = sim
            .store
            .list(well_known::pods(), &filter, None, None)
            .items
            .into_iter()
            .filter(|p| {
                !matches!(
                    p.pointer("/status/phase").and_then(Value::as_str),
                    Some("Succeeded" | "Failed")
                )
            })
            .filter(|p| !tolerates(p, &taint) && !owned_by(p, "Node"))
            .filter(|p| {
                p.pointer("/metadata/deletionTimestamp")
                    .and_then(Value::as_str)
                    .and_then(parse_time)
                    .is_none_or(|d| now - d <= chrono::Duration::minutes(1))
            })
            .collect();
        let Some(first) = waiting.iter().map(|p| priority_group(p)).min() else {
            self.refused.retain(|(n, _)| n != node);
            return true;
        };
        for pod in waiting.iter().filter(|p| priority_group(p) == first) {
            // Evictable (`IsEvictable`): not terminating, no active do-not-disrupt.
            if pod.pointer("/metadata/deletionTimestamp").is_some()
                || pod
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(DO_NOT_DISRUPT))
                    == Some(&json!("true"))
            {
                continue;
            }
            let (ns, name) = (ns_of(pod).to_string(), name_of(pod).to_string());
            let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns}});
            sim.store.txn(|t| match eviction::evict(t, &ns, &name, &body) {
            Ok(_) => recorder::record(
                t,
                About {
                    obj: pod,
                    kind: "Pod",
                    api_version: "v1",
                },
                "karpenter",
                "Evict",
                "Evicted",
                "Evicted pod: Forceful Termination".to_string(),
            ),
            Err(e) if e.code == 429 => {
                if !self.refused.insert((node.to_string(), name.clone())) {
                    return;
                }
                if let Some(n) = t.get(well_known::nodes(), "", node) {
                    recorder::record_typed(
                        t,
                        About {
                            obj: &n,
                            kind: "Node",
                            api_version: "v1",
                        },
                        "karpenter",
                        "Drain",
                        "FailedDraining",
                        format!(
                            "Failed to drain node, evicting pod violates a PDB (Pod={ns}/{name})"
                        ),
                        "Warning",
                    );
                }
            }
            Err(e) => {
                tracing::debug!(pod = %name, namespace = %ns, error = %e.message, "karpenter drain: eviction failed");
            }
        });
        }
        false
    }
}
