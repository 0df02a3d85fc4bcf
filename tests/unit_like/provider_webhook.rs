//! The webhook provider against a tiny axum receiver on 127.0.0.1 that verifies the HMAC signature.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use nodekeeper_core::controller::act::provider::webhook::{
    backoff, sign, Webhook, SIGNATURE_HEADER,
};
use nodekeeper_core::controller::act::provider::{
    CallError, NodeProvider, ProviderConfig, ProviderError, ReplacementRequest, WebhookConfig,
};

const SECRET: &str = "s3cret-key";

#[derive(Default)]
struct Receiver {
    /// Answer 503 to this many requests first.
    fail_first: u32,
    /// Answer this status to every valid request instead of 202, when set.
    always: Option<u16>,
    calls: AtomicU32,
    bodies: Mutex<Vec<serde_json::Value>>,
    bad_signatures: AtomicU32,
}

async fn handle(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let n = r.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let got = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // Independent check of the signature (hmac crate directly, not the provider's `sign`).
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(&body);
    let want = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    if got != want {
        r.bad_signatures.fetch_add(1, Ordering::SeqCst);
        return StatusCode::UNAUTHORIZED;
    }
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    if key != json["request_id"].as_str() {
        return StatusCode::UNPROCESSABLE_ENTITY;
    }
    r.bodies.lock().unwrap().push(json);
    if let Some(s) = r.always {
        return StatusCode::from_u16(s).unwrap();
    }
    if n <= r.fail_first {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::ACCEPTED
    }
}

async fn serve(r: Arc<Receiver>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/replace", post(handle)).with_state(r);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/replace")
}

fn config(url: String, secret: &str) -> WebhookConfig {
    WebhookConfig {
        url,
        ca_file: None,
        secret: secret.into(),
        timeout: Duration::from_secs(2),
        max_attempts: 4,
        backoff: Duration::from_millis(20),
    }
}

fn request() -> ReplacementRequest {
    let mut req = ReplacementRequest::new("general-1", "interruption", "notice-17");
    req.pool = Some("general".into());
    req.provider_id = Some("sim:///general-1".into());
    req
}

#[tokio::test]
async fn retries_503_then_accepts_once_per_request_id() {
    let r = Arc::new(Receiver {
        fail_first: 2,
        ..Default::default()
    });
    let url = serve(r.clone()).await;
    let p = Webhook::new(config(url.clone(), SECRET), true).unwrap();
    let req = request();
    let t = p.request_replacement(&req).await.unwrap();
    assert_eq!(r.calls.load(Ordering::SeqCst), 3, "two 503s, then 202");
    assert_eq!(r.bad_signatures.load(Ordering::SeqCst), 0);
    assert_eq!(t.provider, "webhook");
    assert_eq!(t.request_id, req.request_id);
    assert_eq!(
        t.reference,
        Some(nodekeeper_core::http::redact_url(&url)),
        "the URL as printed (its path may hold a secret)"
    );
    let bodies = r.bodies.lock().unwrap().clone();
    assert_eq!(bodies[2]["action"], "replace-node");
    assert_eq!(bodies[2]["node"], "general-1");
    assert_eq!(bodies[2]["pool"], "general");
    assert_eq!(bodies[2]["provider_id"], "sim:///general-1");
    assert_eq!(bodies[2]["reason"], "interruption");
    assert_eq!(bodies[2]["request_id"], req.request_id.as_str());

    // Same id again: no second POST.
    let t2 = p.request_replacement(&req).await.unwrap();
    assert_eq!(t, t2);
    assert_eq!(r.calls.load(Ordering::SeqCst), 3);
    assert_eq!(p.replacement_ready(&t).await.unwrap(), None);
}

#[tokio::test]
async fn a_400_is_permanent_and_not_retried() {
    let r = Arc::new(Receiver {
        always: Some(400),
        ..Default::default()
    });
    let p = Webhook::new(config(serve(r.clone()).await, SECRET), true).unwrap();
    let err = p.request_replacement(&request()).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert!(err.to_string().contains("400"), "{err}");
    assert!(err.to_string().contains("general-1"), "{err}");
    // The cause is the answer itself, as a source the caller can read.
    let Some(CallError::Status {
        status, request, ..
    }) = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<CallError>())
    else {
        panic!("no status in the cause of {err:?}");
    };
    assert_eq!(*status, 400);
    assert!(request.starts_with("POST http://127.0.0.1:"), "{request}");
    assert_eq!(r.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_wrong_secret_is_refused_by_the_receiver() {
    let r = Arc::new(Receiver::default());
    let p = Webhook::new(config(serve(r.clone()).await, "not-the-secret"), true).unwrap();
    let err = p.request_replacement(&request()).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert_eq!(r.bad_signatures.load(Ordering::SeqCst), 1);
    assert!(
        !err.to_string().contains("not-the-secret"),
        "secret leaked: {err}"
    );
    assert!(!format!("{p:?}").contains("not-the-secret"));
}

#[tokio::test]
async fn persistent_503_gives_up_after_max_attempts() {
    let r = Arc::new(Receiver {
        always: Some(503),
        ..Default::default()
    });
    let p = Webhook::new(config(serve(r.clone()).await, SECRET), true).unwrap();
    let err = p.request_replacement(&request()).await.unwrap_err();
    assert!(
        matches!(
            err,
            ProviderError::Transient {
                attempts: 4,
                source: CallError::Status { status: 503, .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(r.calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn connection_refused_is_retried_then_transient() {
    // Bound, never listening: every connection is refused.
    let (_held, addr) = crate::support::refused_addr();
    let p = Webhook::new(config(format!("http://{addr}/x"), SECRET), true).unwrap();
    let err = p.request_replacement(&request()).await.unwrap_err();
    assert!(!err.is_permanent(), "{err}");
    // The transport error is kept as the source, its own chain down to the refused connect.
    let ProviderError::Transient {
        source: CallError::Send { source, .. },
        ..
    } = &err
    else {
        panic!("not a transport failure: {err:?}");
    };
    assert!(source.is_connect(), "{source:?}");
    let chain = nodekeeper_core::telemetry::error_chain(&err);
    assert!(chain.contains(&addr.to_string()), "{chain}");
}

#[test]
fn signature_matches_a_known_vector() {
    // RFC 4231 test case 2.
    assert_eq!(
        sign(b"Jefe", b"what do ya want for nothing?"),
        "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

#[test]
fn config_validation() {
    let ok = ProviderConfig::Webhook(config("http://127.0.0.1:8080/x".into(), "k"));
    assert!(ok.validate().is_empty());
    let https = ProviderConfig::Webhook(config("https://hooks.example.com/x".into(), "k"));
    assert!(https.validate().is_empty(), "https is fine");
    let plain = ProviderConfig::Webhook(config("http://hooks.example.com/x".into(), "k"));
    let d = plain.validate();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        d[0].severity,
        nodekeeper_core::config::Severity::Warning,
        "{d:?}"
    );
    assert!(d[0].message.contains("in the clear"), "{d:?}");
    let bad = ProviderConfig::Webhook(WebhookConfig {
        url: "ftp://example.invalid/x".into(),
        ca_file: None,
        secret: String::new().into(),
        timeout: Duration::ZERO,
        max_attempts: 0,
        backoff: Duration::from_millis(1),
    });
    let d = bad.validate();
    assert_eq!(d.len(), 4, "{d:?}");
    assert!(d[0].message.contains("ftp"), "{d:?}");
    assert!(ProviderConfig::None.validate().is_empty());
    assert!(ProviderConfig::Karpenter.validate().is_empty());
}

#[test]
fn config_parses_from_toml() {
    let c: ProviderConfig = toml::from_str(
        "kind = \"webhook\"\nurl = \"http://127.0.0.1:9/r\"\nsecret = \"x\"\ntimeout = \"3s\"\n",
    )
    .unwrap();
    let ProviderConfig::Webhook(w) = c else {
        panic!("not a webhook: {c:?}")
    };
    assert_eq!(w.timeout, Duration::from_secs(3));
    assert_eq!(w.max_attempts, 5);
    let k: ProviderConfig = toml::from_str("kind = \"karpenter\"").unwrap();
    assert_eq!(k, ProviderConfig::Karpenter);
    let n: ProviderConfig = toml::from_str("kind = \"none\"").unwrap();
    assert_eq!(n, ProviderConfig::None);
    // `kind = "oci"` alone parses (workload identity needs no API key); validation names what
    // is missing: the region and, for the default `auth = "api-key"`, the key's settings.
    let o: ProviderConfig = toml::from_str("kind = \"oci\"").unwrap();
    let d = o.validate();
    for key in ["region", "tenancy", "user", "fingerprint", "key_file"] {
        assert!(
            d.iter().any(|d| format!("{:?}", d.path).contains(key)),
            "{key}: {d:?}"
        );
    }
}

#[test]
fn backoff_is_exponential_jittered_and_capped() {
    for _ in 0..100 {
        // The one rule (crates/core/src/backoff.rs): uniform in [d/2, d], d doubling, capped at 30 s.
        let b1 = backoff(Duration::from_millis(100), 1);
        assert!(
            b1 >= Duration::from_millis(50) && b1 <= Duration::from_millis(100),
            "{b1:?}"
        );
        let b3 = backoff(Duration::from_millis(100), 3);
        assert!(
            b3 >= Duration::from_millis(200) && b3 <= Duration::from_millis(400),
            "{b3:?}"
        );
        let big = backoff(Duration::from_secs(1), 40);
        assert!(
            big >= Duration::from_secs(15) && big <= Duration::from_secs(30),
            "{big:?}"
        );
    }
}

/// A receiver behind TLS with a certificate of a private CA (written into `dir`): (url, CA file).
async fn serve_tls(r: Arc<Receiver>, dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let (ca_file, crt, pem) = (dir.join("ca.pem"), dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    std::fs::write(&crt, cert.pem()).unwrap();
    std::fs::write(&pem, key.serialize_pem()).unwrap();
    let tls = nodekeeper_core::serve::tls_config(&crt, &pem).unwrap();
    let app = Router::new().route("/replace", post(handle)).with_state(r);
    let (addr, serving) = nodekeeper_core::serve::bind(
        "127.0.0.1:0",
        app,
        Some(tls),
        Default::default(),
        Default::default(),
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    tokio::spawn(serving);
    (
        format!("https://localhost:{}/replace", addr.port()),
        ca_file,
    )
}

#[tokio::test]
async fn https_receiver_with_a_private_ca_gets_the_signed_request() {
    let dir = tempfile::tempdir().unwrap();
    let r = Arc::new(Receiver::default());
    let (url, ca) = serve_tls(r.clone(), dir.path()).await;
    let mut cfg = config(url, SECRET);
    cfg.ca_file = Some(ca);
    let w = Webhook::new(cfg, true).unwrap();
    let t = w.request_replacement(&request()).await.unwrap();
    assert_eq!(t.provider, "webhook");
    assert_eq!(r.calls.load(Ordering::SeqCst), 1);
    assert_eq!(r.bad_signatures.load(Ordering::SeqCst), 0);
    assert_eq!(r.bodies.lock().unwrap()[0]["node"], "general-1");
}

#[tokio::test]
async fn https_receiver_of_an_unknown_ca_is_refused_and_never_reached() {
    let dir = tempfile::tempdir().unwrap();
    let r = Arc::new(Receiver::default());
    let (url, _ca) = serve_tls(r.clone(), dir.path()).await;
    let mut cfg = config(url, SECRET);
    cfg.max_attempts = 1;
    let w = Webhook::new(cfg, true).unwrap();
    let e = w.request_replacement(&request()).await.unwrap_err();
    let text = format!("{e} {:?}", e);
    assert!(
        text.to_lowercase().contains("certificate") || text.contains("UnknownIssuer"),
        "{text}"
    );
    assert_eq!(r.calls.load(Ordering::SeqCst), 0, "no request got through");
}

#[test]
fn a_bad_ca_file_is_a_setup_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("empty.pem");
    std::fs::write(&ca, "not a certificate").unwrap();
    let mut cfg = config("https://localhost:1/x".into(), SECRET);
    cfg.ca_file = Some(ca.clone());
    let e = Webhook::new(cfg, true).unwrap_err().to_string();
    assert!(e.contains(&ca.display().to_string()), "{e}");
    assert!(e.contains("no certificate"), "{e}");
}

/// Probe 4, the provider's webhook: a 307 to another host is not followed (the signed request
/// body never reaches it); the 3xx is the answer.
#[tokio::test]
async fn a_redirect_is_not_followed() {
    let elsewhere = Arc::new(Receiver::default());
    let other = serve(elsewhere.clone()).await;
    let app = Router::new().route(
        "/replace",
        post(move || {
            let to = other.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [("location", to)]) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let p = Webhook::new(config(format!("http://{addr}/replace"), SECRET), true).unwrap();
    let err = p.request_replacement(&request()).await.unwrap_err();
    assert!(err.to_string().contains("307"), "{err}");
    assert_eq!(
        elsewhere.calls.load(Ordering::SeqCst),
        0,
        "followed the redirect"
    );
}

/// Probe 3 for configured URLs: without `[controller] allow_loopback_destinations` a webhook on
/// loopback is refused — an IP host when the provider is built, a name resolving to loopback
/// when the request would be sent (the receiver is never reached); with it, both work.
#[tokio::test]
async fn a_loopback_webhook_needs_the_opt_in() {
    let r = Arc::new(Receiver::default());
    let url = serve(r.clone()).await;
    let e = Webhook::new(config(url.clone(), SECRET), false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("refused") && e.contains("loopback"), "{e}");
    let by_name = url.replace("127.0.0.1", "localhost");
    let mut cfg = config(by_name.clone(), SECRET);
    cfg.max_attempts = 1;
    let p = Webhook::new(cfg, false).unwrap();
    let err = p.request_replacement(&request()).await.unwrap_err();
    let chain = format!("{err:?}");
    assert!(chain.contains("refused"), "{chain}");
    assert_eq!(
        r.calls.load(Ordering::SeqCst),
        0,
        "the loopback receiver was reached"
    );
    let p = Webhook::new(config(by_name, SECRET), true).unwrap();
    p.request_replacement(&request()).await.unwrap();
    assert_eq!(r.calls.load(Ordering::SeqCst), 1);
}
