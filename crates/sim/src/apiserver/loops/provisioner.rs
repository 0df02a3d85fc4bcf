//! A Karpenter-like provisioner: every scenario node has a NodeClaim (finalizer
//! `karpenter.sh/termination`). Deleting a NodeClaim drains nothing: after `terminate_delay` the node
//! is removed and the claim released; after `launch_delay` a replacement node of the same pool appears.

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
            if !pool.is_empty() {
                self.pending.push((pool, now + launch));
            }
        }
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
