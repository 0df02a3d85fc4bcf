//! Node-state layer, scale, staleness, restarts, OCI Events and leader failover against the sim.
//!
//! Sim only: scale and staleness at a scaled clock; the node-state conditions run on both in
//! `tests/e2e` (`labels`, `events`).

use crate::support::ctl;
use crate::support::wait;

use std::sync::atomic::Ordering;
use std::time::Duration;

use ctl::*;
use nodekeeper_core::agent::checks::ConditionStatus::{False, True};
use serde_json::json;

/// The Events in `default` (where the controller records every Node Event).
async fn node_events(env: &Env) -> Vec<k8s_openapi::api::events::v1::Event> {
    let evs: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::namespaced(
        env.cluster.client.clone(),
        nodekeeper_core::controller::cluster::events::NODE_EVENT_NAMESPACE,
    );
    evs.list(&Default::default()).await.unwrap().items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_keeps_conditions_and_removes_stale_types() {
    let env = Env::new(1).await;
    let nodes = env.nodes();
    let t0 = env.token("n0", "nodekeeper").await;
    let a = env.controller(&env.config(), true).await;
    let http = https(&env.ca, a.addr);
    let r = report(
        "n0",
        1,
        &[
            ("NodekeeperDiskPressure", True),
            ("NodekeeperKernelDeadlock", False),
        ],
    );
    assert_eq!(
        post(&http, a.addr, Some(&t0), &serde_json::to_value(&r).unwrap())
            .await
            .0,
        200
    );
    let before = conditions(&nodes, "n0").await;
    assert_eq!(before.len(), 2);
    a.stop().await;

    let b = env.controller(&env.config(), true).await;
    // Nothing is wiped by a restart: not by its start, nor by its first maintenance pass.
    wait::until(Duration::from_secs(10), "a maintenance pass", || {
        std::future::ready(
            b.app
                .states
                .counters
                .maintenance_passes
                .load(Ordering::Relaxed)
                >= 1,
        )
    })
    .await;
    assert_eq!(conditions(&nodes, "n0").await, before);
    // The agent (new instance after its own restart) no longer reports KernelDeadlock: removed;
    // DiskPressure keeps its transition time.
    let http = https(&env.ca, b.addr);
    let mut r2 = report("n0", 1, &[("NodekeeperDiskPressure", True)]);
    r2.agent_instance = "inst-2".into();
    assert_eq!(
        post(
            &http,
            b.addr,
            Some(&t0),
            &serde_json::to_value(&r2).unwrap()
        )
        .await
        .0,
        200
    );
    let after = conditions(&nodes, "n0").await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        vec!["NodekeeperDiskPressure"]
    );
    assert_eq!(
        after["NodekeeperDiskPressure"].2,
        before["NodekeeperDiskPressure"].2
    );
    // Conditions nodekeeper does not own are never touched.
    let all = nodes
        .get("n0")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap_or_default();
    assert!(all
        .iter()
        .all(|c| c.type_.starts_with("Nodekeeper") || c.type_ == "Ready"));
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_agent_goes_unknown_and_recovers() {
    let env = Env::new(2).await;
    let nodes = env.nodes();
    let mut cfg = env.config();
    cfg.staleness = Duration::from_secs(2);
    let c = env.controller(&cfg, true).await;
    let http = https(&env.ca, c.addr);
    let (t0, t1) = (
        env.token("n0", "nodekeeper").await,
        env.token("n1", "nodekeeper").await,
    );
    for (n, t) in [("n0", &t0), ("n1", &t1)] {
        let mut r = report(n, 1, &[("NodekeeperDiskPressure", False)]);
        // A free-form reason from the agent's rules: sanitised into a valid Event reason.
        r.check_events = vec![nodekeeper_core::agent::checks::CheckEvent {
            reason: "kernel: task hung".into(),
            message: "INFO: task jbd2 blocked for more than 120 seconds".into(),
            severity: nodekeeper_core::agent::checks::EventSeverity::Warning,
        }];
        assert_eq!(
            post(&http, c.addr, Some(t), &serde_json::to_value(&r).unwrap())
                .await
                .0,
            200
        );
    }
    // n1 keeps reporting; n0 goes silent.
    let mut seq = 1;
    let end = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < end {
        seq += 1;
        let r = report("n1", seq, &[("NodekeeperDiskPressure", False)]);
        assert_eq!(
            post(&http, c.addr, Some(&t1), &serde_json::to_value(&r).unwrap())
                .await
                .0,
            200
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let n0 = conditions(&nodes, "n0").await;
    assert_eq!(n0["NodekeeperDiskPressure"].0, "Unknown");
    assert_eq!(n0["NodekeeperDiskPressure"].1, "AgentNotReporting");
    assert_eq!(
        conditions(&nodes, "n1").await["NodekeeperDiskPressure"].0,
        "False"
    );
    // The Events: in `default` (the sim refuses Node Events elsewhere, like the apiserver), about
    // the Node by its real uid.
    let uid = |n: &str| {
        let nodes = nodes.clone();
        let n = n.to_string();
        async move { nodes.get(&n).await.unwrap().metadata.uid.unwrap() }
    };
    let (u0, u1) = (uid("n0").await, uid("n1").await);
    let evs = node_events(&env).await;
    let find = |reason: &str, uid: &str| {
        evs.iter().any(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid)
        })
    };
    assert!(
        find("KernelTaskHung", &u0) && find("KernelTaskHung", &u1),
        "{evs:#?}"
    );
    assert!(find("AgentSilent", &u0), "{evs:#?}");
    assert!(evs.iter().all(|e| e.type_.as_deref() == Some("Warning")));
    assert_eq!(c.app.states.recorder_failures(), 0);
    // It reports again: back to its real status.
    let r = report("n0", 2, &[("NodekeeperDiskPressure", False)]);
    assert_eq!(
        post(&http, c.addr, Some(&t0), &serde_json::to_value(&r).unwrap())
            .await
            .0,
        200
    );
    assert_eq!(
        conditions(&nodes, "n0").await["NodekeeperDiskPressure"].0,
        "False"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_agents_concurrently() {
    const N: usize = 1000;
    let env = Env::new(N).await;
    // Over HTTP/1.1 the burst opens up to N connections at once from this one process; on 2 loaded
    // cores a connection's request head can come more than the default 3 s `idle_timeout` (also the
    // first head's deadline) after its handshake, and the server cuts it (an agent would retry).
    // This test is about N concurrent reports' state, so it gives them the former 10 s.
    let mut cfg = env.config();
    cfg.idle_timeout = Duration::from_secs(10);
    // All N in flight at once, none turned away (`max_reports_in_flight`, default 256, sheds the
    // rest with 503 + Retry-After: `controller_connections.rs` tests that).
    cfg.max_reports_in_flight = N;
    let c = env.controller(&cfg, true).await;
    let http = https(&env.ca, c.addr);
    use futures::StreamExt;
    let tokens: Vec<String> = futures::stream::iter(0..N)
        .map(|i| {
            let env = &env;
            async move { env.token(&format!("n{i}"), "nodekeeper").await }
        })
        .buffered(32)
        .collect()
        .await;
    let status = |i: usize| if i % 3 == 0 { True } else { False };
    // The controller answers before the burst.
    assert_eq!(get(&http, c.addr, "/readyz").await.unwrap().0, 200);
    let codes = futures::future::join_all((0..N).map(|i| {
        let (http, t) = (http.clone(), tokens[i].clone());
        let r = report(
            &format!("n{i}"),
            1,
            &[
                ("NodekeeperDiskPressure", status(i)),
                ("NodekeeperPidPressure", False),
            ],
        );
        async move {
            post(&http, c.addr, Some(&t), &serde_json::to_value(&r).unwrap())
                .await
                .0
        }
    }))
    .await;
    assert!(
        codes.iter().all(|c| *c == 200),
        "{:?}",
        codes.iter().filter(|c| **c != 200).collect::<Vec<_>>()
    );
    let all = env.nodes().list(&Default::default()).await.unwrap();
    let mut checked = 0;
    for n in all.items {
        let name = n.metadata.name.unwrap();
        let i: usize = name[1..].parse().unwrap();
        let conds = n.status.unwrap().conditions.unwrap();
        let d = conds
            .iter()
            .find(|c| c.type_ == "NodekeeperDiskPressure")
            .unwrap();
        assert_eq!(d.status, status(i).to_string(), "{name}");
        assert!(conds
            .iter()
            .any(|c| c.type_ == "NodekeeperPidPressure" && c.status == "False"));
        checked += 1;
    }
    assert_eq!(checked, N);
    assert_eq!(
        c.app.states.counters.reports.load(Ordering::Relaxed),
        N as u64
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oci_preemption_reaches_the_right_node() {
    let env = Env::new(3).await;
    let mut cfg = env.config();
    cfg.oci_events.enabled = true;
    cfg.oci_events.token = nodekeeper_core::controller::config::Secret::new("s3cret-s3cret-s3cret");
    // Confirmation target: a loopback server that records the GET (allowed by the opt-in only).
    cfg.allow_loopback_destinations = true;
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let h2 = hits.clone();
    let confirm = axum::Router::new().route(
        "/confirm",
        axum::routing::get(move || {
            h2.fetch_add(1, Ordering::Relaxed);
            async { "ok" }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let caddr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, confirm).await.unwrap() });

    let c = env.controller(&cfg, true).await;
    let mut rx = c.app.states.subscribe_events();
    let http = https(&env.ca, c.addr);
    // As OCI Notifications posts: the secret in the path, or as the Basic password.
    let send = |path: &str, body: serde_json::Value, basic_password: Option<&str>| {
        let (http, u) = (http.clone(), url(c.addr, path));
        let password = basic_password.map(str::to_string);
        async move {
            let mut req = http.post(u).json(&body);
            if let Some(p) = password {
                req = req.basic_auth("nodekeeper", Some(p));
            }
            req.send().await.unwrap().status().as_u16()
        }
    };
    let ev = json!({"eventType": "com.oraclecloud.computeapi.instancepreemptionaction", "source": "ComputeApi",
        "eventID": "abc", "data": {"resourceId": "ocid1.instance.oc1.phx.n2",
        "additionalDetails": {"preemptionAction": "TERMINATE"}}});
    assert_eq!(
        send("/v1/oci-events/wrong-token-wrong", ev.clone(), None).await,
        401
    );
    assert_eq!(send("/v1/oci-events", ev.clone(), Some("nope")).await, 401);
    assert_eq!(
        send(
            "/v1/oci-events",
            json!({"ConfirmationURL": format!("http://{caddr}/confirm")}),
            Some("s3cret-s3cret-s3cret")
        )
        .await,
        200
    );
    assert_eq!(hits.load(Ordering::Relaxed), 1, "subscription confirmed");
    assert_eq!(
        send("/v1/oci-events/s3cret-s3cret-s3cret", ev.clone(), None).await,
        200
    );
    let (node, got) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node, "n2");
    assert_eq!(
        got.kind,
        nodekeeper_core::agent::sources::EventKind::Preemption
    );
    // A redelivery (with Basic authentication) is deduplicated.
    assert_eq!(
        send("/v1/oci-events", ev.clone(), Some("s3cret-s3cret-s3cret")).await,
        200
    );
    // An instance that is no Node: 200 (nothing to retry), no event; a malformed envelope: 400
    // naming the field.
    let mut stranger = ev.clone();
    stranger["data"]["resourceId"] = json!("ocid1.instance.oc1.phx.not-a-node");
    let path = "/v1/oci-events/s3cret-s3cret-s3cret";
    for _ in 0..2 {
        assert_eq!(send(path, stranger.clone(), None).await, 200);
    }
    let mut broken = ev;
    broken["data"]["resourceId"] = json!("ocid1.volume.oc1.phx.n2");
    let answer = http
        .post(url(c.addr, path))
        .json(&broken)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 400);
    let text = answer.text().await.unwrap();
    assert!(text.contains("data.resourceId"), "{text}");
    // The endpoint answers each delivery after ingesting it (an event is emitted before the
    // answer): nothing more may be queued now.
    let left = rx.try_recv();
    assert!(
        matches!(
            left,
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "duplicate not re-emitted: {:?}",
        left.map(|(node, ev)| (node, ev.id))
    );
    // `nodekeeper sim oci-event` (the real binary) posts a maintenance notice for n1 over TLS.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args([
            "sim",
            "oci-event",
            "--url",
            &ip_url(c.addr, "/v1/oci-events"),
            "--kind",
            "maintenance",
            "--instance",
            "ocid1.instance.oc1.phx.n1",
            "--server-name",
            SERVER_NAME,
            "--ca-file",
        ])
        .arg(&env.ca)
        .env("NODEKEEPER_OCI_EVENTS_TOKEN", "s3cret-s3cret-s3cret")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (node, got) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (node.as_str(), got.kind),
        (
            "n1",
            nodekeeper_core::agent::sources::EventKind::Maintenance
        )
    );
    assert!(got.not_before.is_some());
    // And with `--basic-user` (Basic authentication, the URL without the secret): a rescheduled
    // window, a new notice.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args([
            "sim",
            "oci-event",
            "--url",
            &ip_url(c.addr, "/v1/oci-events"),
            "--basic-user",
            "nodekeeper",
            "--kind",
            "rescheduled",
            "--window-start",
            "2031-02-03T04:00:00Z",
            "--instance",
            "ocid1.instance.oc1.phx.n1",
            "--server-name",
            SERVER_NAME,
            "--ca-file",
        ])
        .arg(&env.ca)
        .env("NODEKEEPER_OCI_EVENTS_TOKEN", "s3cret-s3cret-s3cret")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (node, got) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node, "n1");
    assert_eq!(
        got.not_before.map(|t| t.to_rfc3339()),
        Some("2031-02-03T04:00:00+00:00".to_string())
    );

    // The Kubernetes Event is on n2 (by name and uid), in `default`.
    let list = node_events(&env).await;
    let pre: Vec<_> = list
        .iter()
        .filter(|e| e.reason.as_deref() == Some("PreemptionNotice"))
        .collect();
    assert_eq!(pre.len(), 1);
    let about = pre[0].regarding.as_ref().unwrap();
    assert_eq!(about.name.as_deref(), Some("n2"));
    let n2 = env.nodes().get("n2").await.unwrap();
    assert_eq!(about.uid, n2.metadata.uid);
    assert_eq!(about.namespace, None);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_failover_exactly_one_writer() {
    let env = Env::new(1).await;
    let nodes = env.nodes();
    let t0 = env.token("n0", "nodekeeper").await;
    let mut ca = env.config();
    ca.leader.identity = Some("a".into());
    let mut cb = env.config();
    cb.leader.identity = Some("b".into());
    let a = env.controller(&ca, true).await;
    let b = env.controller(&cb, false).await;
    // A renewal by the leader while b runs: b saw a held Lease, and must not have taken it.
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(env.cluster.client.clone(), &ca.namespace);
    let renewed = || async {
        let l = leases.get(&ca.leader.lease_name).await.unwrap();
        l.spec.and_then(|s| s.renew_time)
    };
    let first = renewed().await;
    wait::until(
        Duration::from_secs(10),
        "a renewal by the leader",
        || async { renewed().await != first },
    )
    .await;
    assert!(
        *a.app.leader.borrow() && !*b.app.leader.borrow(),
        "exactly one leader"
    );
    let writes = |r: &nodekeeper_core::controller::Running| {
        r.app.states.counters.node_writes.load(Ordering::Relaxed)
    };
    // Both accept reports; only the leader writes.
    let (ha, hb) = (https(&env.ca, a.addr), https(&env.ca, b.addr));
    let r1 = report("n0", 1, &[("NodekeeperDiskPressure", False)]);
    assert_eq!(
        post(&ha, a.addr, Some(&t0), &serde_json::to_value(&r1).unwrap())
            .await
            .0,
        200
    );
    let r2 = report("n0", 2, &[("NodekeeperDiskPressure", True)]);
    let (code, body) = post(&hb, b.addr, Some(&t0), &serde_json::to_value(&r2).unwrap()).await;
    assert_eq!((code, body["accepted"].clone()), (200, json!(true)));
    assert_eq!(writes(&b), 0, "the follower must not write");
    assert!(writes(&a) >= 1);
    assert_eq!(
        conditions(&nodes, "n0").await["NodekeeperDiskPressure"].0,
        "False"
    );
    // The leader stops (releases the lease): b takes over and writes what it kept.
    let a_writes = writes(&a);
    let app_a = a.app.clone();
    a.stop().await;
    wait::until(Duration::from_secs(5), "b to lead", || {
        std::future::ready(*b.app.leader.borrow())
    })
    .await;
    assert!(!*app_a.leader.borrow());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while conditions(&nodes, "n0").await["NodekeeperDiskPressure"].0 != "True" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "new leader did not write the kept report"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(writes(&b) >= 1);
    assert_eq!(
        app_a.states.counters.node_writes.load(Ordering::Relaxed),
        a_writes,
        "old leader wrote after stepping down"
    );
    let lease: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(env.cluster.client.clone(), "nodekeeper");
    let l = lease.get("nodekeeper-controller").await.unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("b"));
    b.stop().await;
}
