//! Fuzz bodies: one plain function per untrusted input format, shared by the `fuzz/` cargo-fuzz
//! crate (the long runs, `cargo +nightly fuzz run <target>`) and `tests/unit_like/fuzz_smoke.rs` (the
//! CI-sized run over the seed corpus plus seeded random mutations).
//!
//! Each function feeds the bytes through the same code production uses and returns how many of
//! the parsers accepted the input. Every rejection must be a typed error: a panic, an unbounded
//! error message or a broken invariant (checked here with `assert!`, which is the fuzzer's
//! oracle) is a finding.

use std::collections::BTreeMap;
use std::path::Path;

use crate::agent::sources::ParseError;
use crate::agent::sources::{aws as aws_src, azure as azure_src, gcp as gcp_src, oci as oci_src};
use crate::wire::EventKind;

/// A fuzz body.
pub type Target = fn(&[u8]) -> Outcome;

/// The fuzz targets, by the name used for `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("config_toml", config_toml),
    ("imds_aws", imds_aws),
    ("imds_azure", imds_azure),
    ("imds_gcp", imds_gcp),
    ("imds_oci", imds_oci),
    ("oci_event", oci_event),
    ("report_body", report_body),
    ("report_handler", report_handler),
    ("crio_state", crio_state),
];

/// How the parsers of one target judged one input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Parsers that accepted the input.
    pub accepted: u32,
    /// Parsers that rejected it with a typed error.
    pub rejected: u32,
}

impl Outcome {
    fn add<T, E>(&mut self, r: &Result<T, E>) {
        match r {
            Ok(_) => self.accepted += 1,
            Err(_) => self.rejected += 1,
        }
    }
}

/// The agent/controller TOML configuration (`Config::load_str`, diagnostics rendered, the
/// effective configuration printed). Non-UTF-8 input is read lossily, as a file would be after
/// the UTF-8 check of `read_to_string` fails earlier with a typed error.
pub fn config_toml(data: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(data);
    let env = crate::config::Env::default();
    let path = Path::new("fuzz.toml");
    let r = crate::config_file::Config::load_str(path, &text, &env);
    match &r {
        Ok(loaded) => {
            let _ = loaded.config.to_redacted_toml();
            for w in &loaded.warnings {
                check_location(&text, w.location);
                let _ = w.render(path);
            }
        }
        Err(e) => {
            if let crate::config::ConfigError::Invalid { diagnostics, .. } = e {
                assert!(!diagnostics.is_empty(), "an invalid config names a reason");
                for d in diagnostics {
                    check_location(&text, d.location);
                }
            }
            let _ = e.to_string();
        }
    }
    let mut o = Outcome::default();
    o.add(&r);
    o
}

/// A located diagnostic points inside the text (1-based line and column).
fn check_location(text: &str, loc: Option<(usize, usize)>) {
    if let Some((line, col)) = loc {
        let lines = text.split('\n').count();
        assert!(
            line >= 1 && line <= lines && col >= 1,
            "location {line}:{col} outside a {lines}-line text"
        );
    }
}

/// Every error text stays bounded, whatever the input size.
fn check_bounded(e: &ParseError) {
    let n = match e {
        ParseError::Value { value, .. } | ParseError::Time { value, .. } => value.chars().count(),
        ParseError::Json { message, .. } => message.chars().count() / 3,
        ParseError::Utf8 { .. } => 0,
    };
    assert!(n <= 81, "error text not truncated: {e}");
}

fn judge<T>(o: &mut Outcome, r: Result<T, ParseError>) -> Option<T> {
    o.add(&r);
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            check_bounded(&e);
            None
        }
    }
}

/// AWS IMDS: spot instance-action, rebalance recommendation, scheduled events, identity document.
pub fn imds_aws(data: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    judge(&mut o, aws_src::parse_spot_action(data));
    judge(&mut o, aws_src::parse_rebalance(data));
    judge(&mut o, aws_src::parse_scheduled(data));
    judge(&mut o, aws_src::parse_identity(data, Some(data)));
    judge(&mut o, aws_src::parse_identity(data, None));
    o
}

/// Azure IMDS: scheduled events (for one VM and for all) and the compute identity.
pub fn imds_azure(data: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    let mine = judge(&mut o, azure_src::parse_scheduled_events(data, Some("vm")));
    let all = judge(&mut o, azure_src::parse_scheduled_events(data, None));
    if let (Some((inc_a, mine)), Some((inc_b, all))) = (mine, all) {
        assert_eq!(
            inc_a, inc_b,
            "the incarnation does not depend on the VM filter"
        );
        assert!(mine.len() <= all.len(), "a VM filter never adds events");
    }
    judge(&mut o, azure_src::parse_identity(data));
    o
}

/// GCP metadata server: `preempted`, `maintenance-event` and the identity fields.
pub fn imds_gcp(data: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    judge(&mut o, gcp_src::parse_preempted(data));
    judge(&mut o, gcp_src::parse_maintenance_event(data));
    let mut fields: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for (i, k) in gcp_src::IDENTITY_KEYS.iter().enumerate() {
        // Split the input so each field gets a different slice of it.
        let from = data.len() * i / gcp_src::IDENTITY_KEYS.len();
        fields.insert(k, data[from..].to_vec());
    }
    judge(&mut o, gcp_src::parse_identity(&fields));
    o
}

/// OCI IMDS v2: the instance document and the preemption/maintenance signals.
pub fn imds_oci(data: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    judge(&mut o, oci_src::parse_identity(data));
    judge(&mut o, oci_src::parse_signal(data, &EventKind::Preemption));
    judge(&mut o, oci_src::parse_signal(data, &EventKind::Maintenance));
    o
}

/// An OCI Events envelope as the controller's endpoint receives it (JSON, then
/// [`crate::controller::api::oci_events::parse`]); ids are deterministic.
pub fn oci_event(data: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    let v: Result<serde_json::Value, _> = serde_json::from_slice(data);
    o.add(&v);
    let Ok(v) = v else { return o };
    let r = crate::controller::api::oci_events::parse(&v);
    o.add(&r);
    if let Ok(p) = &r {
        let again = crate::controller::api::oci_events::parse(&v);
        assert_eq!(
            again.as_ref().map(|a| &a.event.id),
            Ok(&p.event.id),
            "event ids are a function of the event"
        );
        assert!(p.instance.starts_with("ocid1.instance"));
        // 128 characters plus the ellipsis of a truncated value.
        assert!(p.event.detail.values().all(|d| d.chars().count() <= 129));
    }
    o
}

/// The body of `POST /v1/reports` ([`crate::wire::parse_body`], what the handler runs after
/// authentication); an accepted report survives a serialisation round trip.
pub fn report_body(data: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    let r = crate::wire::parse_body(data);
    o.add(&r);
    match r {
        Ok(report) => {
            let bytes = serde_json::to_vec(&report);
            assert!(bytes.is_ok(), "an accepted report serialises");
            if let Ok(bytes) = bytes {
                let back = crate::wire::parse_body(&bytes);
                assert!(back.is_ok(), "a serialised report parses: {back:?}");
            }
        }
        Err(e) => {
            assert!(e.to_string().chars().count() <= 600, "bounded error: {e}");
        }
    }
    o
}

/// The report API's decisions on a body from a caller holding a valid token for node `n0` (what
/// `POST /v1/reports` runs after authentication and before anything is written): the body
/// parsed, the node checked against the token's, `[controller.report_limits]` at their defaults,
/// then the notices through the dedup window twice. Invariants: a report within the limits
/// really is (counted independently), a refusal names a limit it really exceeds, errors are
/// bounded, and a resent batch is never new the second time. (The Node writes and Events need
/// the API server: `tests/sim/security_hostile.rs`.)
pub fn report_handler(data: &[u8]) -> Outcome {
    use crate::controller::state::limits::{self, Limit, ReportLimits, SeenEvents};
    const TOKEN_NODE: &str = "n0";
    let mut o = Outcome::default();
    let r = crate::wire::parse_body(data);
    o.add(&r);
    let Ok(report) = r else { return o };
    if report.node != TOKEN_NODE {
        // 403: another node's report; nothing else runs.
        o.rejected += 1;
        return o;
    }
    let l = ReportLimits::default();
    let prefix = crate::agent::checks::config::OWNED_PREFIX;
    let checked = limits::check(&report, &l, prefix);
    o.add(&checked);
    let types: std::collections::BTreeSet<&str> = report
        .conditions
        .iter()
        .map(|c| c.condition_type.as_str())
        .filter(|t| t.starts_with(prefix))
        .collect();
    let counts = [
        (Limit::Conditions, report.conditions.len(), l.max_conditions),
        (Limit::ConditionTypes, types.len(), l.max_condition_types),
        (
            Limit::CheckEvents,
            report.check_events.len(),
            l.max_check_events,
        ),
        (Limit::Events, report.events.len(), l.max_events),
    ];
    match &checked {
        Ok(()) => {
            for (limit, n, max) in counts {
                assert!(n <= max, "{} passed with {n} > {max}", limit.as_str());
            }
            assert!(report
                .conditions
                .iter()
                .all(|c| c.message.len() <= l.max_message_bytes
                    && c.reason.len() <= l.max_reason_bytes));
            assert!(report
                .events
                .iter()
                .all(|e| e.id.len() <= l.max_message_bytes));
        }
        Err(e) => {
            assert!(e.found > e.max, "{e}");
            if let Some((_, n, max)) = counts.iter().find(|(lim, _, _)| *lim == e.limit) {
                assert_eq!((e.found, e.max), (*n, *max), "{e}");
            }
            assert!(e.to_string().len() <= 200, "bounded error: {e}");
            return o;
        }
    }
    let now = tokio::time::Instant::now();
    let window = l.event_dedup_window;
    let mut seen = SeenEvents::default();
    let mut new = 0;
    for ev in &report.events {
        if !seen.seen(&ev.id, now, window) {
            seen.remember(&ev.id, now, window);
            new += 1;
        }
    }
    assert!(new <= report.events.len());
    assert!(
        report
            .events
            .iter()
            .all(|ev| seen.seen(&ev.id, now, window)),
        "a resent batch is not new again"
    );
    o
}

/// `crio-state.json` ([`crate::agent::crio::state::State::parse`], what `crio apply`, its dry
/// run and the rollback load first). Invariants: an accepted state names only drop-in file
/// names, each of which stays inside a directory it is joined to; a refused name is cut to 80
/// characters in the error.
pub fn crio_state(data: &[u8]) -> Outcome {
    use crate::agent::crio::state::{State, StateError};
    let mut o = Outcome::default();
    let dir = Path::new("/dropins");
    let r = State::parse(Path::new("/state/crio-state.json"), data);
    o.add(&r);
    match &r {
        Ok(state) => {
            let pending = state
                .pending
                .iter()
                .flat_map(|p| p.files.keys().chain(p.owned_before.keys()));
            for name in state.owned.keys().chain(pending) {
                assert!(crate::agent::crio::lint::valid_name(name), "{name:?}");
                let joined = dir.join(name);
                assert_eq!(joined.parent(), Some(dir), "{name:?} leaves the directory");
            }
        }
        Err(StateError::Name { name, .. }) => {
            assert!(name.chars().count() <= 80, "unbounded name in the error");
        }
        Err(_) => {}
    }
    o
}
