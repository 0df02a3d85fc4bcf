//! kube-rs against `nodekeeper sim apiserver` over HTTP: cordon, evict, watcher/reflector, Controller,
//! Lease-based leader election, TokenReview, bad input.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher, Controller, WatchStreamExt};
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use serde_json::json;

async fn bare() -> TestCluster {
    TestCluster::start(SimOptions::bare()).await.unwrap()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"pool": "a"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
    .unwrap()
}

fn ready_pod(name: &str, app: &str, node: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}))
    .unwrap()
}

fn pdb(name: &str, app: &str, min: i32) -> PodDisruptionBudget {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"minAvailable": min, "selector": {"matchLabels": {"app": app}}}}))
    .unwrap()
}

fn api_code(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn raw(
    url: &str,
    method: &str,
    path: &str,
    ct: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let client = nodekeeper_sim::apiserver::client_for(url).unwrap();
    let req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ct)
        .body(body)
        .unwrap();
    match client.request::<serde_json::Value>(req).await {
        Ok(v) => (200, v),
        Err(kube::Error::Api(s)) => (s.code, serde_json::to_value(&*s).unwrap()),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

#[tokio::test]
async fn cordon_uncordon_and_conflicts() {
    let c = bare().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let created = nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let n = nodes.cordon("n1").await.unwrap();
    assert_eq!(n.spec.unwrap().unschedulable, Some(true));
    let n = nodes.uncordon("n1").await.unwrap();
    assert_ne!(n.spec.and_then(|s| s.unschedulable), Some(true));
    // A replace with the stale resourceVersion of the first version is a 409.
    let (code, msg) = api_code(
        nodes
            .replace("n1", &PostParams::default(), &created)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 409, "{msg}");
    // Server-side apply merges fields and requires a field manager.
    let pp = PatchParams::apply("nodekeeper-test");
    let patch = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"applied": "yes"}}});
    let n = nodes.patch("n1", &pp, &Patch::Apply(&patch)).await.unwrap();
    let labels = n.metadata.labels.unwrap();
    assert_eq!(labels["applied"], "yes");
    assert_eq!(
        labels["pool"], "a",
        "apply keeps fields it does not mention"
    );
    // Status patch with conditions merged by type.
    let st = json!({"status": {"conditions": [{"type": "NodekeeperHealthy", "status": "False"}]}});
    let n = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&st))
        .await
        .unwrap();
    let types: Vec<String> = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, vec!["Ready", "NodekeeperHealthy"]);
    let (code, _) = api_code(nodes.get("missing").await.unwrap_err());
    assert_eq!(code, 404);
}

#[tokio::test]
async fn evict_honours_pdbs() {
    let c = bare().await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.client.clone(), "default");
    for (p, n) in [("web-1", "n1"), ("web-2", "n2")] {
        pods.create(&PostParams::default(), &ready_pod(p, "web", n))
            .await
            .unwrap();
    }
    pdbs.create(&PostParams::default(), &pdb("web-pdb", "web", 2))
        .await
        .unwrap();
    let (code, msg) = api_code(
        pods.evict("web-1", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 429);
    assert!(msg.contains("web-pdb"), "{msg}");
    let (code, _) = api_code(
        pods.evict("nope", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 404);
    // Two PDBs over one pod: 500.
    pdbs.create(&PostParams::default(), &pdb("second", "web", 0))
        .await
        .unwrap();
    let (code, msg) = api_code(
        pods.evict("web-1", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500, "{msg}");
    pdbs.delete("second", &DeleteParams::default())
        .await
        .unwrap();
    pdbs.patch(
        "web-pdb",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
    )
    .await
    .unwrap();
    let st = pods.evict("web-1", &EvictParams::default()).await.unwrap();
    assert!(st.is_success());
    assert!(pods.get_opt("web-1").await.unwrap().is_none());
    // Now one healthy pod left and minAvailable 1: blocked again.
    let (code, _) = api_code(
        pods.evict("web-2", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 429);
}

#[tokio::test]
async fn eviction_dry_run_deletes_nothing() {
    let c = bare().await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.client.clone(), "default");
    for (p, n) in [("web-1", "n1"), ("web-2", "n2")] {
        pods.create(&PostParams::default(), &ready_pod(p, "web", n))
            .await
            .unwrap();
    }
    pdbs.create(&PostParams::default(), &pdb("web-pdb", "web", 1))
        .await
        .unwrap();
    // The body as the apiserver reads it. (Not kube's `EvictParams`: it serializes its delete
    // options as `delete_options`, a field the apiserver drops, so the pod would be evicted.)
    let dry_evict = |name: &'static str| {
        let pods = pods.clone();
        async move {
            let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": "default"},
                "deleteOptions": {"dryRun": ["All"]}});
            pods.create_subresource::<_, kube::core::Status>(
                "eviction",
                name,
                &PostParams::default(),
                &body,
            )
            .await
        }
    };
    // Allowed by the PDB: success, and the pod is still there (twice: no budget was spent).
    for _ in 0..2 {
        assert!(dry_evict("web-1").await.unwrap().is_success());
        let p = pods.get("web-1").await.unwrap();
        assert!(p.metadata.deletion_timestamp.is_none());
    }
    // Still checked against the PDB.
    pdbs.patch(
        "web-pdb",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 2}})),
    )
    .await
    .unwrap();
    let (code, _) = api_code(dry_evict("web-1").await.unwrap_err());
    assert_eq!(code, 429);
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
}

#[tokio::test]
async fn terminating_namespace_refuses_new_content_and_evictions() {
    use k8s_openapi::api::core::v1::Namespace;
    let c = bare().await;
    let nss: Api<Namespace> = Api::all(c.client.clone());
    let ns: Namespace = serde_json::from_value(
        json!({"metadata": {"name": "doomed", "finalizers": ["test.nodekeeper.io/hold"]}}),
    )
    .unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "doomed");
    pods.create(&PostParams::default(), &ready_pod("crate-1", "crate", "n1"))
        .await
        .unwrap();
    nss.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let phase = nss.get("doomed").await.unwrap().status.unwrap().phase;
    assert_eq!(phase.as_deref(), Some("Terminating"));
    let cause = |e: kube::Error| match e {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert_eq!(
                s.message,
                format!("pods \"{}\" is forbidden: unable to create new content in namespace doomed because it is being terminated",
                    s.details.as_ref().unwrap().name)
            );
            s.details.unwrap().causes[0].reason.clone()
        }
        other => panic!("{other:?}"),
    };
    let e = pods
        .create(&PostParams::default(), &ready_pod("late", "crate", "n1"))
        .await
        .unwrap_err();
    assert_eq!(cause(e), "NamespaceTerminating");
    let e = pods
        .evict("crate-1", &EvictParams::default())
        .await
        .unwrap_err();
    assert_eq!(cause(e), "NamespaceTerminating");
    // Deletes are still allowed; once the finalizer goes, the namespace and its content go.
    assert!(pods.get_opt("crate-1").await.unwrap().is_some());
    nss.patch(
        "doomed",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(nss.get_opt("doomed").await.unwrap().is_none());
    let all: Api<Pod> = Api::all(c.client.clone());
    assert!(all
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
}

#[tokio::test]
async fn node_events_outside_default_get_the_real_422() {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::events::v1::Event;
    let c = bare().await;
    let nss: Api<Namespace> = Api::all(c.client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "nodekeeper"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let ev: Event = serde_json::from_value(json!({"metadata": {"name": "n1.abcde"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "regarding": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        "reason": "AgentSilent", "action": "MarkUnknown", "note": "x", "type": "Warning",
        "reportingController": "nodekeeper.io/controller", "reportingInstance": "c-1"}))
    .unwrap();
    let wrong: Api<Event> = Api::namespaced(c.client.clone(), "nodekeeper");
    let e = wrong.create(&PostParams::default(), &ev).await.unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("{e:?}")
    };
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        s.message,
        "Event.events.k8s.io \"n1.abcde\" is invalid: involvedObject.namespace: Invalid value: \"\": does not match event.namespace"
    );
    assert_eq!(
        s.details.unwrap().causes[0].field,
        "involvedObject.namespace"
    );
    let right: Api<Event> = Api::namespaced(c.client.clone(), "default");
    right.create(&PostParams::default(), &ev).await.unwrap();
}

#[tokio::test]
async fn watcher_reflector_survive_drops_and_410() {
    let c = bare().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    nodes
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    let (reader, writer) = reflector::store::<Node>();
    let stream =
        reflector(writer, watcher(nodes.clone(), watcher::Config::default())).applied_objects();
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        while s.next().await.is_some() {}
    });
    reader.wait_until_ready().await.unwrap();
    assert_eq!(reader.state().len(), 1);
    nodes
        .create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    wait_for(|| reader.state().len() == 2).await;
    // Drop every watch, and compact history: the watcher gets 410 on resume and relists.
    c.sim.store.compact();
    c.sim.drop_watches();
    nodes
        .create(&PostParams::default(), &node("c"))
        .await
        .unwrap();
    wait_for(|| reader.state().len() == 3).await;
    nodes.delete("a", &DeleteParams::default()).await.unwrap();
    wait_for(|| reader.state().len() == 2).await;
    task.abort();

    // A raw watch from a compacted version is 410 Gone; from a recent one it resumes.
    let rv = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    c.sim.store.compact();
    let mut old = nodes
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match old.next().await {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        Some(Err(kube::Error::Api(s))) => assert_eq!(s.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
    let mut fresh = nodes
        .watch(&WatchParams::default().labels("pool=a"), &rv)
        .await
        .unwrap()
        .boxed();
    nodes
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "z"}}})),
        )
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), fresh.next())
        .await
        .unwrap()
    {
        Some(Ok(WatchEvent::Deleted(n))) => assert_eq!(
            n.metadata.name.as_deref(),
            Some("b"),
            "leaving the selector is DELETED"
        ),
        other => panic!("expected DELETED for b, got {other:?}"),
    }
}

async fn wait_for(cond: impl Fn() -> bool) {
    crate::support::wait::until(Duration::from_secs(5), "the reflector's store", || {
        std::future::ready(cond())
    })
    .await
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

#[tokio::test]
async fn controller_reconciles_nodes() {
    let c = bare().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("n2"))
        .await
        .unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let ctx = Arc::new((nodes.clone(), seen.clone()));
    let ctl = Controller::new(nodes.clone(), watcher::Config::default()).run(
        |n: Arc<Node>, ctx: Arc<(Api<Node>, Arc<AtomicUsize>)>| async move {
            ctx.1.fetch_add(1, Ordering::SeqCst);
            let name = n.metadata.name.clone().unwrap_or_default();
            let labels = n.metadata.labels.clone().unwrap_or_default();
            if !labels.contains_key("reconciled") {
                let p = json!({"metadata": {"labels": {"reconciled": "true"}}});
                ctx.0
                    .patch(&name, &PatchParams::default(), &Patch::Merge(p))
                    .await
                    .map_err(|_| Never)?;
            }
            Ok::<_, Never>(Action::await_change())
        },
        |_n, _e: &Never, _ctx| Action::requeue(Duration::from_secs(1)),
        ctx,
    );
    let task = tokio::spawn(ctl.for_each(|_| async {}));
    let all_labelled = || async {
        let list = nodes
            .list(&ListParams::default().labels("reconciled=true"))
            .await
            .unwrap();
        list.items.len()
    };
    for _ in 0..200 {
        if all_labelled().await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(all_labelled().await, 2);
    nodes
        .create(&PostParams::default(), &node("n3"))
        .await
        .unwrap();
    for _ in 0..200 {
        if all_labelled().await == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(all_labelled().await, 3, "a new node is reconciled");
    assert!(seen.load(Ordering::SeqCst) >= 3);
    task.abort();
}

/// Tries to take or renew the lease; returns whether `me` holds it afterwards.
async fn try_lead(leases: &Api<Lease>, me: &str, ttl: i32) -> bool {
    let now = chrono::Utc::now();
    let Some(cur) = leases.get_opt("leader").await.unwrap() else {
        let l: Lease = serde_json::from_value(json!({"metadata": {"name": "leader"},
            "spec": {"holderIdentity": me, "leaseDurationSeconds": ttl,
                     "renewTime": now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)}}))
        .unwrap();
        return leases.create(&PostParams::default(), &l).await.is_ok();
    };
    let spec = cur.spec.clone().unwrap_or_default();
    let now_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let expired = spec
        .renew_time
        .map(|t| t.0.as_millisecond() + i64::from(ttl) * 1000 < now_ms)
        .unwrap_or(true);
    if spec.holder_identity.as_deref() != Some(me) && !expired {
        return false;
    }
    let mut next = cur.clone();
    let s = next.spec.get_or_insert_with(Default::default);
    s.holder_identity = Some(me.to_string());
    s.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    // replace carries the resourceVersion we read: a concurrent writer makes this a 409.
    leases
        .replace("leader", &PostParams::default(), &next)
        .await
        .is_ok()
}

#[tokio::test]
async fn lease_leader_election() {
    let c = bare().await;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-system");
    assert!(try_lead(&leases, "a", 1).await);
    assert!(
        !try_lead(&leases, "b", 1).await,
        "b must not steal a live lease"
    );
    assert!(try_lead(&leases, "a", 1).await, "a renews");
    let stale = leases.get("leader").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(try_lead(&leases, "b", 1).await, "b takes the expired lease");
    let (code, _) = api_code(
        leases
            .replace("leader", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 409, "a stale holder cannot overwrite");
    let l = leases.get("leader").await.unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn token_cli_and_tokenreview() {
    let c = bare().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args([
            "sim",
            "token",
            "--server",
            &c.url,
            "--pod",
            "agent-x",
            "--node",
            "n7",
            "--audience",
            "nodekeeper",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let reviews: Api<TokenReview> = Api::all(c.client.clone());
    let review = |tok: &str, aud: &str| {
        serde_json::from_value::<TokenReview>(json!({"spec": {"token": tok, "audiences": [aud]}}))
            .unwrap()
    };
    let ok = reviews
        .create(&PostParams::default(), &review(&token, "nodekeeper"))
        .await
        .unwrap();
    let st = ok.status.unwrap();
    assert_eq!(st.authenticated, Some(true));
    let extra = st.user.unwrap().extra.unwrap();
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        vec!["agent-x".to_string()]
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-name"],
        vec!["n7".to_string()]
    );
    let bad = reviews
        .create(&PostParams::default(), &review("forged", "nodekeeper"))
        .await
        .unwrap();
    assert_eq!(bad.status.unwrap().authenticated, Some(false));
    let wrong = reviews
        .create(&PostParams::default(), &review(&token, "other"))
        .await
        .unwrap();
    assert_eq!(wrong.status.unwrap().authenticated, Some(false));
}

#[tokio::test]
async fn bad_input_gets_status_errors_and_never_corrupts() {
    let c = bare().await;
    let u = c.url.as_str();
    let j = "application/json";
    let (code, st) = raw(u, "POST", "/api/v1/nodes", j, b"{not json".to_vec()).await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (400, Some("BadRequest")),
        "{st}"
    );
    let (code, _) = raw(
        u,
        "POST",
        "/api/v1/nodes",
        "application/yaml",
        b"a: [b".to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    let (code, st) = raw(u, "POST", "/api/v1/nodes", j, vec![b' '; 4 * 1024 * 1024]).await;
    assert_eq!(code, 413, "{st}");
    let (code, _) = raw(u, "GET", "/apis/example.com/v1/widgets", j, vec![]).await;
    assert_eq!(code, 404);
    let (code, _) = raw(
        u,
        "POST",
        "/api/v1/nodes",
        j,
        br#"{"kind":"Pod","metadata":{"name":"x"}}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 400, "kind mismatch");
    let (code, _) = raw(u, "GET", "/api/v1/pods?labelSelector=a%20in%20b", j, vec![]).await;
    assert_eq!(code, 400);
    let (code, _) = raw(
        u,
        "GET",
        "/api/v1/pods?fieldSelector=spec.bogus%3Dx",
        j,
        vec![],
    )
    .await;
    assert_eq!(code, 400);
    let (code, _) = raw(
        u,
        "POST",
        "/api/v1/nodes",
        j,
        br#"{"metadata":{"name":"n1"}}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = raw(
        u,
        "PATCH",
        "/api/v1/nodes/n1",
        "application/json-patch+json",
        br#"[{"op":"test","path":"/metadata/name","value":"zz"}]"#.to_vec(),
    )
    .await;
    assert_eq!(code, 422);
    let (code, _) = raw(
        u,
        "PATCH",
        "/api/v1/nodes/n1",
        "application/json-patch+json",
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    let (code, _) = raw(u, "PATCH", "/api/v1/nodes/n1", "text/plain", b"{}".to_vec()).await;
    assert_eq!(code, 415);
    let (code, _) = raw(
        u,
        "PATCH",
        "/api/v1/nodes/n1",
        "application/apply-patch+yaml",
        b"metadata: {}".to_vec(),
    )
    .await;
    assert_eq!(code, 400, "apply without fieldManager");
    let (code, _) = raw(
        u,
        "PATCH",
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        br#"{"spec":"x"}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 400, "a patch that breaks the object's shape");
    let (code, _) = raw(
        u,
        "POST",
        "/api/v1/namespaces/default/pods",
        j,
        br#"{"metadata":{"name":"p"},"spec":[1]}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    let (code, _) = raw(
        u,
        "POST",
        "/api/v1/namespaces/default/pods/nope/eviction",
        j,
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(code, 404);
    let (code, _) = raw(u, "GET", "/api/v1/nodes?limit=x", j, vec![]).await;
    assert_eq!(code, 400);
    let (code, _) = raw(u, "GET", "/api/v1/nodes?continue=garbage!", j, vec![]).await;
    assert_eq!(code, 400);
    let nodes: Api<Node> = Api::all(c.client.clone());
    let n = nodes.get("n1").await.unwrap();
    assert_eq!(
        n.metadata.name.as_deref(),
        Some("n1"),
        "the store is intact"
    );
    let list = nodes.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(list.items.len(), 1);
}

#[tokio::test]
async fn faults_are_injected_and_cleared() {
    let c = bare().await;
    let (code, _) = raw(
        &c.url,
        "PUT",
        "/sim/v1/faults",
        "application/json",
        br#"{"errorRates":{"503":1.0}}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 200);
    let nodes: Api<Node> = Api::all(c.client.clone());
    let (code, _) = api_code(nodes.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 503);
    let (code, _) = raw(
        &c.url,
        "DELETE",
        "/sim/v1/faults",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 200);
    assert!(nodes.list(&ListParams::default()).await.is_ok());
}

#[tokio::test]
async fn recorder_events_show_up_as_core_events() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::Resource;
    let c = bare().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let n = nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let recorder = Recorder::new(
        c.client.clone(),
        Reporter {
            controller: "nodekeeper".into(),
            instance: None,
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "Cordoned".into(),
        note: Some("cordoned for repair".into()),
        action: "Cordon".into(),
        secondary: None,
    };
    recorder.publish(&ev, &n.object_ref(&())).await.unwrap();
    recorder.publish(&ev, &n.object_ref(&())).await.unwrap();
    let core: Api<CoreEvent> = Api::namespaced(c.client.clone(), "default");
    let list = core
        .list(&ListParams::default().fields("involvedObject.name=n1"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1, "one event, with a series");
    let e = &list.items[0];
    assert_eq!(e.reason.as_deref(), Some("Cordoned"));
    assert_eq!(e.message.as_deref(), Some("cordoned for repair"));
    assert_eq!(e.count, Some(2));
}

/// `POST serviceaccounts/NAME/token` as kube-apiserver serves it: 404 for a missing account or
/// pod, 409 for a pod uid that does not match, and a token bound to a pod names the pod and its
/// node in TokenReview (an unbound one names neither).
#[tokio::test]
async fn token_request_binds_to_the_pod_and_its_node() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let c = bare().await;
    let accounts: Api<ServiceAccount> = Api::namespaced(c.client.clone(), "default");
    let request = |pod: Option<(&str, &str)>| {
        let mut spec = json!({"audiences": ["nodekeeper"], "expirationSeconds": 600});
        if let Some((name, uid)) = pod {
            spec["boundObjectRef"] =
                json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid});
        }
        serde_json::from_value::<TokenRequest>(json!({"spec": spec})).unwrap()
    };
    let pp = PostParams::default();
    let (code, _) = api_code(
        accounts
            .create_token_request("agent", &pp, &request(None))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 404, "no such ServiceAccount");
    accounts
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "agent"}})).unwrap(),
        )
        .await
        .unwrap();
    let pod = Api::<Pod>::namespaced(c.client.clone(), "default")
        .create(&pp, &ready_pod("agent-x", "agent", "n7"))
        .await
        .unwrap();
    let uid = pod.metadata.uid.unwrap();
    for (name, id, want) in [("nope", uid.as_str(), 404), ("agent-x", "other-uid", 409)] {
        let (code, msg) = api_code(
            accounts
                .create_token_request("agent", &pp, &request(Some((name, id))))
                .await
                .unwrap_err(),
        );
        assert_eq!(code, want, "{name}/{id}: {msg}");
    }
    let bound = accounts
        .create_token_request("agent", &pp, &request(Some(("agent-x", &uid))))
        .await
        .unwrap();
    let e = review_extra(&c, bound.status.unwrap().token).await;
    assert_eq!(e["authentication.kubernetes.io/pod-name"], ["agent-x"]);
    assert_eq!(e["authentication.kubernetes.io/node-name"], ["n7"]);
    let unbound = accounts
        .create_token_request("agent", &pp, &request(None))
        .await
        .unwrap();
    let e = review_extra(&c, unbound.status.unwrap().token).await;
    assert!(
        !e.contains_key("authentication.kubernetes.io/node-name"),
        "{e:?}"
    );
}

/// TokenReview of `token` (audience `nodekeeper`): authenticated as `default/agent`; its `extra`.
async fn review_extra(
    c: &TestCluster,
    token: String,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let r: TokenReview =
        serde_json::from_value(json!({"spec": {"token": token, "audiences": ["nodekeeper"]}}))
            .unwrap();
    let st = Api::<TokenReview>::all(c.client.clone())
        .create(&PostParams::default(), &r)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(st.authenticated, Some(true));
    let user = st.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:agent")
    );
    user.extra.unwrap_or_default()
}

/// With the loops on, the eviction subresource decides from the status the disruption loop wrote
/// and spends it at once: of a Deployment's 3 pods under `maxUnavailable: 1`, one eviction passes
/// and the next, sent straight after (before any replacement is Ready), is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_spend_the_status_the_disruption_loop_wrote() {
    use k8s_openapi::api::apps::v1::Deployment;
    let c = TestCluster::start(SimOptions {
        time_scale: 10.0,
        ..Default::default()
    })
    .await
    .unwrap();
    let pp = PostParams::default();
    Api::<Node>::all(c.client.clone())
        .create(&pp, &node("n1"))
        .await
        .unwrap();
    let deploy: Deployment = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]}}}}))
    .unwrap();
    Api::<Deployment>::namespaced(c.client.clone(), "default")
        .create(&pp, &deploy)
        .await
        .unwrap();
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}}))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.client.clone(), "default");
    pdbs.create(&pp, &pdb).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        let s = pdbs.get("web").await.unwrap().status;
        if let Some(s) = s.filter(|s| s.disruptions_allowed == 1 && s.current_healthy == 3) {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the disruption loop never wrote 3 healthy, 1 allowed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((status.expected_pods, status.desired_healthy), (3, 2));
    assert_eq!(status.observed_generation, Some(1));
    let names: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    pods.evict(&names[0], &EvictParams::default())
        .await
        .unwrap();
    let (code, msg) = api_code(
        pods.evict(&names[1], &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 429, "{msg}");
    assert_eq!(
        pdbs.get("web")
            .await
            .unwrap()
            .status
            .unwrap()
            .disruptions_allowed,
        0
    );
}
