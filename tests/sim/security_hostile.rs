//! The hostile-input probes of issue #43, replayed against the real controller binary over TLS
//! (the sim's API server behind it, sim-minted tokens). Each test fails on the behaviour the probe
//! found; docs/dev/reliability.md "Hostile input" lists attack, limit and test.
//!
//! Sim only: the probes are about the controller's own limits; no cluster behaviour is involved.

use crate::support::ctl;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ctl::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::security_api::tls_connect;

const OCI_TOKEN: &str = "hostile-oci-s3cret";

/// The controller binary, killed when dropped.
struct Controller {
    child: std::process::Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident memory of process `pid`, KiB (0 once it is gone).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

impl Controller {
    /// Resident memory of the controller process, KiB.
    fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id())
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Starts `nodekeeper controller` over TLS with `[controller]` lines `extra` (and OCI Events on,
/// subscription confirmation off), and waits until it is ready.
async fn start(env: &Env, name: &str, extra: &str) -> Controller {
    start_with(env, name, extra, "confirm_subscriptions = false\n").await
}

/// [`start`] with `[controller.oci_events]` lines `oci`.
async fn start_with(env: &Env, name: &str, extra: &str, oci: &str) -> Controller {
    let dir = env.dir.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("controller.toml");
    std::fs::write(
        &cfg,
        format!(
            "[controller]\nlisten = \"127.0.0.1:0\"\ntls_cert_file = {:?}\ntls_key_file = {:?}\n\
             service_account = \"{SA}\"\n{extra}\n[controller.leader]\nidentity = \"{name}\"\n\
             lease_duration = \"2s\"\nretry_period = \"200ms\"\n\
             [controller.oci_events]\nenabled = true\ntoken = \"{OCI_TOKEN}\"\n{oci}",
            env.cert, env.key
        ),
    )
    .unwrap();
    let kubeconfig = dir.join("kubeconfig");
    env.cluster.write_kubeconfig(&kubeconfig).unwrap();
    let log = dir.join("controller.log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["controller", "--config"])
        .arg(&cfg)
        .env("KUBECONFIG", &kubeconfig)
        .env("NODEKEEPER_LOG_FORMAT", "json")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut c = Controller {
        child,
        addr: "127.0.0.1:1".parse().unwrap(),
        log,
    };
    c.addr = crate::support::controller_addr(&c.log).await;
    let http = https(&env.ca, c.addr);
    crate::support::wait::until(Duration::from_secs(20), "the controller ready", || {
        let http = http.clone();
        let addr = c.addr;
        async move { matches!(get(&http, addr, "/readyz").await, Ok((200, _))) }
    })
    .await;
    c
}

/// What one attacking connection saw.
#[derive(Debug)]
struct Outcome {
    /// The status line's code (0: closed without an answer).
    status: u16,
    /// From the connection to the answer (or the close).
    after: Duration,
    /// Bytes of the body written before the server answered or closed.
    written: usize,
}

/// Sends a request head declaring `body.len() + 1` bytes, then `body` (never the last byte: the
/// body stays incomplete, as the probe's did), and waits for an answer or the close.
async fn stalled_body(
    addr: SocketAddr,
    ca: PathBuf,
    head: String,
    body: Arc<Vec<u8>>,
    give_up: Duration,
) -> Outcome {
    let start = tokio::time::Instant::now();
    let s = tls_connect(addr, &ca).await;
    let (mut rd, mut wr) = tokio::io::split(s);
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = written.clone();
    let writer = tokio::spawn(async move {
        if wr.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        for chunk in body.chunks(64 * 1024) {
            if wr.write_all(chunk).await.is_err() || wr.flush().await.is_err() {
                return;
            }
            w.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
        }
        // Then stall with the connection open.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(wr);
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // The first bytes of the answer (or the close) are what counts.
    let _ = tokio::time::timeout(give_up, async {
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if out.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    let after = start.elapsed();
    let status = String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    // Hold the connection (and its stalled body) until the caller has measured.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(20)).await;
        writer.abort();
        drop(rd);
    });
    Outcome {
        status,
        after,
        written: written.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Probe 2: 200 TLS connections without valid credentials (no token, an unknown token, no OCI
/// secret, a wrong one), each declaring a body just under `max_report_bytes`, sending 1 MB of it
/// and stalling. The controller answers each from its headers — 401; for the unknown token, which
/// needs a TokenReview and so a permit, 503 past `max_reports_in_flight`, or 408 for the few whose
/// stalled body was read on the notices' allowance — never waiting longer than the body deadline
/// (5 s) for a body, and its RSS grows by less than [`RSS_BOUND_MIB`] (it grew by 162 MiB with 150 such
/// connections when the body was buffered before the token was checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unauthenticated_bodies_are_not_read_and_memory_stays_bounded() {
    const CONNECTIONS: usize = 200;
    const RSS_BOUND_MIB: u64 = 48;
    let env = Env::new(1).await;
    let ctl = start(&env, "bodies", "max_reports_in_flight = 4").await;
    // Warm up: a real report (TLS, TokenReview, Node write) so the baseline includes them.
    let t0 = env.token("n0", "nodekeeper").await;
    let http = https(&env.ca, ctl.addr);
    let r = serde_json::to_value(report("n0", 1, &[])).unwrap();
    assert_eq!(post(&http, ctl.addr, Some(&t0), &r).await.0, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = ctl.rss_kib();

    // The peak, sampled every 20 ms while the attack runs (bodies buffered and then freed when
    // their requests end would not show afterwards).
    let pid = ctl.child.id();
    let sampler = PeakRss::sample(pid);
    let body = Arc::new(vec![b' '; 1_000_000]);
    let declared = body.len() + 1;
    let mut attacks = Vec::new();
    for i in 0..CONNECTIONS {
        let (path, auth) = match i % 4 {
            0 => ("/v1/reports".to_string(), String::new()),
            1 => (
                "/v1/reports".to_string(),
                "authorization: Bearer not-a-token\r\n".to_string(),
            ),
            2 => ("/v1/oci-events".to_string(), String::new()),
            _ => ("/v1/oci-events/wrong-secret".to_string(), String::new()),
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: c\r\n{auth}content-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
        );
        attacks.push(tokio::spawn(stalled_body(
            ctl.addr,
            env.ca.clone(),
            head,
            body.clone(),
            Duration::from_secs(30),
        )));
    }
    let mut outcomes = Vec::new();
    for a in attacks {
        outcomes.push(a.await.unwrap());
    }
    // Every connection is still held open by its client (stalled), as in the probe.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = sampler.stop().await;
    let grew = after.saturating_sub(before);
    let worst = outcomes.iter().map(|o| o.after).max().unwrap();
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for o in &outcomes {
        *by_status.entry(o.status).or_default() += 1;
    }
    let written: usize = outcomes.iter().map(|o| o.written).sum();
    eprintln!(
        "NOTE: {CONNECTIONS} unauthenticated connections with stalled 1 MB bodies: controller RSS \
         {before} -> peak {after} KiB (+{grew} KiB); answers {by_status:?}; slowest {worst:?}; \
         {written} body bytes written by the clients"
    );
    for (i, o) in outcomes.iter().enumerate() {
        assert!(
            [0, 401, 503, 408].contains(&o.status),
            "connection {i}: {o:?} (never a 2xx)"
        );
        assert!(
            o.after < Duration::from_secs(10),
            "connection {i} waited for its body: {o:?}"
        );
    }
    assert!(
        by_status.get(&401).copied().unwrap_or(0) >= CONNECTIONS / 2,
        "{by_status:?}"
    );
    assert!(
        grew < RSS_BOUND_MIB * 1024,
        "controller RSS grew by {grew} KiB (bound {RSS_BOUND_MIB} MiB)"
    );
    // The legitimate agent still reports.
    let r = serde_json::to_value(report("n0", 2, &[])).unwrap();
    assert_eq!(post(&http, ctl.addr, Some(&t0), &r).await.0, 200);
    assert!(!ctl.log_text().contains("panicked"), "{}", ctl.log_text());
}

/// A counter's value on `/metrics` (0 when absent). `sample` is the whole sample name with labels.
async fn metric(http: &reqwest::Client, addr: SocketAddr, sample: &str) -> u64 {
    let (code, text) = get(http, addr, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

fn notice(id: &str) -> nodekeeper_core::agent::sources::NodeEvent {
    nodekeeper_core::agent::sources::NodeEvent {
        version: 1,
        id: id.into(),
        kind: nodekeeper_core::agent::sources::EventKind::Maintenance,
        cloud: None,
        source: "hostile/test".into(),
        not_before: None,
        deadline: None,
        detected_at: chrono::Utc::now(),
        detail: Default::default(),
    }
}

fn check_event(i: usize) -> nodekeeper_core::agent::checks::CheckEvent {
    nodekeeper_core::agent::checks::CheckEvent {
        reason: "KernelOops".into(),
        message: format!("line {i}"),
        severity: nodekeeper_core::agent::checks::EventSeverity::Warning,
    }
}

/// The Events about `node` in `default`, by reason.
async fn events_by_reason(env: &Env) -> std::collections::BTreeMap<String, usize> {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::namespaced(
        env.cluster.client.clone(),
        nodekeeper_core::controller::cluster::events::NODE_EVENT_NAMESPACE,
    );
    let mut out = std::collections::BTreeMap::new();
    for e in api.list(&Default::default()).await.unwrap().items {
        *out.entry(e.reason.unwrap_or_default()).or_default() += 1;
    }
    out
}

/// Probe 1: one node's valid token, hostile reports. 9,000 conditions, 1,000 check events,
/// 8,000 events, a 100 kB message: each refused with 400 naming its limit, counted, and nothing
/// written (the Node gained 9,000 conditions, and 1,000 Events per resend, before). 300 notices
/// sent in batches and resent count 300 times, not more (the former 256-id memory counted the
/// resent ones again). 200 check events in one report make at most `events_burst` Events plus
/// one `EventsRateLimited` (they made 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_nodes_reports_are_bounded() {
    let env = Env::new(1).await;
    let ctl = start(
        &env,
        "limits",
        // a generous notice rate: this test is about deduplication; the Event rate is the default
        "[controller.report_limits]\nnotices_burst = 1000",
    )
    .await;
    let t0 = env.token("n0", "nodekeeper").await;
    let http = https(&env.ca, ctl.addr);
    let nodes = env.nodes();
    let mut seq = 0;
    let mut next = || {
        seq += 1;
        report("n0", seq, &[])
    };

    let mut r = next();
    r.conditions = (0..9_000)
        .map(|i| {
            nodekeeper_core::agent::checks::CheckResult::new(
                format!("NodekeeperX{i}"),
                nodekeeper_core::agent::checks::ConditionStatus::True,
                "R",
                "m",
            )
        })
        .collect();
    let mut over = vec![(r, "max_conditions")];
    let mut r = next();
    r.check_events = (0..1_000).map(check_event).collect();
    over.push((r, "max_check_events"));
    let mut r = next();
    r.events = (0..8_000)
        .map(|i| {
            let mut n = notice(&format!("f{i}"));
            n.source = "x".into();
            n
        })
        .collect();
    assert!(
        serde_json::to_vec(&r).unwrap().len() < 1 << 20,
        "within max_report_bytes"
    );
    over.push((r, "max_events"));
    let mut r = next();
    r.check_events = vec![nodekeeper_core::agent::checks::CheckEvent {
        message: "m".repeat(100_000),
        ..check_event(0)
    }];
    over.push((r, "max_message_bytes"));
    for (r, limit) in &over {
        let (code, body) = post(
            &http,
            ctl.addr,
            Some(&t0),
            &serde_json::to_value(r).unwrap(),
        )
        .await;
        assert_eq!(
            (code, body["limit"].as_str()),
            (400, Some(*limit)),
            "{body}"
        );
        assert!(body["error"].as_str().unwrap().contains(limit), "{body}");
        let sample = format!("nodekeeper_reports_over_limit_total{{limit=\"{limit}\"}}");
        assert_eq!(metric(&http, ctl.addr, &sample).await, 1, "{sample}");
    }
    assert!(conditions(&nodes, "n0").await.is_empty());
    assert_eq!(
        metric(&http, ctl.addr, "nodekeeper_node_events_total").await,
        0
    );
    assert!(events_by_reason(&env).await.is_empty());

    // 300 notices in batches of 60, then every batch resent: 300 notices, once each.
    let ids: Vec<String> = (0..300).map(|i| format!("dedup-{i}")).collect();
    for round in 0..2 {
        for batch in ids.chunks(60) {
            let mut r = next();
            r.events = batch.iter().map(|id| notice(id)).collect();
            let (code, body) = post(
                &http,
                ctl.addr,
                Some(&t0),
                &serde_json::to_value(&r).unwrap(),
            )
            .await;
            assert_eq!(code, 200, "round {round}: {body}");
        }
    }
    assert_eq!(
        metric(&http, ctl.addr, "nodekeeper_node_events_total").await,
        300
    );

    // 200 check events in one report (within max_check_events): the Event rate bites.
    let mut r = next();
    r.check_events = (0..200).map(check_event).collect();
    let (code, body) = post(
        &http,
        ctl.addr,
        Some(&t0),
        &serde_json::to_value(&r).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let events = events_by_reason(&env).await;
    let total: usize = events.values().sum();
    let limits = nodekeeper_core::controller::state::limits::ReportLimits::default();
    eprintln!("NOTE: Events recorded after 300 notices and 200 check events: {events:?}");
    assert_eq!(events.get("EventsRateLimited"), Some(&1), "{events:?}");
    // the burst, one aggregate, and what refilled while the test ran (one per 10 s)
    assert!(
        total <= limits.events_burst as usize + 1 + 6,
        "{total} Events: {events:?}"
    );
    assert!(
        metric(&http, ctl.addr, "nodekeeper_node_events_suppressed_total").await >= 400,
        "suppressed"
    );
}

/// Probe 7: a `crio-state.json` whose maps name paths (`../../../../victim.txt`, an absolute
/// path) made `crio apply --dry-run` plan the removal of a file outside the drop-in directory
/// and print its contents as a diff. Now the state file is refused, naming the file, the field
/// and the remedy; the victim is neither printed nor touched; exit 1. (A process test, beside
/// the other probes; `tests/host` holds the systemd-backed apply tests.)
#[test]
fn a_crio_state_file_naming_paths_is_refused_and_nothing_outside_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let dropins = root.join("etc/crio/crio.conf.d");
    let state = root.join("var/lib/nodekeeper");
    std::fs::create_dir_all(&dropins).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    let victim = root.join("victim.txt");
    std::fs::write(&victim, "VICTIM-SECRET-CONTENT\n").unwrap();
    let abs = dir.path().join("abs.conf");
    std::fs::write(&abs, "ABSOLUTE-SECRET-CONTENT\n").unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        "[crio]\n[[crio.dropin]]\nname = \"10-ok.conf\"\ncontent = \"\"\"\n[crio.runtime]\nlog_level = \"info\"\n\"\"\"\n\n[sources]\ncloud = \"none\"\n",
    )
    .unwrap();
    let cases = [
        serde_json::json!({"version": 1, "owned": {"../../../../victim.txt": "00"}}),
        serde_json::json!({"version": 1, "owned": {abs.to_str().unwrap(): "00"}}),
        serde_json::json!({"version": 1, "owned": {},
            "pending": {"files": {"../../../victim.txt": true}, "owned_before": {}}}),
        serde_json::json!({"version": 1, "owned": {},
            "pending": {"files": {}, "owned_before": {"../../victim.txt": "00"}}}),
    ];
    for case in cases {
        std::fs::write(state.join("crio-state.json"), case.to_string()).unwrap();
        for dry_run in [true, false] {
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"));
            cmd.args(["crio", "apply", "--config"])
                .arg(&cfg)
                .arg("--root")
                .arg(&root);
            if dry_run {
                cmd.arg("--dry-run");
            }
            let out = cmd.output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                out.status.code(),
                Some(1),
                "{case} dry_run={dry_run}: {text}"
            );
            assert!(
                !text.contains("SECRET-CONTENT"),
                "{case}: a file outside the drop-ins was printed: {text}"
            );
            assert!(
                text.contains("crio-state.json")
                    && text.contains("not a drop-in file name")
                    && text.contains("move it"),
                "{case}: {text}"
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "VICTIM-SECRET-CONTENT\n"
    );
    assert_eq!(
        std::fs::read_to_string(&abs).unwrap(),
        "ABSOLUTE-SECRET-CONTENT\n"
    );
    // Nothing was written into the drop-in directory either (the apply stopped at the state).
    assert_eq!(std::fs::read_dir(&dropins).unwrap().count(), 0);
}

/// Probe 3: the OCI secret's holder sends a `ConfirmationURL` of `http://127.0.0.1:PORT/…`: it was
/// fetched (redirects followed), and a closed port answered 502 with the connect error — a port
/// scanner. Now such URLs are refused before any request (400 "refused"); an open loopback port,
/// a redirect to it, the metadata address and a closed port all look the same to the caller, and
/// the loopback receiver sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_oci_confirmation_url_is_no_port_scanner() {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    let env = Env::new(1).await;
    // A loopback receiver that would record a confirmation, and a redirect to it.
    let hits = Arc::new(AtomicU32::new(0));
    let h = hits.clone();
    let app = axum::Router::new()
        .route(
            "/confirm",
            axum::routing::get(move || {
                h.fetch_add(1, Relaxed);
                async { "ok" }
            }),
        )
        .route(
            "/redirect",
            axum::routing::get(|| async {
                axum::response::Redirect::temporary("http://127.0.0.1:1/confirm")
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let ctl = start_with(&env, "confirm", "", "confirm_subscriptions = true\n").await;
    let http = https(&env.ca, ctl.addr);
    let urls = [
        format!("http://{open}/confirm"),
        format!("http://{closed}/confirm"),
        format!("https://{open}/confirm"),
        format!("http://{open}/redirect"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://[fd00:ec2::254]/latest/meta-data/".to_string(),
        "http://localhost:1/".to_string(),
        "https://evil.example/notification.us-phoenix-1.oraclecloud.com".to_string(),
        // a secret in the query: refused (port), and logged only redacted
        "https://notification.us-phoenix-1.oraclecloud.com:8443/c?token=PLANTEDconfirmtoken"
            .to_string(),
    ];
    let mut answers = std::collections::BTreeSet::new();
    for u in &urls {
        let body = serde_json::to_vec(&serde_json::json!({"ConfirmationURL": u})).unwrap();
        let (code, text) = request(
            &http,
            "POST",
            &url(ctl.addr, &format!("/v1/oci-events/{OCI_TOKEN}")),
            None,
            &[],
            Some(body),
        )
        .await
        .unwrap();
        let text = String::from_utf8_lossy(&text).into_owned();
        assert_eq!(code, 400, "{u}: {text}");
        assert!(text.contains("refused"), "{u}: {text}");
        for leak in ["onnect", "refused (os error", "127.0.0.1", "tcp"] {
            assert!(!text.contains(leak), "{u}: {text}");
        }
        answers.insert(text);
    }
    assert_eq!(hits.load(Relaxed), 0, "the loopback receiver was reached");
    eprintln!("NOTE: confirmation answers: {answers:?}");
    // Item 5: the controller's log and metrics carry no URL secret.
    let metrics = get(&http, ctl.addr, "/metrics").await.unwrap().1;
    let log = ctl.log_text();
    assert!(
        log.contains("refused a subscription confirmation URL"),
        "{log}"
    );
    for out in [&log, &metrics] {
        assert!(!out.contains("PLANTEDconfirmtoken"), "{out}");
    }
}

/// Probe 5: `nodekeeper validate` printed webhook URLs verbatim, with userinfo passwords and
/// Slack/Teams-style path and query secrets. Every planted secret is now absent from its output
/// (stdout and stderr); each URL is printed as scheme, host and port with a fingerprint.
#[test]
fn validate_prints_no_url_secret() {
    const PLANTED: [&str; 6] = [
        "PLANTEDuser",
        "PLANTEDpassword",
        "T0PLANTED",
        "B0PLANTEDPATH",
        "PLANTEDquerytoken",
        "PLANTEDwebhookpath",
    ];
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[controller]\nlisten = \"127.0.0.1:0\"\ninsecure_plain_http = true\n\
             service_account = \"{SA}\"\n\
             [[controller.notify]]\nurl = \"https://PLANTEDuser:PLANTEDpassword@hooks.slack.com/services/T0PLANTED/B0PLANTEDPATH\"\n\
             [[controller.notify]]\nurl = \"https://example.webhook.office.com/webhookb2/x?token=PLANTEDquerytoken\"\n\
             [controller.provider]\nkind = \"webhook\"\nurl = \"https://replace.example/PLANTEDwebhookpath\"\n\
             secret = \"s3cret-s3cret\"\n\
             [sources]\ncloud = \"none\"\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["validate", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for s in PLANTED {
        assert!(!text.contains(s), "{s} printed:\n{text}");
    }
    // A mistyped URL (invalid: exit 2) is not echoed either.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[controller.notify]]\nurl = \"https://hooks.slack.com:99999/services/PLANTEDtypo\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["validate", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let bad_text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{bad_text}");
    assert!(
        bad_text.contains("not a URL") && !bad_text.contains("PLANTEDtypo"),
        "{bad_text}"
    );
    for origin in [
        "https://hooks.slack.com/…#",
        "https://example.webhook.office.com/…#",
        "https://replace.example/…#",
    ] {
        assert!(text.contains(origin), "{origin} not printed:\n{text}");
    }
}

/// Probe 6: a 17 MB valid configuration took 1.24 GB and exited 0; a file of 3,000 nested table
/// headers exited 2 without a location. Now a file over 1 MiB (a ConfigMap's limit) is refused
/// before it is read (exit 2, naming the limit), and the deepest header's error is located.
#[test]
fn config_files_are_bounded_and_every_parse_error_is_located() {
    let dir = tempfile::tempdir().unwrap();
    let validate = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let t = std::time::Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["validate", "--config"])
            .arg(&p)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text, t.elapsed(), p)
    };
    // 17 MB, valid TOML: a long allow-list.
    let mut big = String::from("[sources]\ncloud = \"none\"\n[labels]\n# padding\n");
    while big.len() < 17_000_000 {
        big.push_str("# a comment line to make the file large, as the probe's was\n");
    }
    let (code, text, took, _) = validate("big.toml", &big);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("at most 1048576 bytes"), "{text}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // The probe's 9 MB of 3,000 nested headers: refused by its size too.
    let nested: String = (1..=3000)
        .map(|i| format!("[{}]\n", vec!["a"; i].join(".")))
        .collect();
    let (code, text, _, _) = validate("nested.toml", &nested);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("at most 1048576 bytes"), "{text}");
    // One 3,000-deep header within the limit: its error is located at its line.
    let deep = format!(
        "[sources]\ncloud = \"none\"\n[{}]\nb = 1\n",
        vec!["a"; 3000].join(".")
    );
    let (code, text, _, p) = validate("deep.toml", &deep);
    assert_eq!(code, Some(2), "{text}");
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("error")).collect();
    assert!(!errors.is_empty(), "{text}");
    for e in errors {
        assert!(e.starts_with(&format!("{}:3:", p.display())), "{e}");
    }
}

/// A TLS connection offering HTTP/2 only.
async fn tls_connect_h2(
    addr: SocketAddr,
    ca: &std::path::Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// Probe 2 over HTTP/2 (`[controller] http2 = true`, agents holding their connection): 100
/// connections without a token, each opening 8 streams that declare a body just under
/// `max_report_bytes`, send 256 KiB of it and stall. Every stream is answered 401 from its
/// headers, and the controller's RSS stays under the same bound as over HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unauthenticated_http2_streams_are_not_buffered() {
    use http_body_util::BodyExt;
    const CONNECTIONS: usize = 100;
    const STREAMS: usize = 8;
    const RSS_BOUND_MIB: u64 = 48;
    let env = Env::new(1).await;
    let ctl = start(&env, "h2", "http2 = true\nmax_reports_in_flight = 4").await;
    let http = https(&env.ca, ctl.addr);
    let t0 = env.token("n0", "nodekeeper").await;
    let r = serde_json::to_value(report("n0", 1, &[])).unwrap();
    assert_eq!(post(&http, ctl.addr, Some(&t0), &r).await.0, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = ctl.rss_kib();
    let pid = ctl.child.id();
    let sampler = PeakRss::sample(pid);
    let chunk = bytes::Bytes::from(vec![b' '; 64 * 1024]);
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        let addr = ctl.addr;
        let ca = env.ca.clone();
        let chunk = chunk.clone();
        conns.push(tokio::spawn(async move {
            let tls = tls_connect_h2(addr, &ca).await;
            let (mut send, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                hyper_util::rt::TokioIo::new(tls),
            )
            .await
            .unwrap();
            tokio::spawn(conn);
            // Every stream opened before any answer is awaited: all stall together.
            let mut held = Vec::new();
            let mut answers = Vec::new();
            for _ in 0..STREAMS {
                let (tx, rx) = tokio::sync::mpsc::channel::<
                    Result<hyper::body::Frame<bytes::Bytes>, std::convert::Infallible>,
                >(8);
                let body = http_body_util::StreamBody::new(tokio_stream_from(rx));
                let req = hyper::Request::post(format!("https://{SERVER_NAME}/v1/reports"))
                    .header("content-type", "application/json")
                    .header("content-length", (1_000_000).to_string())
                    .body(body.boxed())
                    .unwrap();
                send.ready().await.ok();
                answers.push(send.send_request(req));
                for _ in 0..4 {
                    let _ = tx.try_send(Ok(hyper::body::Frame::data(chunk.clone())));
                }
                held.push(tx); // the body stays open: stalled
            }
            let statuses: Vec<u16> =
                futures::future::join_all(answers.into_iter().map(|a| async {
                    tokio::time::timeout(Duration::from_secs(10), a)
                        .await
                        .ok()
                        .and_then(|r| r.ok())
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0)
                }))
                .await;
            (statuses, held, send)
        }));
    }
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    let mut keep = Vec::new();
    for c in conns {
        let (statuses, held, send) = c.await.unwrap();
        for s in statuses {
            *by_status.entry(s).or_default() += 1;
        }
        keep.push((held, send));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let peak = sampler.stop().await;
    let grew = peak.saturating_sub(before);
    eprintln!(
        "NOTE: {CONNECTIONS} HTTP/2 connections x {STREAMS} unauthenticated stalled streams: \
         controller RSS {before} -> peak {peak} KiB (+{grew} KiB); answers {by_status:?}"
    );
    assert_eq!(
        by_status.get(&401).copied(),
        Some(CONNECTIONS * STREAMS),
        "{by_status:?}"
    );
    assert!(
        grew < RSS_BOUND_MIB * 1024,
        "controller RSS grew by {grew} KiB (bound {RSS_BOUND_MIB} MiB)"
    );
    drop(keep);
}

/// A stream of the frames received on `rx`, pending while it is open.
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The peak RSS (KiB) of a process, sampled every 20 ms until [`PeakRss::stop`] (bodies buffered
/// and freed while an attack runs would not show afterwards).
struct PeakRss {
    sampling: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl PeakRss {
    fn sample(pid: u32) -> PeakRss {
        let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = sampling.clone();
        let task = tokio::spawn(async move {
            let mut peak = 0;
            while flag.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        });
        PeakRss { sampling, task }
    }

    async fn stop(self) -> u64 {
        self.sampling
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}
