//! The agent reporter against a real controller over TLS: delivery, degraded mode while the
//! controller is away, persisted queue, commands at most once, pinned server name.

use crate::support::ctl;
use crate::support::wait;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ctl::*;
use nodekeeper_core::agent::checks::ConditionStatus::{False, True};
use nodekeeper_core::agent::reporter::{Reporter, ReporterConfig};
use nodekeeper_core::agent::sources::{Cloud, EventKind, NodeEvent};
use nodekeeper_core::wire::AgentCommand;
use tokio::sync::{mpsc, watch};

fn event(id: &str) -> NodeEvent {
    NodeEvent {
        version: 1,
        id: id.into(),
        kind: EventKind::Preemption,
        cloud: Some(Cloud::Oci),
        source: "test".into(),
        not_before: None,
        deadline: None,
        detected_at: chrono::Utc::now(),
        detail: BTreeMap::new(),
    }
}

fn reporter_cfg(env: &Env, port: u16, server_name: &str) -> ReporterConfig {
    let c = ReporterConfig {
        url: format!("https://127.0.0.1:{port}"),
        ca_file: Some(env.ca.clone()),
        server_name: Some(server_name.into()),
        token_file: env.dir.path().join("token"),
        heartbeat: Duration::from_millis(300),
        timeout: Duration::from_secs(2),
        backoff_max: Duration::from_millis(500),
        max_queued_events: 100,
        ..ReporterConfig::default()
    };
    assert!(c.validate().is_empty());
    c
}

async fn wait_condition(env: &Env, status: &str) {
    let what = format!("NodekeeperDiskPressure={status}");
    wait::until(Duration::from_secs(10), what, || async {
        let c = conditions(&env.nodes(), "n0").await;
        match c.get("NodekeeperDiskPressure").map(|x| x.0.as_str()) == Some(status) {
            true => Ok(()),
            false => Err(c),
        }
    })
    .await
}

async fn next_event(
    rx: &mut tokio::sync::broadcast::Receiver<(String, NodeEvent)>,
) -> (String, String) {
    let (n, e) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    (n, e.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn degraded_mode_buffers_and_flushes() {
    let env = Env::new(1).await;
    std::fs::write(
        env.dir.path().join("token"),
        env.token("n0", "nodekeeper").await + "\n",
    )
    .unwrap();
    let mut cfg = env.config();
    cfg.listen = "127.0.0.1:0".into();
    let a = env.controller(&cfg, true).await;
    let port = a.addr.port();
    // The controller that comes back (below) listens where this one did, as behind a Service: it
    // binds the port this test's own controller held (no free-port guess).
    cfg.listen = a.addr.to_string();
    let mut events_a = a.app.states.subscribe_events();

    let state = tempfile::tempdir().unwrap();
    let reporter = Reporter::new(reporter_cfg(&env, port, SERVER_NAME), state.path()).unwrap();
    let (rtx, rrx) = watch::channel(report("n0", 0, &[("NodekeeperDiskPressure", False)]));
    let (etx, erx) = mpsc::channel(16);
    let (ctx, mut crx) = mpsc::channel(16);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(reporter.run(rrx, erx, ctx, stop.clone()));

    wait_condition(&env, "False").await;
    etx.send(event("e1")).await.unwrap();
    assert_eq!(next_event(&mut events_a).await, ("n0".into(), "e1".into()));

    // Acknowledged: gone from the persisted queue.
    wait::until(
        Duration::from_secs(5),
        "the acknowledged event out of the queue",
        || {
            std::future::ready(
                std::fs::read_to_string(state.path().join("reporter-events.json"))
                    .is_ok_and(|s| s == "[]"),
            )
        },
    )
    .await;

    // The controller goes away; the agent keeps the newest state and the events.
    a.stop().await;
    etx.send(event("e2")).await.unwrap();
    etx.send(event("e3")).await.unwrap();
    rtx.send_modify(|r| r.conditions[0].status = True);
    // Cut off (a controller outage): what answers at its address now drops every connection,
    // counting them. The reporter keeps retrying with backoff: 20 failed attempts (each wait
    // 250-500 ms, `backoff_max` long reached), not a fixed minute.
    let gone = tokio::net::TcpListener::bind(cfg.listen.as_str())
        .await
        .unwrap();
    for attempt in 0..20 {
        let accepted = tokio::time::timeout(Duration::from_secs(10), gone.accept()).await;
        let (conn, _) = accepted
            .unwrap_or_else(|_| panic!("no retry within 10 s after {attempt} attempts"))
            .unwrap();
        drop(conn);
    }
    drop(gone);
    let persisted = std::fs::read_to_string(state.path().join("reporter-events.json")).unwrap();
    assert!(
        persisted.contains("\"e2\"")
            && persisted.contains("\"e3\"")
            && !persisted.contains("\"e1\""),
        "{persisted}"
    );

    // It comes back: everything is delivered, once.
    // Subscribe before it can accept anything, then wait until it leads.
    let b = nodekeeper_core::controller::start(env.cluster.client.clone(), &cfg)
        .await
        .unwrap();
    let mut events_b = b.app.states.subscribe_events();
    let mut got = vec![
        next_event(&mut events_b).await.1,
        next_event(&mut events_b).await.1,
    ];
    got.sort();
    assert_eq!(got, vec!["e2", "e3"]);
    wait_condition(&env, "True").await;
    wait::until(Duration::from_secs(5), "an empty persisted queue", || {
        std::future::ready(
            std::fs::read_to_string(state.path().join("reporter-events.json")).unwrap() == "[]",
        )
    })
    .await;

    // A command is forwarded exactly once although it rides on several responses until its result arrives.
    b.app
        .states
        .queue_command(
            "n0",
            AgentCommand::Reboot {
                id: "r1".into(),
                reason: "test".into(),
            },
        )
        .await;
    let first = tokio::time::timeout(Duration::from_secs(5), crx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        first,
        AgentCommand::Reboot {
            id: "r1".into(),
            reason: "test".into()
        }
    );
    // Four more reports, each answered with the command (no result comes): the reporter sends
    // one only after handling the answer to the one before, so three such answers were handled.
    let reports = || b.app.states.counters.reports.load(Ordering::Relaxed);
    let seen = reports();
    wait::until(Duration::from_secs(10), "four more reports", || {
        std::future::ready(reports() >= seen + 4)
    })
    .await;
    assert_eq!(
        crx.try_recv(),
        Err(mpsc::error::TryRecvError::Empty),
        "command forwarded twice"
    );

    // Cut off again with an event queued, then the agent restarts: the queue survives on disk.
    b.stop().await;
    etx.send(event("e4")).await.unwrap();
    wait::until(Duration::from_secs(5), "e4 in the persisted queue", || {
        std::future::ready(
            std::fs::read_to_string(state.path().join("reporter-events.json"))
                .is_ok_and(|s| s.contains("\"e4\"")),
        )
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    let again = Reporter::new(reporter_cfg(&env, port, SERVER_NAME), state.path()).unwrap();
    let ids: Vec<&str> = again.queued().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, vec!["e4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pinned_server_name_is_enforced() {
    let env = Env::new(1).await;
    std::fs::write(
        env.dir.path().join("token"),
        env.token("n0", "nodekeeper").await,
    )
    .unwrap();
    let mut cfg = env.config();
    cfg.listen = "127.0.0.1:0".into();
    let c = env.controller(&cfg, true).await;
    let port = c.addr.port();
    let state = tempfile::tempdir().unwrap();
    let mut wrong =
        Reporter::new(reporter_cfg(&env, port, "evil.example.com"), state.path()).unwrap();
    let r = report("n0", 0, &[("NodekeeperDiskPressure", True)]);
    let err = wrong.send_once(&r).await.unwrap_err();
    assert!(err.to_string().contains("/v1/reports"), "{err}");
    assert!(conditions(&env.nodes(), "n0").await.is_empty());
    let mut right = Reporter::new(reporter_cfg(&env, port, SERVER_NAME), state.path()).unwrap();
    let resp = right.send_once(&r).await.unwrap();
    assert!(resp.accepted);
    assert_eq!(
        conditions(&env.nodes(), "n0").await["NodekeeperDiskPressure"].0,
        "True"
    );
    c.stop().await;
}
