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

use crate::agent::sources::{aws as aws_src, azure as azure_src, gcp as gcp_src, oci as oci_src};
use crate::agent::sources::{EventKind, ParseError};

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
    let r = crate::config::Config::load_str(path, &text, &env);
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
/// [`crate::controller::oci_events::parse`]); ids are deterministic.
pub fn oci_event(data: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    let v: Result<serde_json::Value, _> = serde_json::from_slice(data);
    o.add(&v);
    let Ok(v) = v else { return o };
    let r = crate::controller::oci_events::parse(&v);
    o.add(&r);
    if let Ok(p) = &r {
        let again = crate::controller::oci_events::parse(&v);
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
