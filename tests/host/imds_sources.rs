//! Each metadata source against its emulator on a loopback port: a notice gives exactly one
//! event, a re-poll none, a removal one `Cancelled`; tokens are renewed; garbage, 5xx and slow
//! answers are typed errors and the source keeps working. Also the emulators' access rules.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use nodekeeper_core::agent::sources::config::{CloudChoice, NoticeKind, OciPollPath};
use nodekeeper_core::agent::sources::{
    aws::AwsSource, azure::AzureSource, gcp::GcpSource, oci::OciSource, Cloud, EventKind,
    EventSource, NodeEvent, PollOutcome, SourceError, SourcesConfig,
};
use nodekeeper_sim::imds::{oci as emu_oci, CancelWhat, ImdsEmulator};

async fn emulator(cloud: Cloud) -> ImdsEmulator {
    ImdsEmulator::start(cloud, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn config(url: &str) -> SourcesConfig {
    let mut cfg = SourcesConfig {
        endpoint: url.to_string(),
        ..SourcesConfig::default()
    };
    cfg.request_timeout = Duration::from_millis(700);
    // every poll reads every path (the AWS source reads its slower paths once per poll_interval)
    cfg.poll_interval = Duration::ZERO;
    cfg.gcp.long_poll_timeout = Duration::from_secs(2);
    cfg.host_root = std::env::temp_dir().join("nodekeeper-no-dmi");
    cfg.oci.poll_paths = vec![
        OciPollPath {
            path: emu_oci::PREEMPT_PATH.to_string(),
            kind: NoticeKind::Preemption,
        },
        OciPollPath {
            path: emu_oci::MAINTENANCE_PATH.to_string(),
            kind: NoticeKind::Maintenance,
        },
    ];
    cfg
}

fn clean(out: PollOutcome) -> Vec<NodeEvent> {
    assert!(out.errors.is_empty(), "unexpected errors: {:?}", out.errors);
    out.events
}

fn one(out: PollOutcome) -> NodeEvent {
    let mut ev = clean(out);
    assert_eq!(ev.len(), 1, "expected exactly one event: {ev:?}");
    ev.remove(0)
}

/// Notice → one event; re-poll → none; cancel → one `Cancelled` of that id; re-poll → none.
async fn lifecycle(
    src: &mut dyn EventSource,
    inject: impl FnOnce(),
    cancel: impl FnOnce(),
    kind: EventKind,
) {
    inject();
    let e = one(src.poll().await);
    assert_eq!(e.kind, kind, "{e:?}");
    assert_eq!(e.cloud, Some(src.cloud()));
    assert!(
        clean(src.poll().await).is_empty(),
        "re-poll must not repeat the notice"
    );
    cancel();
    let c = one(src.poll().await);
    assert_eq!(c.kind, EventKind::Cancelled { of: e.id.clone() }, "{c:?}");
    assert!(clean(src.poll().await).is_empty());
}

#[tokio::test]
async fn aws_notices_dedupe_and_cancel() {
    let emu = emulator(Cloud::Aws).await;
    let mut src = AwsSource::new(&config(&emu.url())).unwrap();
    assert!(clean(src.poll().await).is_empty());
    let d = Duration::from_secs(120);
    lifecycle(
        &mut src,
        || emu.preempt(d),
        || emu.cancel(CancelWhat::Preempt),
        EventKind::Preemption,
    )
    .await;
    lifecycle(
        &mut src,
        || emu.rebalance(),
        || emu.cancel(CancelWhat::Rebalance),
        EventKind::Rebalance,
    )
    .await;
    // AWS keeps a cancelled maintenance event listed with State "canceled": still a cancellation.
    let m = Duration::from_secs(600);
    lifecycle(
        &mut src,
        || emu.maintenance(m, ""),
        || emu.cancel(CancelWhat::Maintenance),
        EventKind::Reboot,
    )
    .await;
    let id = src.identity().await.unwrap();
    assert_eq!(id.instance_id, "i-0123456789abcdef0");
    assert_eq!(id.preemptible, Some(true));
    assert_eq!(id.zone.as_deref(), Some("us-east-1a"));
}

#[tokio::test]
async fn aws_token_is_renewed_on_401_and_before_expiry() {
    let emu = emulator(Cloud::Aws).await;
    let mut cfg = config(&emu.url());
    cfg.aws.token_ttl = Duration::from_secs(1);
    let mut src = AwsSource::new(&cfg).unwrap();
    emu.preempt(Duration::from_secs(120));
    let first = one(src.poll().await);
    emu.expire_tokens();
    assert!(
        clean(src.poll().await).is_empty(),
        "a 401 must renew the token, not fail or cancel"
    );
    assert_eq!(
        emu.shared().lock().tokens.len(),
        1,
        "exactly one new token after the 401"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        clean(src.poll().await).is_empty(),
        "an expired TTL must be renewed before use"
    );
    emu.cancel(CancelWhat::All);
    assert_eq!(
        one(src.poll().await).kind,
        EventKind::Cancelled { of: first.id }
    );
}

#[tokio::test]
async fn aws_bad_answers_are_typed_errors_and_never_cancel() {
    let emu = emulator(Cloud::Aws).await;
    let mut src = AwsSource::new(&config(&emu.url())).unwrap();
    emu.preempt(Duration::from_secs(120));
    one(src.poll().await);

    emu.inject_errors(503, 1);
    let out = src.poll().await;
    assert!(
        out.events.is_empty(),
        "a failed request must not look like a cancellation: {:?}",
        out.events
    );
    assert!(
        matches!(
            out.errors.as_slice(),
            [SourceError::Status { status: 503, .. }]
        ),
        "{:?}",
        out.errors
    );

    emu.inject_garbage(1);
    let out = src.poll().await;
    assert!(out.events.is_empty());
    assert!(
        matches!(out.errors.as_slice(), [SourceError::Parse { .. }]),
        "{:?}",
        out.errors
    );

    emu.set_latency(Duration::from_millis(1000));
    let out = src.poll().await;
    assert!(out.events.is_empty());
    assert!(
        !out.errors.is_empty()
            && out
                .errors
                .iter()
                .all(|e| matches!(e, SourceError::Timeout { .. })),
        "{:?}",
        out.errors
    );

    emu.set_latency(Duration::ZERO);
    assert!(
        clean(src.poll().await).is_empty(),
        "source recovers with the notice still known"
    );
    emu.cancel(CancelWhat::All);
    assert!(matches!(
        one(src.poll().await).kind,
        EventKind::Cancelled { .. }
    ));
}

#[tokio::test]
async fn azure_events_ack_and_cancel() {
    let emu = emulator(Cloud::Azure).await;
    let mut src = AzureSource::new(&config(&emu.url())).unwrap();
    let id = src.identity().await.unwrap();
    assert_eq!(id.name.as_deref(), Some("nodekeeper-vm"));
    assert_eq!(id.preemptible, Some(true));
    assert!(clean(src.poll().await).is_empty());
    let before = src.incarnation().unwrap();

    emu.preempt(Duration::from_secs(30));
    let e = one(src.poll().await);
    assert_eq!(e.kind, EventKind::Preemption);
    assert!(
        src.incarnation().unwrap() > before,
        "DocumentIncarnation must change"
    );
    let event_id = e.detail["event_id"].clone();
    src.ack(&event_id).await.unwrap();
    assert_eq!(emu.acks(), vec![event_id.clone()]);
    // The same through the free function (no running source needed).
    nodekeeper_core::agent::sources::azure::ack_event(&config(&emu.url()), &event_id)
        .await
        .unwrap();
    assert_eq!(emu.acks().len(), 2);
    assert!(
        clean(src.poll().await).is_empty(),
        "a started event is the same notice"
    );
    emu.cancel(CancelWhat::Preempt);
    assert_eq!(
        one(src.poll().await).kind,
        EventKind::Cancelled { of: e.id }
    );

    let m = Duration::from_secs(900);
    lifecycle(
        &mut src,
        || emu.maintenance(m, "Freeze"),
        || emu.cancel(CancelWhat::All),
        EventKind::Freeze,
    )
    .await;

    emu.inject_garbage(1);
    assert!(matches!(
        src.poll().await.errors.as_slice(),
        [SourceError::Parse { .. }]
    ));
    emu.inject_errors(500, 1);
    assert!(matches!(
        src.poll().await.errors.as_slice(),
        [SourceError::Status { status: 500, .. }]
    ));
    assert!(clean(src.poll().await).is_empty());
}

#[tokio::test]
async fn oci_generic_paths_and_identity() {
    let emu = emulator(Cloud::Oci).await;
    let mut src = OciSource::new(&config(&emu.url())).unwrap();
    let id = src.identity().await.unwrap();
    assert_eq!(id.zone.as_deref(), Some("PHX-AD-1"));
    assert_eq!(id.region.as_deref(), Some("us-phoenix-1"));
    assert_eq!(id.preemptible, Some(true));
    assert!(
        !serde_json::to_string(&id).unwrap().contains("IyEv"),
        "user_data must never be reported"
    );
    assert!(clean(src.poll().await).is_empty());
    let d = Duration::from_secs(120);
    lifecycle(
        &mut src,
        || emu.preempt(d),
        || emu.cancel(CancelWhat::Preempt),
        EventKind::Preemption,
    )
    .await;
    lifecycle(
        &mut src,
        || emu.maintenance(d, ""),
        || emu.cancel(CancelWhat::All),
        EventKind::Maintenance,
    )
    .await;
    emu.inject_errors(502, 1);
    assert!(matches!(
        src.poll().await.errors.as_slice(),
        [SourceError::Status { status: 502, .. }]
    ));
}

async fn poll_within(src: &mut GcpSource, limit: Duration) -> PollOutcome {
    tokio::time::timeout(limit, src.poll())
        .await
        .expect("long poll must return soon after the change")
}

#[tokio::test]
async fn gcp_long_polls_report_changes_quickly() {
    let emu = emulator(Cloud::Gcp).await;
    let mut src = GcpSource::new(&config(&emu.url())).unwrap();
    let id = src.identity().await.unwrap();
    assert_eq!(id.zone.as_deref(), Some("us-central1-a"));
    assert_eq!(id.instance_type.as_deref(), Some("e2-standard-4"));
    // First answers: the current values, nothing pending.
    // The first poll returns both keys' current values at once: nothing pending.
    assert!(clean(poll_within(&mut src, Duration::from_secs(1)).await).is_empty());
    // Inject through the admin API while the long polls are waiting.
    let admin = format!("{}/admin/preempt", emu.url());
    let inject = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let c = nodekeeper_core::http::plain_builder()
            .unwrap()
            .no_proxy()
            .build()
            .unwrap();
        let r = c
            .post(admin)
            .body(r#"{"in_secs":30}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    });
    let e = one(poll_within(&mut src, Duration::from_millis(1500)).await);
    inject.await.unwrap();
    assert_eq!(e.kind, EventKind::Preemption);

    emu.maintenance(Duration::from_secs(60), "");
    assert_eq!(
        one(poll_within(&mut src, Duration::from_secs(1)).await).kind,
        EventKind::Maintenance
    );

    // Brief 503s are retried quietly: the watcher's next two requests get 503, nothing is
    // reported, and the change still arrives.
    emu.inject_errors(503, 2);
    emu.cancel(CancelWhat::Preempt);
    let c = one(poll_within(&mut src, Duration::from_secs(3)).await);
    assert_eq!(c.kind, EventKind::Cancelled { of: e.id });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        emu.shared().lock().faults.remaining,
        0,
        "the 503s were consumed by retries"
    );
    let quiet = tokio::time::timeout(Duration::from_millis(300), src.poll()).await;
    assert!(quiet.is_err(), "503s must not be reported: {quiet:?}");

    // Garbage is a typed error; the watcher keeps going and later changes still arrive.
    emu.inject_garbage(1);
    emu.cancel(CancelWhat::All);
    let (mut parse_errors, mut kinds) = (0, Vec::new());
    while parse_errors == 0 || !kinds.contains(&"cancelled") {
        let out = poll_within(&mut src, Duration::from_secs(3)).await;
        assert!(
            out.errors
                .iter()
                .all(|e| matches!(e, SourceError::Parse { .. })),
            "{out:?}"
        );
        parse_errors += out.errors.len();
        kinds.extend(out.events.iter().map(|e| e.kind.name()));
    }
    emu.maintenance(Duration::from_secs(60), "TERMINATE_ON_HOST_MAINTENANCE");
    let t = one(poll_within(&mut src, Duration::from_secs(3)).await);
    assert_eq!(t.kind, EventKind::Termination);
}

/// The first GCP poll shows everything already pending, from both keys.
#[tokio::test]
async fn gcp_first_poll_shows_all_pending_notices() {
    let emu = emulator(Cloud::Gcp).await;
    emu.maintenance(Duration::from_secs(60), "");
    emu.preempt(Duration::from_secs(30));
    let mut src = GcpSource::new(&config(&emu.url())).unwrap();
    let mut kinds: Vec<_> = clean(poll_within(&mut src, Duration::from_secs(1)).await)
        .into_iter()
        .map(|e| e.kind.name())
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["maintenance", "preemption"]);
}

#[tokio::test]
async fn detection_probes_each_cloud() {
    for cloud in Cloud::ALL {
        let emu = emulator(cloud).await;
        let mut cfg = config(&emu.url());
        assert_eq!(
            nodekeeper_core::agent::sources::detect::probe(&cfg.endpoint, cfg.detect_timeout).await,
            Some(cloud)
        );
        cfg.cloud = CloudChoice::Auto;
        let report = nodekeeper_core::agent::sources::poll_once(&cfg).await;
        assert_eq!(report.cloud, Some(cloud));
        assert!(report.identity.is_some(), "{cloud}: {:?}", report.errors);
        assert!(report.errors.is_empty(), "{cloud}: {:?}", report.errors);
    }
    let emu = emulator(Cloud::Oci).await;
    let mut cfg = config(&emu.url());
    cfg.cloud = CloudChoice::Oci;
    cfg.oci.poll_paths.clear();
    let report = nodekeeper_core::agent::sources::poll_once(&cfg).await;
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("no IMDS preemption")),
        "{:?}",
        report.notes
    );
    let cfg = SourcesConfig {
        cloud: CloudChoice::None,
        ..config("http://127.0.0.1:9")
    };
    assert_eq!(
        nodekeeper_core::agent::sources::poll_once(&cfg).await.cloud,
        None
    );
}

#[tokio::test]
async fn driver_forwards_events_and_stops() {
    use nodekeeper_core::agent::sources::driver::{run, SourceMessage};
    let emu = emulator(Cloud::Aws).await;
    let src = nodekeeper_core::agent::sources::build(Cloud::Aws, &config(&emu.url())).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        src,
        Duration::from_millis(50),
        Duration::from_secs(1),
        tx,
        stop.clone(),
    ));
    emu.preempt(Duration::from_secs(120));
    let msg = tokio::time::timeout(Duration::from_secs(2), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(msg, SourceMessage::Event(ref e) if e.kind == EventKind::Preemption),
        "{msg:?}"
    );
    emu.inject_errors(500, 1);
    let msg = tokio::time::timeout(Duration::from_secs(2), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(msg, SourceMessage::Error { source: "aws", .. }),
        "{msg:?}"
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .unwrap()
        .unwrap();
}

/// The AWS source reads the Spot notice every `spot_poll_interval` (the driver polls that often)
/// and the rebalance and scheduled-events paths only once per `poll_interval`.
#[tokio::test]
async fn aws_reads_the_spot_notice_more_often_than_the_other_paths() {
    use nodekeeper_core::agent::sources::driver::run;
    use nodekeeper_sim::imds::aws::{SCHEDULED_PATH, SPOT_PATH};
    let emu = emulator(Cloud::Aws).await;
    let mut cfg = config(&emu.url());
    cfg.poll_interval = Duration::from_secs(10);
    cfg.aws.spot_poll_interval = Duration::from_millis(50);
    let src = nodekeeper_core::agent::sources::build(Cloud::Aws, &cfg).unwrap();
    let (tx, _rx) = tokio::sync::mpsc::channel(8);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        src,
        cfg.poll_interval,
        Duration::from_secs(30),
        tx,
        stop.clone(),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while emu.requests_to(SPOT_PATH) < 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Spot notice was read {} times in 10 s",
            emu.requests_to(SPOT_PATH)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    task.await.unwrap();
    // 10 Spot reads take ~0.5 s: the scheduled events were read once (first poll), not again
    // before poll_interval (10 s) had passed
    assert_eq!(emu.requests_to(SCHEDULED_PATH), 1);
}

/// The emulators enforce each cloud's access rules.
#[tokio::test]
async fn emulators_enforce_access_rules() {
    let http = nodekeeper_core::http::plain_builder()
        .unwrap()
        .no_proxy()
        .build()
        .unwrap();
    let status =
        |r: reqwest::RequestBuilder| async move { r.send().await.unwrap().status().as_u16() };

    let oci = emulator(Cloud::Oci).await;
    let u = oci.url();
    assert_eq!(status(http.get(format!("{u}/opc/v2/instance/"))).await, 401);
    assert_eq!(status(http.get(format!("{u}/opc/v1/instance/"))).await, 404);
    assert_eq!(
        status(http.get(format!("{u}/openstack/latest/meta_data.json"))).await,
        404
    );
    let v2 = |p: &str| {
        http.get(format!("{u}{p}"))
            .header("Authorization", "Bearer Oracle")
    };
    assert_eq!(status(v2("/opc/v2/instance/")).await, 200);
    assert_eq!(
        status(v2("/opc/v2/instance/").header("X-Forwarded-For", "1.2.3.4")).await,
        400
    );
    assert_eq!(status(v2(emu_oci::PREEMPT_PATH)).await, 404);
    let region = v2("/opc/v2/instance/region")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(region, "phx");

    let aws = emulator(Cloud::Aws).await;
    let u = aws.url();
    assert_eq!(
        status(http.get(format!("{u}/latest/meta-data/instance-id"))).await,
        401
    );
    assert_eq!(status(http.put(format!("{u}/latest/api/token"))).await, 400);
    for bad in ["0", "21601", "x"] {
        let r = http
            .put(format!("{u}/latest/api/token"))
            .header("X-aws-ec2-metadata-token-ttl-seconds", bad);
        assert_eq!(status(r).await, 400, "ttl {bad}");
    }
    let granted = http
        .put(format!("{u}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "1")
        .send()
        .await
        .unwrap();
    // The granted TTL comes back in the same header, as IMDS and AEMM answer (NTH needs it).
    assert_eq!(
        granted
            .headers()
            .get("X-aws-ec2-metadata-token-ttl-seconds")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let tok = granted.text().await.unwrap();
    let get = |p: &str| {
        http.get(format!("{u}{p}"))
            .header("X-aws-ec2-metadata-token", tok.clone())
    };
    assert_eq!(status(get("/latest/meta-data/instance-id")).await, 200);
    assert_eq!(
        status(get("/latest/meta-data/spot/instance-action")).await,
        404
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        status(get("/latest/meta-data/instance-id")).await,
        401,
        "expired token"
    );

    let az = emulator(Cloud::Azure).await;
    let u = format!(
        "{}/metadata/scheduledevents?api-version=2020-07-01",
        az.url()
    );
    assert_eq!(status(http.get(&u)).await, 400);
    assert_eq!(status(http.get(&u).header("Metadata", "true")).await, 200);
    assert_eq!(
        status(
            http.get(&u)
                .header("Metadata", "true")
                .header("X-Forwarded-For", "1.2.3.4")
        )
        .await,
        400
    );
    assert_eq!(
        status(
            http.get(format!("{}/metadata/scheduledevents", az.url()))
                .header("Metadata", "true")
        )
        .await,
        400
    );
    assert_eq!(
        status(http.post(&u).header("Metadata", "true").body("{not json")).await,
        400
    );

    let gcp = emulator(Cloud::Gcp).await;
    let u = format!("{}/computeMetadata/v1/instance/preempted", gcp.url());
    assert_eq!(status(http.get(&u)).await, 403);
    let r = http
        .get(&u)
        .header("Metadata-Flavor", "Google")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let etag = r.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(r.text().await.unwrap(), "FALSE");
    // A long poll with the current ETag waits for the timeout and returns the same ETag.
    let t = std::time::Instant::now();
    let r = http
        .get(format!(
            "{u}?wait_for_change=true&last_etag={etag}&timeout_sec=1"
        ))
        .header("Metadata-Flavor", "Google")
        .send()
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag);
}

/// The admin API refuses bad requests and survives extreme values.
#[tokio::test]
async fn admin_api_rejects_bad_input() {
    let http = nodekeeper_core::http::plain_builder()
        .unwrap()
        .no_proxy()
        .build()
        .unwrap();
    let emu = emulator(Cloud::Aws).await;
    let post =
        |p: &str, b: &'static str| http.post(format!("{}/admin/{p}", emu.url())).body(b).send();
    assert_eq!(
        post("preempt", "{nope").await.unwrap().status().as_u16(),
        400
    );
    assert_eq!(
        post("preempt", r#"{"bogus":1}"#)
            .await
            .unwrap()
            .status()
            .as_u16(),
        400
    );
    assert_eq!(
        post("errors", r#"{"status":42}"#)
            .await
            .unwrap()
            .status()
            .as_u16(),
        400
    );
    assert_eq!(
        post("cancel", r#"{"what":"everything"}"#)
            .await
            .unwrap()
            .status()
            .as_u16(),
        400
    );
    let huge = post("maintenance", r#"{"in_secs":18446744073709551615}"#)
        .await
        .unwrap();
    assert_eq!(huge.status().as_u16(), 200);
    let mut src = AwsSource::new(&config(&emu.url())).unwrap();
    assert_eq!(one(src.poll().await).kind, EventKind::Reboot);
    assert_eq!(post("cancel", "").await.unwrap().status().as_u16(), 200);
    assert!(matches!(
        one(src.poll().await).kind,
        EventKind::Cancelled { .. }
    ));
}
