//! OCI IMDS with v1 disabled: `/opc/v1/…` and `/openstack/…` answer 404; `/opc/v2/…` needs
//! `Authorization: Bearer Oracle` (else 401); requests with `Forwarded`, `X-Forwarded-For` or
//! `X-Forwarded-Host` are refused (400).
//!
//! OCI has no documented IMDS preemption or maintenance endpoint. This emulator serves injected
//! notices at [`PREEMPT_PATH`] and [`MAINTENANCE_PATH`] (emulator conventions, not OCI APIs) so
//! the generic poller (`[[sources.oci.poll_paths]]`) can be exercised end to end.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::Router;

use super::{forwarded, json, text, Shared};

/// Where injected preemptions are served (emulator convention).
pub const PREEMPT_PATH: &str = "/opc/v2/instance/preemptionAction";
/// Where injected maintenance events are served (emulator convention).
pub const MAINTENANCE_PATH: &str = "/opc/v2/instance/maintenanceEvent";
/// The emulated instance.
pub const INSTANCE_ID: &str = "ocid1.instance.oc1.phx.emulated";

pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new().fallback(handle)
}

fn instance() -> serde_json::Value {
    serde_json::json!({
        "availabilityDomain": "qIZq:PHX-AD-1",
        "faultDomain": "FAULT-DOMAIN-2",
        "compartmentId": "ocid1.compartment.oc1..emulated",
        "displayName": "nodekeeper-emulated",
        "hostname": "nodekeeper-emulated",
        "id": INSTANCE_ID,
        "image": "ocid1.image.oc1.phx.emulated",
        "metadata": {
            "ssh_authorized_keys": "ssh-ed25519 AAAAemulated",
            "user_data": "IyEvdXNyL2Jpbi9lbnYgYmFzaAplY2hvIHNlY3JldAo=",
            "oke-is-preemptible": "true"
        },
        "region": "phx",
        "canonicalRegionName": "us-phoenix-1",
        "ociAdName": "phx-ad-1",
        "shape": "VM.Standard.E5.Flex",
        "state": "Running",
        "timeCreated": 1_767_225_600_000_i64,
        "regionInfo": {"realmKey": "oc1", "realmDomainComponent": "oraclecloud.com", "regionKey": "PHX", "regionIdentifier": "us-phoenix-1"},
        "agentConfig": {"monitoringDisabled": true, "managementDisabled": true}
    })
}

async fn handle(State(s): State<Arc<Shared>>, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    let not_found = || text(StatusCode::NOT_FOUND, "Not Found\n");
    if forwarded(&headers) {
        return text(StatusCode::BAD_REQUEST, "Bad Request\n");
    }
    let Some(rest) = path.strip_prefix("/opc/v2/") else {
        return not_found(); // v1 disabled, /openstack disabled, anything else unknown
    };
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
    if auth != Some("Bearer Oracle") {
        return text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
    }
    let g = s.lock();
    match path {
        PREEMPT_PATH => {
            return match &g.preempt {
                Some(p) => json(&serde_json::json!({"action": p.code, "time": p.at.to_rfc3339()})),
                None => not_found(),
            }
        }
        MAINTENANCE_PATH => {
            return match &g.maintenance {
                Some(m) => json(&serde_json::json!({
                    "instanceAction": m.code, "maintenanceCategory": "FLEXIBLE", "lifecycleState": "SCHEDULED",
                    "timeWindowStart": m.at.to_rfc3339(), "id": m.id
                })),
                None => not_found(),
            }
        }
        _ => {}
    }
    drop(g);
    let doc = instance();
    let rest = rest.trim_end_matches('/');
    if rest == "instance" {
        return json(&doc);
    }
    if rest == "vnics" {
        return json(
            &serde_json::json!([{"vnicId": "ocid1.vnic.oc1.phx.emulated", "privateIp": "10.0.0.2",
            "vlanTag": 0, "macAddr": "02:00:17:00:00:01", "virtualRouterIp": "10.0.0.1", "subnetCidrBlock": "10.0.0.0/24", "nicIndex": 0}]),
        );
    }
    let Some(field) = rest.strip_prefix("instance/") else {
        return not_found();
    };
    let value = field.split('/').try_fold(&doc, |v, k| v.get(k));
    match value {
        Some(serde_json::Value::String(s)) => text(StatusCode::OK, s.clone()),
        Some(v @ serde_json::Value::Object(_)) => json(v),
        Some(v) => text(StatusCode::OK, v.to_string()),
        None => not_found(),
    }
}
