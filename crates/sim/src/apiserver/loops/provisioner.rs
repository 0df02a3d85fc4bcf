//! A Karpenter-like provisioner: every scenario node has a NodeClaim (finalizer
//! `karpenter.sh/termination`).
//! - A NodeClaim someone else creates (no `status.nodeName` yet) is launched like Karpenter's own:
//!   `launch_delay` after its creation a Ready node of its pool, named after the claim, appears.
//! - Deleting a NodeClaim drains nothing: after `terminate_delay` the node is removed and the claim
//!   released. Karpenter brings capacity only for pods left pending; the sim's stand-in for that is
//!   the pool's size: when the pool (with the claims still launching) is below its scenario count, a
//!   replacement node appears after `launch_delay`.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::{name_of, LoopOptions};
use crate::apiserver::clock::parse_time;
use crate::apiserver::resources::well_known;
use crate::apiserver::scenario::{node_object, nodeclaim_object};
use crate::apiserver::store::{Filter, WriteTarget};
use crate::apiserver::Sim;

/// Finalizer the provisioner puts on NodeClaims.
pub const FINALIZER: &str = "karpenter.sh/termination";

/// State: replacements waiting for their launch time.
#[derive(Debug, Default)]
pub struct Provisioner {
    pending: Vec<(String, DateTime<Utc>)>,
    launched: u64,
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
            if deleted + terminate > now {
                continue;
            }
            let node = claim
                .pointer("/status/nodeName")
                .and_then(Value::as_str)
                .unwrap_or(name_of(&claim))
                .to_string();
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
