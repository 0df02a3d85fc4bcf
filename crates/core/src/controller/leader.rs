//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Optimistic concurrency (resourceVersion on every replace) makes at most one replica win a
//! takeover. The holder renews every `retry_period`; it steps down on its own when it could not
//! renew for `lease_duration - retry_period` (before anyone else may take over), and on shutdown it
//! releases the Lease (empty holder) so the other replica takes over at its next retry instead of
//! waiting for expiry.
//!
//! Choice for two replicas: both serve reports (so a Service can route to either and a failover
//! loses nothing); only the leader writes to the API. A follower keeps each node's latest report
//! in memory and writes it when it becomes leader; it does not acknowledge events, so agents keep
//! resending them until the leader records them.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Lease-based election for one replica.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    retry: Duration,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Elector {
    /// An elector for Lease `namespace/name` as `identity`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
        retry: Duration,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            duration,
            retry,
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn spec(&self, transitions: i32, acquire: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquire.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt: true when this replica holds the Lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let l = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(0, None)),
            };
            return match self.api.create(&PostParams::default(), &l).await {
                Ok(_) => Ok(true),
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(t), Some(d)) => {
                t.0.as_millisecond() + i64::from(d) * 1000
                    < k8s_openapi::jiff::Timestamp::now().as_millisecond()
            }
            _ => true,
        };
        if !mine && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquire = if mine {
            spec.acquire_time.clone()
        } else {
            None
        };
        lease.spec = Some(self.spec(transitions, acquire));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this replica holds it.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }

    /// Runs the election until `cancel`, publishing leadership on `tx`; releases the Lease at the end.
    pub async fn run(self, tx: watch::Sender<bool>, cancel: CancellationToken) {
        let mut last_renew: Option<Instant> = None;
        let grace = self.duration.saturating_sub(self.retry);
        loop {
            let held = match self.try_acquire_or_renew().await {
                Ok(true) => {
                    last_renew = Some(Instant::now());
                    true
                }
                Ok(false) => false,
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "lease renewal failed");
                    last_renew.is_some_and(|t| t.elapsed() < grace)
                }
            };
            if !held {
                last_renew = None;
            }
            let was = *tx.borrow();
            if was != held {
                tracing::info!(identity = %self.identity, leader = held, "leadership changed");
                let _ = tx.send(held);
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(self.retry) => {}
            }
        }
        let _ = tx.send(false);
        if let Err(e) = self.release().await {
            tracing::warn!(lease = %self.name, error = %e, "cannot release the lease");
        }
    }
}
