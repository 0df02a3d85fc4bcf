//! Security of the controller's report API and OCI Events endpoint over real TLS, against the sim
//! (real TokenReview of sim-minted tokens): forged, replayed and foreign-token reports, wrong
//! audiences, expired/unknown/malformed tokens and oversized bodies are all rejected with the
//! right status, every time, and nothing reaches the Node.

use crate::support::ctl;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use ctl::*;
use nodekeeper_core::agent::checks::ConditionStatus::True;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OCI_TOKEN: &str = "oci-s3cret-token";
/// Each rejected request is sent this many times: "100 % rejected" is counted, not assumed.
const TRIES: usize = 10;

fn config(env: &Env) -> nodekeeper_core::controller::config::ControllerConfig {
    let mut c = env.config();
    c.oci_events.enabled = true;
    c.oci_events.token = OCI_TOKEN.into();
    c.oci_events.confirm_subscriptions = false;
    c
}

/// Status codes of `TRIES` identical requests.
async fn codes(
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
    token: Option<&str>,
    body: &serde_json::Value,
) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..TRIES {
        out.push(post(http, addr, token, body).await.0);
    }
    out
}

/// An oversized body with a Content-Length is refused unread: 413. Over HTTP/1.1 (the report API's
/// transport) the server answers and closes the connection without reading the body, so a client
/// still writing it may see the connection closed (broken pipe, reset) before it reads the 413;
/// either is a refusal. Anything else (a 2xx, another status, a timeout) fails.
fn refused_unread(r: Result<(u16, bytes::Bytes), String>, what: &str) {
    match r {
        Ok((413, _)) => {}
        Err(e)
            if [
                "Broken pipe",
                "reset by peer",
                "error writing a body",
                "close_notify",
            ]
            .iter()
            .any(|m| e.contains(m)) => {}
        other => panic!("{what}: not refused unread: {other:?}"),
    }
}

fn all(code: u16) -> Vec<u16> {
    vec![code; TRIES]
}

async fn mint(env: &Env, node: &str, audience: &str, ttl: i64) -> String {
    let body = json!({"pod": format!("agent-{node}"), "node": node, "audiences": [audience],
        "namespace": "nodekeeper", "serviceAccount": "nodekeeper-agent", "expirationSeconds": ttl});
    let (_, bytes) = send(admin().post(env.cluster.admin_url("tokens")).json(&body))
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["token"].as_str().unwrap().to_string()
}

fn writes(ctl: &nodekeeper_core::controller::Running) -> u64 {
    ctl.app.states.counters.node_writes.load(Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_foreign_and_invalid_tokens_are_always_rejected() {
    let env = Env::new(2).await;
    let ctl = env.controller(&config(&env), true).await;
    let http = https(&env.ca, ctl.addr);
    let nodes = env.nodes();
    let t0 = env.token("n0", "nodekeeper").await;
    let t1 = env.token("n1", "nodekeeper").await;
    let about = |node: &str, seq| {
        serde_json::to_value(report(node, seq, &[("NodekeeperDiskPressure", True)])).unwrap()
    };

    // Forged: n0's token, a report about n1. Token of another node: n1's token, n0's report.
    assert_eq!(
        codes(&http, ctl.addr, Some(&t0), &about("n1", 1)).await,
        all(403)
    );
    assert_eq!(
        codes(&http, ctl.addr, Some(&t1), &about("n0", 1)).await,
        all(403)
    );
    // Wrong audiences (the API server's own, an empty list means the API server's default).
    for aud in [
        "https://kubernetes.default.svc",
        "nodekeeper-other",
        "nodekeepe",
    ] {
        let t = env.token("n0", aud).await;
        assert_eq!(
            codes(&http, ctl.addr, Some(&t), &about("n0", 1)).await,
            all(401),
            "{aud}"
        );
    }
    // Unknown, malformed and missing tokens.
    let forged_jwt = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bm9kZWtlZXBlcjpub2Rla2VlcGVyLWFnZW50In0.";
    for t in ["sim.bogus", forged_jwt, " ", &format!("{t0}x")] {
        assert_eq!(
            codes(&http, ctl.addr, Some(t), &about("n0", 1)).await,
            all(401),
            "{t:?}"
        );
    }
    assert_eq!(
        codes(&http, ctl.addr, None, &about("n0", 1)).await,
        all(401)
    );
    // Another service account on the same node: authenticated, not the agent: 403.
    let other_sa = token_for(&env.cluster, "n0", "nodekeeper", "default").await;
    assert_eq!(
        codes(&http, ctl.addr, Some(&other_sa), &about("n0", 1)).await,
        all(403)
    );
    // Expired: minted for 1 s, first used after it ran out (never cached while valid).
    let short = mint(&env, "n0", "nodekeeper", 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        codes(&http, ctl.addr, Some(&short), &about("n0", 1)).await,
        all(401)
    );

    assert!(
        conditions(&nodes, "n0").await.is_empty(),
        "a rejected report reached n0"
    );
    assert!(
        conditions(&nodes, "n1").await.is_empty(),
        "a rejected report reached n1"
    );
    assert_eq!(writes(&ctl), 0);
    assert_eq!(ctl.app.forbidden.load(Relaxed), 2 * TRIES as u64);
    assert_eq!(ctl.app.unauthenticated.load(Relaxed), 9 * TRIES as u64);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_are_ignored_and_never_written() {
    let env = Env::new(2).await;
    let ctl = env.controller(&config(&env), true).await;
    let http = https(&env.ca, ctl.addr);
    let nodes = env.nodes();
    let t0 = env.token("n0", "nodekeeper").await;
    let t1 = env.token("n1", "nodekeeper").await;
    let r5 = serde_json::to_value(report("n0", 5, &[("NodekeeperDiskPressure", True)])).unwrap();
    let (code, body) = post(&http, ctl.addr, Some(&t0), &r5).await;
    assert_eq!((code, &body["accepted"]), (200, &json!(true)), "{body}");
    let after_first = writes(&ctl);
    assert_eq!(after_first, 1);

    // The captured report, verbatim, again and again: accepted=false every time.
    for _ in 0..TRIES {
        let (code, body) = post(&http, ctl.addr, Some(&t0), &r5).await;
        assert_eq!((code, &body["accepted"]), (200, &json!(false)), "{body}");
    }
    // An older sequence carrying a different (attacker-chosen) status: ignored too.
    let mut old = serde_json::to_value(report("n0", 3, &[])).unwrap();
    old["generated_at"] = json!(chrono::Utc::now());
    for _ in 0..TRIES {
        let (code, body) = post(&http, ctl.addr, Some(&t0), &old).await;
        assert_eq!((code, &body["accepted"]), (200, &json!(false)), "{body}");
    }
    // The captured report replayed with another node's token: 403.
    assert_eq!(codes(&http, ctl.addr, Some(&t1), &r5).await, all(403));
    assert_eq!(writes(&ctl), after_first, "a replay wrote the Node");
    assert_eq!(
        conditions(&nodes, "n0").await["NodekeeperDiskPressure"].0,
        "True"
    );
    assert_eq!(
        ctl.app.states.counters.replays.load(Relaxed),
        2 * TRIES as u64
    );
    ctl.stop().await;
}

/// Raw HTTP/1.1 over TLS (for what the agent's client never sends: chunked bodies, bad framing).
async fn raw(ctl_addr: std::net::SocketAddr, ca: &std::path::Path, request: &[u8]) -> String {
    let mut s = tls_connect(ctl_addr, ca).await;
    // The server may answer (413, 400) and close before the whole request is written: a broken pipe
    // here is expected, the answer is read below all the same.
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_bodies_and_oci_endpoint_abuse_are_rejected() {
    let env = Env::new(1).await;
    let ctl = env.controller(&config(&env), true).await;
    let http = https(&env.ca, ctl.addr);
    let t0 = env.token("n0", "nodekeeper").await;

    // Oversized report with a Content-Length: 413 (before authentication costs a TokenReview).
    let mut big = serde_json::to_value(report("n0", 1, &[])).unwrap();
    big["problems"] = json!(["x".repeat(2 << 20)]);
    let big = serde_json::to_vec(&big).unwrap();
    for _ in 0..TRIES {
        let r = request(
            &http,
            "POST",
            &ctl::url(ctl.addr, "/v1/reports"),
            Some(&t0),
            &[("content-type", "application/json")],
            Some(big.clone()),
        )
        .await;
        refused_unread(r, "/v1/reports");
    }
    // Oversized and chunked (no length up front): 413 as well.
    let chunk = "y".repeat(64 * 1024);
    let mut req = format!(
        "POST /v1/reports HTTP/1.1\r\nhost: c\r\nauthorization: Bearer {t0}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..40 {
        req.extend(format!("{:x}\r\n{chunk}\r\n", chunk.len()).bytes());
    }
    req.extend(b"0\r\n\r\n");
    let resp = raw(ctl.addr, &env.ca, &req).await;
    assert_eq!(status_of(&resp), 413, "{resp}");
    // Same on the OCI Events endpoint, authorized or not.
    let url = |p: &str| ctl::url(ctl.addr, p);
    let big_oci =
        serde_json::to_vec(&json!({"eventType": "x", "pad": "z".repeat(2 << 20)})).unwrap();
    for path in [
        format!("/v1/oci-events/{OCI_TOKEN}"),
        "/v1/oci-events/nope".to_string(),
    ] {
        let r = request(&http, "POST", &url(&path), None, &[], Some(big_oci.clone())).await;
        refused_unread(r, &path);
    }

    // OCI Events: wrong or missing shared secret, in the forms OCI Notifications sends (path,
    // Basic) and in the header that is off by default: 401 with a Basic challenge and no body,
    // every time, each counted.
    let ev = serde_json::to_vec(
        &json!({"eventType": nodekeeper_core::controller::api::oci_events::PREEMPTION,
        "data": {"resourceId": "ocid1.instance.oc1.phx.n0"}}),
    )
    .unwrap();
    let near = format!("{}X", &OCI_TOKEN[..OCI_TOKEN.len() - 1]);
    let basic = |user: &str, pass: &str| {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
    };
    let (wrong_user, wrong_pass) = (basic("admin", OCI_TOKEN), basic("nodekeeper", &near));
    let attempts: Vec<(String, Vec<(&str, &str)>)> = vec![
        ("/v1/oci-events".into(), vec![]),
        (
            "/v1/oci-events".into(),
            vec![("x-nodekeeper-token", "wrong")],
        ),
        // The header form is an opt-in extra, off here: even the right secret there is refused.
        (
            "/v1/oci-events".into(),
            vec![("x-nodekeeper-token", OCI_TOKEN)],
        ),
        ("/v1/oci-events".into(), vec![("authorization", OCI_TOKEN)]),
        (
            "/v1/oci-events".into(),
            vec![("authorization", &wrong_user)],
        ),
        (
            "/v1/oci-events".into(),
            vec![("authorization", &wrong_pass)],
        ),
        (format!("/v1/oci-events/{near}"), vec![]),
        (format!("/v1/oci-events/{OCI_TOKEN}{OCI_TOKEN}"), vec![]),
        ("/v1/oci-events/%20".into(), vec![]),
    ];
    let refused_before = ctl.app.oci.as_ref().unwrap().unauthorized.load(Relaxed);
    for (path, headers) in &attempts {
        for _ in 0..TRIES {
            let mut req = http.post(url(path)).body(ev.clone());
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 401, "{path} {headers:?}");
            let challenge = resp
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            assert!(challenge.starts_with("Basic "), "{path}: {challenge:?}");
            let body = resp.bytes().await.unwrap();
            assert!(body.is_empty(), "{path}: nothing echoed: {body:?}");
        }
    }
    let refused = ctl.app.oci.as_ref().unwrap().unauthorized.load(Relaxed) - refused_before;
    assert_eq!(refused, (attempts.len() * TRIES) as u64, "each 401 counted");
    let metrics = get(&http, ctl.addr, "/metrics").await.unwrap().1;
    assert!(
        metrics.contains(&format!(
            "nodekeeper_oci_events_unauthorized_total {}",
            refused_before + refused
        )),
        "{metrics}"
    );
    assert_eq!(ctl.app.states.counters.node_events.load(Relaxed), 0);
    // The right secret is accepted (so the 401s above are about the secret, not the request):
    // in the path, then with Basic authentication (the same event: no second Event).
    let (code, body) = request(
        &http,
        "POST",
        &url(&format!("/v1/oci-events/{OCI_TOKEN}")),
        None,
        &[],
        Some(ev.clone()),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(ctl.app.states.counters.node_events.load(Relaxed), 1);
    let good = basic("nodekeeper", OCI_TOKEN);
    let (code, body) = request(
        &http,
        "POST",
        &url("/v1/oci-events"),
        None,
        &[("authorization", &good)],
        Some(ev.clone()),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("\"new\":false"));
    // A report token is no OCI secret and vice versa.
    let (code, _) = request(
        &http,
        "POST",
        &url("/v1/oci-events"),
        Some(&t0),
        &[],
        Some(ev),
    )
    .await
    .unwrap();
    assert_eq!(code, 401);
    let own = serde_json::to_value(report("n0", 1, &[])).unwrap();
    assert_eq!(
        codes(&http, ctl.addr, Some(OCI_TOKEN), &own).await,
        all(401)
    );
    ctl.stop().await;
}

pub(crate) type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection (HTTP/1.1) to the controller, trusting only the test CA.
pub(crate) async fn tls_connect(addr: std::net::SocketAddr, ca: &std::path::Path) -> Tls {
    use rustls_pki_types::pem::PemObject;
    install_crypto();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// What one attacking connection saw: how long the server kept it, and what it answered.
#[derive(Debug)]
struct Held {
    after: Duration,
    response: String,
}

/// Sends `fast` at once, then `slow` one byte every `gap`, and returns when the server closes
/// the connection (or after `give_up`).
async fn slow_client(
    addr: std::net::SocketAddr,
    ca: std::path::PathBuf,
    fast: Vec<u8>,
    slow: Vec<u8>,
    gap: Duration,
    give_up: Duration,
) -> Held {
    let start = tokio::time::Instant::now();
    let s = tls_connect(addr, &ca).await;
    let (mut rd, mut wr) = tokio::io::split(s);
    let writer = tokio::spawn(async move {
        if wr.write_all(&fast).await.is_err() {
            return;
        }
        for b in &slow {
            if wr.write_all(&[*b]).await.is_err() || wr.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(gap).await;
        }
        // Then stay silent with the connection open.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(wr);
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(give_up, rd.read_to_end(&mut out)).await;
    writer.abort();
    Held {
        after: start.elapsed(),
        response: String::from_utf8_lossy(&out).into_owned(),
    }
}

/// Opens TCP connections that never start TLS; returns how long the server kept each.
async fn silent_tcp(addr: std::net::SocketAddr, give_up: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 64];
    let _ = tokio::time::timeout(give_up, s.read(&mut buf)).await;
    start.elapsed()
}

/// Slow-loris against both endpoints (headers byte by byte, bodies byte by byte, silent TCP
/// connections) while a legitimate agent keeps reporting: every attacking connection is cut by
/// the server within its limit without reaching a handler, and every legitimate report succeeds
/// within a bound during the attack.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_loris_is_cut_off_and_the_controller_stays_responsive() {
    const HEADERS: usize = 120;
    const BODIES: usize = 20;
    const SILENT: usize = 60;
    let limits = nodekeeper_core::serve::ServeLimits::default();
    let env = Env::new(1).await;
    let ctl = env.controller(&config(&env), true).await;
    let t0 = env.token("n0", "nodekeeper").await;
    let addr = ctl.addr;
    let gap = Duration::from_millis(300);
    let give_up = limits.request_timeout.unwrap() + Duration::from_secs(15);

    let mut attacks = Vec::new();
    for i in 0..HEADERS {
        let path = if i % 2 == 0 {
            "/v1/reports".to_string()
        } else {
            format!("/v1/oci-events/{OCI_TOKEN}")
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: c\r\nauthorization: Bearer {t0}\r\ncontent-type: application/json\r\nx-pad-{i}: {}\r\n\r\n",
            "a".repeat(200)
        );
        attacks.push(tokio::spawn(slow_client(
            addr,
            env.ca.clone(),
            vec![],
            head.into_bytes(),
            gap,
            give_up,
        )));
    }
    // Complete heads, bodies dribbled: the request deadline answers 408.
    let body = serde_json::to_vec(&report("n0", 999, &[])).unwrap();
    for i in 0..BODIES {
        let path = if i % 2 == 0 {
            "/v1/reports".to_string()
        } else {
            format!("/v1/oci-events/{OCI_TOKEN}")
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: c\r\nauthorization: Bearer {t0}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        attacks.push(tokio::spawn(slow_client(
            addr,
            env.ca.clone(),
            head.into_bytes(),
            body.clone(),
            gap,
            give_up,
        )));
    }
    let silent: Vec<_> = (0..SILENT)
        .map(|_| tokio::spawn(silent_tcp(addr, give_up)))
        .collect();

    // Meanwhile the real agent (the agent's own HTTPS client) reports every 200 ms.
    let http = https(&env.ca, addr);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut latencies = Vec::new();
    let attack_for = limits.header_read_timeout.unwrap() + Duration::from_secs(2);
    let end = tokio::time::Instant::now() + attack_for;
    let mut seq = 1;
    while tokio::time::Instant::now() < end {
        let t = tokio::time::Instant::now();
        let r =
            serde_json::to_value(report("n0", seq, &[("NodekeeperDiskPressure", True)])).unwrap();
        let (code, body) = post(&http, addr, Some(&t0), &r).await;
        latencies.push(t.elapsed());
        assert_eq!(
            code, 200,
            "legitimate report {seq} failed during the attack: {body}"
        );
        assert_eq!(body["accepted"], true);
        seq += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let worst = latencies.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{} legitimate reports during the attack, worst latency {worst:?}",
        latencies.len()
    );
    assert!(latencies.len() >= 10);
    assert!(
        worst < Duration::from_secs(3),
        "worst legitimate latency {worst:?}"
    );

    let mut header_cut = Vec::new();
    for a in attacks.drain(..HEADERS) {
        let h = a.await.unwrap();
        assert!(
            !h.response.contains(" 200 ") && !h.response.contains(" 202 "),
            "a slow-loris request got through: {}",
            h.response
        );
        header_cut.push(h.after);
    }
    let worst_cut = header_cut.iter().max().copied().unwrap_or_default();
    eprintln!("slow heads cut after at most {worst_cut:?}");
    assert!(
        worst_cut <= limits.header_read_timeout.unwrap() + Duration::from_secs(5),
        "a slow head was held for {worst_cut:?}"
    );
    for s in silent {
        let held = s.await.unwrap();
        assert!(
            held <= limits.tls_handshake_timeout + Duration::from_secs(5),
            "a silent TCP connection was held for {held:?}"
        );
    }
    for a in attacks {
        let h = a.await.unwrap();
        assert_eq!(status_of(&h.response), 408, "slow body: {}", h.response);
        assert!(
            h.after <= limits.request_timeout.unwrap() + Duration::from_secs(5),
            "a slow body was held for {:?}",
            h.after
        );
    }
    // None of the attacking requests reached the node state (only the legitimate reports did).
    assert_eq!(
        ctl.app.states.counters.reports.load(Relaxed),
        latencies.len() as u64
    );
    assert_eq!(ctl.app.states.counters.node_events.load(Relaxed), 0);
    ctl.stop().await;
}

/// The connection limit: connections beyond `max_connections` are closed at once (so a flood
/// cannot exhaust file descriptors), and a slot frees up as soon as a held connection goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_closed_at_once() {
    use nodekeeper_core::serve::{bind, ConnectionStats, ServeLimits};
    let limits = ServeLimits {
        max_connections: 8,
        ..ServeLimits::default()
    };
    let router = axum::Router::new().route("/livez", axum::routing::get(|| async { "ok" }));
    let cancel = tokio_util::sync::CancellationToken::new();
    let stats = std::sync::Arc::new(ConnectionStats::default());
    let (addr, serving) = bind(
        "127.0.0.1:0",
        router,
        None,
        limits,
        stats.clone(),
        cancel.clone(),
    )
    .await
    .unwrap();
    tokio::spawn(serving);
    let mut held = Vec::new();
    for _ in 0..limits.max_connections {
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // Let the server accept (and count) them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut refused = 0;
    for _ in 0..20 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
        assert!(r.is_ok(), "an over-limit connection was kept open");
        assert!(buf.is_empty(), "an over-limit connection was served");
        refused += 1;
    }
    assert_eq!(refused, 20);
    // what /metrics reports
    assert_eq!(
        (
            stats.open.load(Relaxed),
            stats.refused.load(Relaxed),
            stats.max.load(Relaxed)
        ),
        (8, 20, 8)
    );
    // One held connection goes: a new request is served.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    cancel.cancel();
}
