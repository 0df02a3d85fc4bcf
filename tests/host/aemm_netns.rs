//! The agent's AWS source against its real peer: Amazon's EC2 metadata mock (AEMM, v1.13.0, built
//! from its Go module by `scripts/setup-peers.sh aemm`), at 169.254.169.254:80 inside a private
//! network namespace (the harness of `imds_netns`, `tests/support/netns.rs`). AEMM runs with
//! `--imdsv2` (a GET without a token is refused), and each scenario reads what AEMM serves over
//! plain HTTP in the namespace, then asserts that what the source yields — kind, times, ids,
//! action — is exactly that: the spot interruption notice (at a fixed time, at AEMM's moving
//! default, and after AEMM's delay, 404 until then), the rebalance recommendation, scheduled
//! events (maintenance, stop, reboot; canceled and completed ones), the identity document, the
//! IMDSv2 token (its TTL header, renewal before expiry, renewal on 401 after AEMM restarts), and
//! auto-detection.
//! A missing AEMM binary or Go fails the test; nothing is sent to 169.254.169.254 from the host
//! namespace.
#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use nodekeeper_core::agent::sources::config::CloudChoice;
use nodekeeper_core::agent::sources::{
    build, poll_once, Cloud, EventKind, EventSource, NodeEvent, PollOutcome, SourcesConfig,
};
use tokio::net::TcpStream;

use crate::support::{netns, wait};

const INNER: &str = "inner_aws_source_against_aemm";
/// The AEMM binary the outer test built, for the inner test.
const AEMM_ENV: &str = "NODEKEEPER_TEST_AEMM";

// The test's own copy of IMDS's paths and headers (AWS's documentation), never the agent's.
const BASE: &str = "http://169.254.169.254";
const TOKEN_PATH: &str = "/latest/api/token";
const TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
const SPOT: &str = "/latest/meta-data/spot/instance-action";
const REBALANCE: &str = "/latest/meta-data/events/recommendations/rebalance";
const SCHEDULED: &str = "/latest/meta-data/events/maintenance/scheduled";
const LIFECYCLE: &str = "/latest/meta-data/instance-life-cycle";
const IDENTITY: &str = "/latest/dynamic/instance-identity/document";

#[test]
#[ignore = "needs root (unshare -n) and Go (scripts/setup-peers.sh builds AEMM on first use)"]
fn aws_source_against_aemm_in_a_netns() {
    assert!(
        netns::is_root(),
        "needs root for `unshare -n`: run as root, as CI does, or leave out `--include-ignored`"
    );
    // Built once, then cached (≈ 20 s cold); scripts/setup.sh builds it for CI beforehand.
    let out = Command::new(crate::support::repo().join("scripts/setup-peers.sh"))
        .arg("aemm")
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/setup-peers.sh");
    assert!(
        out.status.success(),
        "building AEMM failed (scripts/setup-peers.sh aemm; needs Go and the Go module proxy)"
    );
    let dir = String::from_utf8(out.stdout).unwrap();
    let bin = Path::new(dir.lines().last().unwrap_or_default().trim()).join("ec2-metadata-mock");
    assert!(
        bin.is_file(),
        "scripts/setup-peers.sh aemm printed {dir:?}, which has no ec2-metadata-mock"
    );
    let stdout = netns::run_inner_with(
        &crate::support::test_name(module_path!(), INNER),
        &[(AEMM_ENV, bin.as_os_str())],
    );
    assert!(stdout.contains("aemm: all scenarios ok"), "{stdout}");
}

/// AEMM on 169.254.169.254:80, killed (by its PID) and reaped when dropped; its log (stdout and
/// stderr) in a file.
struct Aemm {
    child: Child,
    log: PathBuf,
}

impl Aemm {
    /// Starts `ec2-metadata-mock ARGS --imdsv2 -n 169.254.169.254 -p 80` with `HOME` in `dir`
    /// (no config file of the machine's is read) and waits until it accepts connections. The
    /// wait is async, so the runtime's connection tasks see a previous AEMM's sockets close
    /// meanwhile (a blocked runtime would reuse a dead keep-alive connection).
    async fn start(dir: &Path, name: &str, args: &[&str]) -> Self {
        let bin = std::env::var_os(AEMM_ENV).expect("the outer test passes AEMM's path");
        let log = dir.join(format!("aemm-{name}.log"));
        let f = File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(args)
            .args(["--imdsv2", "-n", "169.254.169.254", "-p", "80"])
            .env("HOME", dir)
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("start ec2-metadata-mock");
        let mut aemm = Self { child, log };
        let addr: SocketAddr = "169.254.169.254:80".parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).await.is_err() {
            if let Some(st) = aemm.child.try_wait().unwrap() {
                panic!("AEMM {args:?} exited ({st}):\n{}", aemm.log_text());
            }
            assert!(Instant::now() < deadline, "AEMM {args:?} did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        aemm
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many lines of AEMM's log contain `what`.
    fn count(&self, what: &str) -> usize {
        self.log_text().lines().filter(|l| l.contains(what)).count()
    }
}

impl Drop for Aemm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// AEMM's log lines (pkg/mock/imdsv2).
const AEMM_TOKEN_ISSUED: &str = "GenerateToken Received request";
const AEMM_TOKEN_UNKNOWN: &str = "Invalid token provided";
const AEMM_TOKEN_EXPIRED: &str = "Token has expired";

/// Plain HTTP to AEMM, as a shell with curl would read it.
struct Reader {
    http: reqwest::Client,
}

impl Reader {
    fn new() -> Self {
        let http = nodekeeper_core::http::plain_builder()
            .unwrap()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        Self { http }
    }

    /// PUT a token with `ttl`; returns it and the TTL header of the answer.
    async fn token(&self, ttl: u64) -> (String, Option<String>) {
        let r = self
            .http
            .put(format!("{BASE}{TOKEN_PATH}"))
            .header(TTL_HEADER, ttl.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "token PUT");
        let ttl = r
            .headers()
            .get(TTL_HEADER)
            .map(|v| v.to_str().unwrap().to_string());
        (r.text().await.unwrap(), ttl)
    }

    /// GET `path` (with a fresh token unless `v1`): status and body.
    async fn get(&self, path: &str, v1: bool) -> (u16, String) {
        let mut req = self.http.get(format!("{BASE}{path}"));
        if !v1 {
            req = req.header(TOKEN_HEADER, self.token(60).await.0);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// GET `path` with a token; panics unless 200 and JSON.
    async fn json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get(path, false).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }
}

fn rfc3339(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .with_timezone(&Utc)
}

/// The time as AEMM formats scheduled events: Go's layout `2 Jan 2006 15:04:05 GMT`.
fn go_event_layout(t: DateTime<Utc>) -> String {
    t.format("%-d %b %Y %H:%M:%S GMT").to_string()
}

fn config(dir: &Path) -> SourcesConfig {
    let cfg = SourcesConfig {
        cloud: CloudChoice::Aws,
        host_root: dir.to_path_buf(),
        ..Default::default()
    };
    assert_eq!(cfg.endpoint, BASE, "the default endpoint is used");
    cfg
}

async fn poll(src: &mut Box<dyn EventSource>) -> PollOutcome {
    let out = tokio::time::timeout(Duration::from_secs(10), src.poll())
        .await
        .expect("a poll within 10 s");
    assert!(out.errors.is_empty(), "poll errors: {:?}", out.errors);
    out
}

fn only(events: &[NodeEvent], source: &str) -> NodeEvent {
    let of: Vec<_> = events.iter().filter(|e| e.source == source).collect();
    assert_eq!(of.len(), 1, "one event from {source}: {events:#?}");
    of[0].clone()
}

#[tokio::test]
#[ignore = "runs inside a network namespace, started by aws_source_against_aemm_in_a_netns"]
async fn inner_aws_source_against_aemm() {
    if !netns::is_child() {
        eprintln!("{INNER}: a helper, only run by aws_source_against_aemm_in_a_netns");
        return;
    }
    netns::assert_inside();
    let dir = tempfile::tempdir().unwrap();
    let reader = Reader::new();
    spot_with_fixed_times_and_tokens(dir.path(), &reader).await;
    println!("aemm: spot (fixed times), identity, IMDSv2 tokens ok");
    spot_with_moving_times(dir.path(), &reader).await;
    println!("aemm: spot (AEMM's moving times) ok");
    spot_after_a_delay(dir.path(), &reader).await;
    println!("aemm: spot (AEMM's delay: 404, then the notice) ok");
    scheduled_events(dir.path(), &reader).await;
    println!("aemm: scheduled events ok");
    detection(dir.path()).await;
    println!("aemm: auto-detection ok");
    println!("aemm: all scenarios ok");
}

/// `spot -a stop -t T -r R`: the notice and the recommendation at fixed times; the identity
/// document; IMDSv2: v1 refused, TTL header, renewal before expiry and on 401.
async fn spot_with_fixed_times_and_tokens(dir: &Path, reader: &Reader) {
    let t = "2027-03-05T06:09:08Z";
    let r = "2027-03-05T06:07:08Z";
    let args = ["spot", "-a", "stop", "-t", t, "-r", r];
    let aemm = Aemm::start(dir, "spot-fixed", &args).await;

    // IMDSv2 required: a v1 GET is refused; the token answer names its TTL.
    let (status, _) = reader.get(SPOT, true).await;
    assert_eq!(status, 401, "AEMM --imdsv2 refuses a GET without a token");
    let (tok, ttl) = reader.token(21600).await;
    assert!(!tok.is_empty());
    assert_eq!(ttl.as_deref(), Some("21600"), "AEMM echoes the TTL");

    let spot = reader.json(SPOT).await;
    let rebalance = reader.json(REBALANCE).await;
    assert_eq!(spot["time"], t, "{spot}");
    assert_eq!(
        reader.get(SCHEDULED, false).await.0,
        404,
        "spot mode serves no scheduled events"
    );

    let mut src = build(Cloud::Aws, &config(dir)).unwrap();
    let issued = aemm.count(AEMM_TOKEN_ISSUED);
    let out = poll(&mut src).await;
    assert_eq!(out.events.len(), 2, "{:#?}", out.events);
    let pre = only(&out.events, "aws/spot");
    assert_eq!(pre.kind, EventKind::Preemption);
    assert_eq!(pre.cloud, Some(Cloud::Aws));
    assert_eq!(pre.deadline, Some(rfc3339(spot["time"].as_str().unwrap())));
    assert_eq!(pre.not_before, pre.deadline);
    assert_eq!(
        pre.detail.get("action").map(String::as_str),
        spot["action"].as_str()
    );
    let reb = only(&out.events, "aws/rebalance");
    assert_eq!(reb.kind, EventKind::Rebalance);
    assert_eq!(
        reb.detail.get("notice_time").map(|s| rfc3339(s)),
        Some(rfc3339(rebalance["noticeTime"].as_str().unwrap()))
    );
    assert_eq!(
        aemm.count(AEMM_TOKEN_ISSUED),
        issued + 1,
        "one token for the poll's three GETs"
    );
    assert!(
        poll(&mut src).await.events.is_empty(),
        "the same notices again"
    );

    // The identity document and life cycle as AEMM serves them.
    let doc = reader.json(IDENTITY).await;
    let (status, lifecycle) = reader.get(LIFECYCLE, false).await;
    assert_eq!(status, 200);
    let id = src.identity().await.unwrap();
    assert_eq!(id.cloud, Some(Cloud::Aws));
    assert_eq!(id.instance_id, doc["instanceId"].as_str().unwrap());
    assert_eq!(id.region.as_deref(), doc["region"].as_str());
    assert_eq!(id.zone.as_deref(), doc["availabilityZone"].as_str());
    assert_eq!(id.instance_type.as_deref(), doc["instanceType"].as_str());
    assert_eq!(
        id.preemptible,
        Some(lifecycle.trim() == "spot"),
        "{lifecycle}"
    );

    // A 1 s token is renewed before AEMM would refuse it (AEMM: expired once whole seconds
    // since issue ≥ TTL; the source renews with a tenth of the TTL left): a new token for the
    // poll after 1.1 s, and AEMM never sees an expired one.
    let mut cfg = config(dir);
    cfg.aws.token_ttl = Duration::from_secs(1);
    let mut short = build(Cloud::Aws, &cfg).unwrap();
    assert_eq!(poll(&mut short).await.events.len(), 2);
    let issued = aemm.count(AEMM_TOKEN_ISSUED);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(poll(&mut short).await.events.is_empty());
    assert!(aemm.count(AEMM_TOKEN_ISSUED) > issued, "renewed");
    assert_eq!(aemm.count(AEMM_TOKEN_EXPIRED), 0, "{}", aemm.log_text());

    // A restarted AEMM knows none of the source's tokens: the first GET gets 401, the source
    // renews its token and retries; the notices are the same, so nothing new and no error.
    let mut cfg = config(dir);
    cfg.aws.token_ttl = Duration::from_secs(3600);
    let mut src = build(Cloud::Aws, &cfg).unwrap();
    assert_eq!(poll(&mut src).await.events.len(), 2);
    drop(aemm);
    let aemm = Aemm::start(dir, "spot-fixed-restarted", &args).await;
    assert!(poll(&mut src).await.events.is_empty());
    assert_eq!(aemm.count(AEMM_TOKEN_UNKNOWN), 1, "{}", aemm.log_text());
    assert_eq!(aemm.count(AEMM_TOKEN_ISSUED), 1, "{}", aemm.log_text());
}

/// `spot` with AEMM's defaults: `time` is each request's time + 2 min and `noticeTime` each
/// request's time, so they move every second. The source yields each notice once: a moving time
/// is not a new notice (nor the withdrawal of the previous one).
async fn spot_with_moving_times(dir: &Path, reader: &Reader) {
    let _aemm = Aemm::start(dir, "spot-defaults", &["spot"]).await;
    let mut src = build(Cloud::Aws, &config(dir)).unwrap();
    let before = rfc3339(reader.json(SPOT).await["time"].as_str().unwrap());
    let out = poll(&mut src).await;
    let after = rfc3339(reader.json(SPOT).await["time"].as_str().unwrap());
    assert_eq!(out.events.len(), 2, "{:#?}", out.events);
    let pre = only(&out.events, "aws/spot");
    assert_eq!(pre.kind, EventKind::Preemption);
    let deadline = pre.deadline.unwrap();
    assert!(
        before <= deadline && deadline <= after,
        "{before} ≤ {deadline} ≤ {after}"
    );
    assert_eq!(
        pre.detail.get("action").map(String::as_str),
        Some("terminate")
    );
    assert_eq!(
        only(&out.events, "aws/rebalance").kind,
        EventKind::Rebalance
    );
    // Until AEMM serves another time (the next whole second)…
    wait::until(
        Duration::from_secs(5),
        "AEMM's spot time to move",
        || async {
            let now = rfc3339(reader.json(SPOT).await["time"].as_str().unwrap());
            (now > deadline).then_some(()).ok_or(now)
        },
    )
    .await;
    // … then the same notices: nothing new, no cancellation.
    let again = poll(&mut src).await;
    assert!(again.events.is_empty(), "{:#?}", again.events);
}

/// `spot -d 3`: AEMM answers 404 for the notice until 3 s after its start (the rebalance
/// recommendation, with no delay of its own, at once). The source yields nothing for the 404, no
/// error, then the notice once AEMM serves it, once.
async fn spot_after_a_delay(dir: &Path, reader: &Reader) {
    let _aemm = Aemm::start(dir, "spot-delay", &["spot", "-d", "3"]).await;
    let mut src = build(Cloud::Aws, &config(dir)).unwrap();
    let first = poll(&mut src).await;
    assert_eq!(
        reader.get(SPOT, false).await.0,
        404,
        "AEMM still delays the notice after the first poll (3 s after its start)"
    );
    let kinds: Vec<_> = first.events.iter().map(|e| e.kind.clone()).collect();
    assert_eq!(kinds, [EventKind::Rebalance], "{:#?}", first.events);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut later = Vec::new();
    while !later
        .iter()
        .any(|e: &NodeEvent| e.kind == EventKind::Preemption)
    {
        assert!(
            Instant::now() < deadline,
            "no notice 10 s after AEMM's 3 s delay"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        later.extend(poll(&mut src).await.events);
    }
    let kinds: Vec<_> = later.iter().map(|e| e.kind.clone()).collect();
    assert_eq!(kinds, [EventKind::Preemption], "{later:#?}");
    assert_eq!(reader.get(SPOT, false).await.0, 200);
}

/// `events -o CODE -t STATE -b B -a A -l L`: one scheduled event. An active one yields its kind,
/// EventId, NotBefore and NotAfter exactly as served; a canceled or completed one yields nothing.
async fn scheduled_events(dir: &Path, reader: &Reader) {
    let b = "2027-03-05T06:07:08Z";
    let a = "2027-03-12T06:07:08Z";
    let l = "2027-03-14T06:07:08Z";
    let cases = [
        ("system-maintenance", "active", Some(EventKind::Maintenance)),
        ("instance-stop", "active", Some(EventKind::Termination)),
        ("system-reboot", "active", Some(EventKind::Reboot)),
        ("instance-retirement", "canceled", None),
        ("instance-reboot", "completed", None),
    ];
    for (code, state, kind) in cases {
        let name = format!("events-{code}-{state}");
        let _aemm = Aemm::start(
            dir,
            &name,
            &["events", "-o", code, "-t", state, "-b", b, "-a", a, "-l", l],
        )
        .await;
        let served = reader.json(SCHEDULED).await;
        let ev = &served.as_array().unwrap_or_else(|| panic!("{served}"))[0];
        assert_eq!(ev["Code"], code, "{served}");
        assert_eq!(ev["State"], state, "{served}");
        // AEMM's layout: the day of the month not padded ("5 Mar 2027 …").
        assert_eq!(ev["NotBefore"], go_event_layout(rfc3339(b)), "{served}");
        assert_eq!(ev["NotAfter"], go_event_layout(rfc3339(a)), "{served}");
        assert_eq!(
            ev["NotBeforeDeadline"],
            go_event_layout(rfc3339(l)),
            "{served}"
        );
        assert_eq!(reader.get(SPOT, false).await.0, 404, "events mode: no spot");
        assert_eq!(reader.get(REBALANCE, false).await.0, 404);

        let mut src = build(Cloud::Aws, &config(dir)).unwrap();
        let out = poll(&mut src).await;
        let Some(kind) = kind else {
            assert!(out.events.is_empty(), "{name}: {:#?}", out.events);
            continue;
        };
        assert_eq!(out.events.len(), 1, "{name}: {:#?}", out.events);
        let e = only(&out.events, "aws/scheduled");
        assert_eq!(e.kind, kind, "{name}");
        assert_eq!(
            e.detail.get("event_id").map(String::as_str),
            ev["EventId"].as_str()
        );
        assert_eq!(e.detail.get("code").map(String::as_str), Some(code));
        assert_eq!(e.not_before, Some(rfc3339(b)), "{name}");
        assert_eq!(e.deadline, Some(rfc3339(a)), "{name}");
        assert!(poll(&mut src).await.events.is_empty(), "{name}: once");
    }
}

/// `cloud = "auto"` with no DMI: the concurrent probes find AWS at AEMM (token PUT), and one
/// poll reads its identity and notices (AEMM with no subcommand serves them all at once).
async fn detection(dir: &Path) {
    let _aemm = Aemm::start(dir, "all", &[]).await;
    let cfg = SourcesConfig {
        cloud: CloudChoice::Auto,
        host_root: dir.to_path_buf(),
        ..Default::default()
    };
    let report = poll_once(&cfg).await;
    assert_eq!(report.cloud, Some(Cloud::Aws), "{:?}", report.errors);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.identity.is_some());
    let kinds: Vec<_> = report.events.iter().map(|e| e.kind.name()).collect();
    for k in ["preemption", "rebalance", "reboot"] {
        assert!(kinds.contains(&k), "{k} in {kinds:?}");
    }
}
