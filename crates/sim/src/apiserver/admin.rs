//! The admin API under `/sim/v1/`: tokens, heartbeats, node conditions, faults, time, state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::auth::TokenRequest;
use super::error::ApiError;
use super::handlers::{error_response, json_response};
use super::resources::well_known;
use super::store::WriteTarget;
use super::Sim;

/// Injected API faults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultSpec {
    /// Probability (0..=1) per HTTP status code that a resource request fails with that code.
    #[serde(default)]
    pub error_rates: BTreeMap<u16, f64>,
    /// Latency added to every resource request, in milliseconds.
    #[serde(default)]
    pub latency_ms: u64,
}

/// Current faults.
#[derive(Debug, Default)]
pub struct Faults(Mutex<FaultSpec>);

impl Faults {
    /// Replaces the fault spec.
    pub fn set(&self, spec: FaultSpec) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = spec;
    }

    /// The current spec.
    pub fn get(&self) -> FaultSpec {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Applies latency and maybe fails a request.
    pub async fn before_request(&self) -> Result<(), ApiError> {
        let spec = self.get();
        if spec.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(spec.latency_ms)).await;
        }
        let mut rng = rand::rng();
        for (code, rate) in &spec.error_rates {
            if rng.random::<f64>() < *rate {
                let reason = match code {
                    429 => "TooManyRequests",
                    500 => "InternalError",
                    503 => "ServiceUnavailable",
                    504 => "Timeout",
                    409 => "Conflict",
                    _ => "InjectedFault",
                };
                return Err(ApiError::new(
                    *code,
                    reason,
                    format!("fault injected by nodekeeper sim ({code})"),
                ));
            }
        }
        Ok(())
    }
}

/// Per-node switches used by the simulated kubelets.
#[derive(Debug, Default)]
pub struct NodeControls {
    stopped: Mutex<HashSet<String>>,
    pinned: Mutex<HashMap<String, Vec<Value>>>,
}

impl NodeControls {
    /// Whether the node's kubelet heartbeat is stopped.
    pub fn heartbeat_stopped(&self, node: &str) -> bool {
        self.stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(node)
    }

    /// Stops or restarts a node's heartbeat.
    pub fn set_heartbeat(&self, node: &str, stopped: bool) {
        let mut s = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        if stopped {
            s.insert(node.to_string());
        } else {
            s.remove(node);
        }
    }

    /// Conditions pinned by the admin API (the kubelet does not overwrite those types).
    pub fn pinned(&self, node: &str) -> Vec<Value> {
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .cloned()
            .unwrap_or_default()
    }

    fn pin(&self, node: &str, cond: Value) {
        let mut p = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        let list = p.entry(node.to_string()).or_default();
        list.retain(|c| c["type"] != cond["type"]);
        list.push(cond);
    }

    fn stopped_list(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        v.sort();
        v
    }
}

/// Upserts a condition (by `type`) into a node's status.
pub fn upsert_condition(node: &mut Value, cond: &Value) {
    if !node.get("status").is_some_and(Value::is_object) {
        node["status"] = json!({});
    }
    let list = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut out: Vec<Value> = list
        .into_iter()
        .filter(|c| c["type"] != cond["type"])
        .collect();
    out.push(cond.clone());
    node["status"]["conditions"] = Value::Array(out);
}

/// The admin router (mounted at the root; paths start with `/sim/v1/`).
pub fn router() -> Router<Arc<Sim>> {
    Router::new()
        .route("/sim/v1/tokens", post(mint_token))
        .route("/sim/v1/nodes/{name}/heartbeat", post(heartbeat))
        .route("/sim/v1/nodes/{name}/conditions", post(set_condition))
        .route(
            "/sim/v1/faults",
            get(get_faults).put(put_faults).delete(clear_faults),
        )
        .route("/sim/v1/watches/drop", post(drop_watches))
        .route("/sim/v1/compact", post(compact))
        .route("/sim/v1/time/advance", post(advance))
        .route("/sim/v1/state", get(state))
}

fn ok(v: Value) -> Response {
    json_response(StatusCode::OK, &v)
}

async fn mint_token(State(sim): State<Arc<Sim>>, Json(req): Json<TokenRequest>) -> Response {
    let (token, exp) = sim.tokens.mint(&sim.store.clock, req);
    ok(json!({"token": token, "expirationTimestamp": exp}))
}

#[derive(Debug, Deserialize)]
struct HeartbeatBody {
    stopped: bool,
}

async fn heartbeat(
    State(sim): State<Arc<Sim>>,
    Path(name): Path<String>,
    Json(b): Json<HeartbeatBody>,
) -> Response {
    if sim.store.get(well_known::nodes(), "", &name).is_none() {
        return error_response(&ApiError::not_found(well_known::nodes(), &name));
    }
    sim.nodes.set_heartbeat(&name, b.stopped);
    ok(json!({"node": name, "heartbeatStopped": b.stopped}))
}

#[derive(Debug, Deserialize)]
struct ConditionBody {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

async fn set_condition(
    State(sim): State<Arc<Sim>>,
    Path(name): Path<String>,
    Json(b): Json<ConditionBody>,
) -> Response {
    let now = sim.store.clock.stamp();
    let cond = json!({"type": b.type_, "status": b.status, "reason": b.reason, "message": b.message,
        "lastHeartbeatTime": now, "lastTransitionTime": now});
    let res = sim.store.txn(|t| {
        t.modify(well_known::nodes(), "", &name, WriteTarget::Internal, |n| {
            let mut n = n.clone();
            upsert_condition(&mut n, &cond);
            Ok(n)
        })
    });
    match res {
        Ok(node) => {
            sim.nodes.pin(&name, cond);
            ok((*node).clone())
        }
        Err(e) => error_response(&e),
    }
}

async fn get_faults(State(sim): State<Arc<Sim>>) -> Response {
    ok(serde_json::to_value(sim.faults.get()).unwrap_or_default())
}

async fn put_faults(State(sim): State<Arc<Sim>>, Json(spec): Json<FaultSpec>) -> Response {
    if let Some((code, rate)) = spec
        .error_rates
        .iter()
        .find(|(c, r)| !(400..600).contains(*c) || !(0.0..=1.0).contains(*r))
    {
        return error_response(&ApiError::bad_request(format!(
            "invalid error rate {rate} for status {code}"
        )));
    }
    sim.faults.set(spec.clone());
    ok(serde_json::to_value(spec).unwrap_or_default())
}

async fn clear_faults(State(sim): State<Arc<Sim>>) -> Response {
    sim.faults.set(FaultSpec::default());
    ok(json!({}))
}

async fn drop_watches(State(sim): State<Arc<Sim>>) -> Response {
    sim.drop_watches();
    ok(json!({"dropped": true}))
}

async fn compact(State(sim): State<Arc<Sim>>) -> Response {
    sim.store.compact();
    ok(json!({"compactedTo": sim.store.resource_version().to_string()}))
}

#[derive(Debug, Deserialize)]
struct AdvanceBody {
    seconds: u64,
}

async fn advance(State(sim): State<Arc<Sim>>, Json(b): Json<AdvanceBody>) -> Response {
    sim.store.clock.advance(Duration::from_secs(b.seconds));
    ok(json!({"now": sim.store.clock.stamp()}))
}

async fn state(State(sim): State<Arc<Sim>>) -> Response {
    let mut dump = sim.store.dump();
    dump["now"] = json!(sim.store.clock.stamp());
    dump["timeScale"] = json!(sim.store.clock.scale());
    dump["heartbeatStopped"] = json!(sim.nodes.stopped_list());
    dump["faults"] = serde_json::to_value(sim.faults.get()).unwrap_or_default();
    ok(dump)
}
