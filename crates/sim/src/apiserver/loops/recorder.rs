//! Events the simulated controllers record, as their real counterparts do (`Scheduled` by the
//! scheduler, `SuccessfulCreate`/`SuccessfulDelete` by the ReplicaSet and DaemonSet controllers,
//! `ScalingReplicaSet` by the Deployment controller), so `kubectl get events` and the Events of
//! `kubectl describe` show them. Written as `events.k8s.io/v1` Events, which the store mirrors into
//! core `v1`.

use serde_json::{json, Value};

use super::{name_of, ns_of, uid_of};
use crate::apiserver::resources::well_known;
use crate::apiserver::store::Txn;

/// What an event is about: the object, its kind and apiVersion.
#[derive(Debug, Clone, Copy)]
pub struct About<'a> {
    /// The regarding object.
    pub obj: &'a Value,
    /// Its kind.
    pub kind: &'a str,
    /// Its apiVersion.
    pub api_version: &'a str,
}

/// Records a Normal event `reason` with `note` about `about` from `controller` (action `action`).
pub fn record(
    t: &mut Txn<'_>,
    about: About<'_>,
    controller: &str,
    action: &str,
    reason: &str,
    note: String,
) {
    record_typed(t, about, controller, action, reason, note, "Normal");
}

/// [`record`] with the event's `type_` (`Normal` or `Warning`).
pub fn record_typed(
    t: &mut Txn<'_>,
    about: About<'_>,
    controller: &str,
    action: &str,
    reason: &str,
    note: String,
    type_: &str,
) {
    let obj = about.obj;
    let ns = match ns_of(obj) {
        "" => "default",
        n => n,
    };
    let now = t.now_micro();
    let ev = json!({
        "metadata": {"name": format!("{}.{:016x}", name_of(obj), rand::random::<u64>())},
        "eventTime": now,
        "reportingController": controller,
        "reportingInstance": format!("{controller}-nodekeeper-sim"),
        "action": action,
        "reason": reason,
        "regarding": {"apiVersion": about.api_version, "kind": about.kind, "name": name_of(obj),
            "namespace": ns_of(obj), "uid": uid_of(obj),
            "resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)},
        "note": note,
        "type": type_,
    });
    let _ = t.create(well_known::new_events(), ns, ev);
}
