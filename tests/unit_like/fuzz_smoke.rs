//! CI-sized fuzzing: every target of `nodekeeper_core::fuzzing` over its seed corpus in
//! `fuzz/corpus/<target>/` plus thousands of inputs mutated from it by a seeded RNG (bit flips,
//! splices, dictionary tokens, deep nesting, long runs, truncation, random bytes).
//!
//! Any panic fails the test and the input is written to `target/fuzz-smoke-failures/` for
//! `cargo +nightly fuzz run <target> <file>`. The long run is the cargo-fuzz crate in `fuzz/`
//! (docs/dev/reliability.md). Knobs: `NODEKEEPER_FUZZ_ITERS` (per target, default 8000) and
//! `NODEKEEPER_FUZZ_SEED` (default fixed, so CI is reproducible).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use nodekeeper_core::fuzzing::{self, Outcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "null",
    "true",
    "false",
    "-0",
    "1e999",
    "-1",
    "18446744073709551616",
    "9223372036854775807",
    "0.1",
    "NaN",
    "\"\"",
    "\"version\":1",
    "\"version\":1.0",
    "\"node\":\"n1\"",
    "\"type\":\"cancelled\"",
    "\"time\":\"2017-09-18T08:22:00Z\"",
    "\"NotBefore\":\"Mon, 19 Sep 2016 18:29:47 GMT\"",
    "\"timeWindowStart\":\"+275760-09-13T00:00:00Z\"",
    "\"2262-04-12T00:00:00Z\"",
    "\"Events\":[",
    "\"additionalDetails\":{",
    "\"eventType\":\"com.oraclecloud.computeapi.instancemaintenance\"",
    "ocid1.instance.",
    "\u{feff}",
    "é",
    "\u{10ffff}",
    "\r\n",
    "TRUE",
    "terminate",
    "Preempt",
];

const TOML_TOKENS: &[&str] = &[
    "[",
    "]",
    "[[",
    "]]",
    "=",
    "\"",
    "'''",
    "\"\"\"",
    "\n",
    "#",
    "{",
    "}",
    ",",
    ".",
    "\\",
    "\\u0000",
    "é",
    "1979-05-27T07:32:00Z",
    "07:32:00",
    "inf",
    "nan",
    "-0",
    "0x7fffffffffffffff",
    "99999999999999999999",
    "1e309",
    "true",
    "\"1h\"",
    "\"0s\"",
    "\"18446744073709551615s\"",
    "[crio]",
    "[[crio.dropin]]",
    "[controller]",
    "[labels]",
    "[[labels.cleanup]]",
    "[sources]",
    "[checks]",
    "[policy]",
    "[report]",
    "[controller.oci_events]",
    "name = \"x.conf\"",
    "content = \"\"\"\n[crio.runtime]\n\"\"\"",
    "settings = {}",
    "cron = \"0 0 * * *\"",
    "time_zone = \"Europe/Berlin\"",
    "selector = \"a in (b\"",
    "label = \"\"",
];

fn iterations() -> usize {
    std::env::var("NODEKEEPER_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8000)
}

fn seed() -> u64 {
    std::env::var("NODEKEEPER_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6e6f_6465_6b65_6570)
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{target}: fewer than 3 seeds");
    files
}

fn range(rng: &mut StdRng, len: usize) -> (usize, usize) {
    if len == 0 {
        return (0, 0);
    }
    let a = rng.random_range(0..len);
    let b = rng.random_range(a..=len.min(a + 64));
    (a, b)
}

/// One mutation of `input`, drawing on `seeds` for splices and `dict` for tokens.
fn mutate(rng: &mut StdRng, input: &[u8], seeds: &[Vec<u8>], dict: &[&str]) -> Vec<u8> {
    let mut out = input.to_vec();
    let rounds = rng.random_range(1..=4);
    for _ in 0..rounds {
        let len = out.len();
        let at = if len == 0 {
            0
        } else {
            rng.random_range(0..=len)
        };
        match rng.random_range(0..10) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                out[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                out[i] = rng.random();
            }
            2 => {
                let n = rng.random_range(1..8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                out.splice(at..at, bytes);
            }
            3 => {
                let (a, b) = range(rng, len);
                out.drain(a..b);
            }
            4 => {
                let (a, b) = range(rng, len);
                let chunk = out[a..b].to_vec();
                out.splice(at..at, chunk);
            }
            5 => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                let (a, b) = range(rng, other.len());
                out.splice(at..at, other[a..b].iter().copied());
            }
            6 | 7 => {
                let t = dict[rng.random_range(0..dict.len())];
                out.splice(at..at, t.bytes());
            }
            8 => {
                // Deep nesting or a long run: parser recursion and error-text bounds.
                let (open, close) = match rng.random_range(0..4) {
                    0 => ("[", "]"),
                    1 => ("{\"a\":", "}"),
                    2 => ("a = [", "]"),
                    _ => ("x", ""),
                };
                let depth = rng.random_range(1..3000);
                let mut s = open.repeat(depth);
                if rng.random_bool(0.5) {
                    s.push_str(&close.repeat(depth));
                }
                out.splice(at..at, s.bytes());
            }
            _ => out.truncate(at),
        }
        out.truncate(256 * 1024);
    }
    out
}

fn save_failure(target: &str, input: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-smoke-failures");
    std::fs::create_dir_all(&dir).unwrap();
    use sha2::Digest;
    let name = hex::encode(&sha2::Sha256::digest(input)[..8]);
    let p = dir.join(format!("{target}-{name}"));
    std::fs::write(&p, input).unwrap();
    p
}

thread_local! {
    /// Set while a fuzz loop runs on this thread: expected panics are counted, not printed.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Installs (once) a panic hook that stays silent on threads running a fuzz loop.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                default(info);
            }
        }));
    });
}

fn run(f: fn(&[u8]) -> Outcome, input: &[u8]) -> Result<Outcome, String> {
    catch_unwind(AssertUnwindSafe(|| f(input))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into())
    })
}

/// Seeds, then mutations; returns (inputs, accepted by some parser, rejected by every parser).
fn smoke(target: &str, dict: &[&str]) -> (usize, usize, usize) {
    let f = fuzzing::TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .map(|(_, f)| *f)
        .unwrap();
    let files = corpus(target);
    let seeds: Vec<Vec<u8>> = files.iter().map(|(_, b)| b.clone()).collect();
    let mut rng =
        StdRng::seed_from_u64(seed() ^ target.len() as u64 ^ u64::from(target.as_bytes()[0]));
    let mut failures = Vec::new();
    let (mut total, mut accepted, mut rejected) = (0, 0, 0);
    let mut tally = |o: Outcome| {
        total += 1;
        if o.accepted > 0 {
            accepted += 1;
        }
        if o.accepted == 0 {
            rejected += 1;
        }
    };
    for (p, b) in &files {
        match run(f, b) {
            Ok(o) => tally(o),
            Err(e) => failures.push(format!("seed {}: {e}", p.display())),
        }
    }
    quiet_panics();
    QUIET.with(|q| q.set(true));
    for i in 0..iterations() {
        let input = if i % 10 == 9 {
            let n = rng.random_range(0..512);
            (0..n).map(|_| rng.random()).collect()
        } else {
            let base = &seeds[rng.random_range(0..seeds.len())];
            mutate(&mut rng, base, &seeds, dict)
        };
        match run(f, &input) {
            Ok(o) => tally(o),
            Err(e) => {
                let p = save_failure(target, &input);
                failures.push(format!("{}: {e}", p.display()));
            }
        }
    }
    QUIET.with(|q| q.set(false));
    eprintln!("{target}: {total} inputs, {accepted} accepted by some parser, {rejected} rejected by every parser, {} panics", failures.len());
    assert!(
        failures.is_empty(),
        "{target}: {} panics:\n{}",
        failures.len(),
        failures.join("\n")
    );
    (total, accepted, rejected)
}

/// Every seed named `valid`-ish is accepted by the parsers it targets (the corpus reaches deep code).
fn seed_accepted(target: &str, file: &str) -> Outcome {
    let f = fuzzing::TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .unwrap()
        .1;
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
        .join(file);
    f(&std::fs::read(&p).unwrap())
}

#[test]
fn config_toml() {
    for f in ["agent.toml", "controller.toml"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus/config_toml")
            .join(f);
        let text = std::fs::read_to_string(&p).unwrap();
        let env = nodekeeper_core::config::Env::default();
        if let Err(e) = nodekeeper_core::config_file::Config::load_str(&p, &text, &env) {
            panic!("seed {f} must be a valid config: {e}");
        }
        assert_eq!(seed_accepted("config_toml", f).accepted, 1);
    }
    assert_eq!(seed_accepted("config_toml", "bad.toml").rejected, 1);
    let (total, accepted, rejected) = smoke("config_toml", TOML_TOKENS);
    assert!(
        accepted > 0 && rejected > total / 10,
        "{accepted} {rejected}"
    );
}

#[test]
fn imds_aws() {
    assert!(seed_accepted("imds_aws", "spot.json").accepted >= 1);
    assert!(seed_accepted("imds_aws", "identity.json").accepted >= 1);
    let (_, _, rejected) = smoke("imds_aws", JSON_TOKENS);
    assert!(rejected > 0);
}

#[test]
fn imds_azure() {
    assert_eq!(seed_accepted("imds_azure", "events.json").accepted, 2);
    let (_, _, rejected) = smoke("imds_azure", JSON_TOKENS);
    assert!(rejected > 0);
}

#[test]
fn imds_gcp() {
    assert!(seed_accepted("imds_gcp", "preempted.txt").accepted >= 1);
    assert!(seed_accepted("imds_gcp", "maintenance.txt").accepted >= 1);
    let (_, _, rejected) = smoke("imds_gcp", JSON_TOKENS);
    assert!(rejected > 0);
}

#[test]
fn imds_oci() {
    assert!(seed_accepted("imds_oci", "instance.json").accepted >= 1);
    assert_eq!(seed_accepted("imds_oci", "preempt.json").accepted, 2);
    let (_, _, rejected) = smoke("imds_oci", JSON_TOKENS);
    assert!(rejected > 0);
}

#[test]
fn oci_event() {
    for f in [
        "preemption.json",
        "maintenance_SCHEDULED.json",
        "maintenance_CANCELED.json",
    ] {
        assert_eq!(seed_accepted("oci_event", f).accepted, 2, "{f}");
    }
    let (_, _, rejected) = smoke("oci_event", JSON_TOKENS);
    assert!(rejected > 0);
}

#[test]
fn report_body() {
    assert_eq!(seed_accepted("report_body", "full.json").accepted, 1);
    assert_eq!(seed_accepted("report_body", "minimal.json").accepted, 1);
    assert_eq!(seed_accepted("report_body", "full_v2.json").accepted, 1);
    assert_eq!(seed_accepted("report_body", "version3.json").rejected, 1);
    let (total, accepted, rejected) = smoke("report_body", JSON_TOKENS);
    assert!(
        accepted > 0 && rejected > total / 10,
        "{accepted} {rejected}"
    );
}

#[test]
fn report_handler() {
    for f in ["full.json", "minimal.json", "events.json"] {
        // parsed, and within the limits
        assert_eq!(seed_accepted("report_handler", f).accepted, 2, "{f}");
    }
    assert_eq!(
        seed_accepted("report_handler", "over_limit.json"),
        Outcome {
            accepted: 1,
            rejected: 1
        },
        "parsed, then over max_conditions"
    );
    assert_eq!(
        seed_accepted("report_handler", "other_node.json").rejected,
        1
    );
    let (total, accepted, rejected) = smoke("report_handler", JSON_TOKENS);
    assert!(
        accepted > 0 && rejected > total / 10,
        "{accepted} {rejected}"
    );
}

#[test]
fn crio_state() {
    for f in ["owned.json", "pending.json"] {
        assert_eq!(seed_accepted("crio_state", f).accepted, 1, "{f}");
    }
    for f in ["traversal.json", "version2.json"] {
        assert_eq!(seed_accepted("crio_state", f).rejected, 1, "{f}");
    }
    let (_, accepted, rejected) = smoke("crio_state", JSON_TOKENS);
    assert!(accepted > 0 && rejected > 0, "{accepted} {rejected}");
}

/// Regression inputs found by fuzzing (each was a panic or an unbounded error before its fix).
#[test]
fn regressions() {
    // serde quotes an unknown enum variant in full: the 400 body must not echo megabytes back.
    let big = format!(
        "{{\"version\":1,\"node\":\"n\",\"agent_version\":\"t\",\"agent_instance\":\"i\",\"sequence\":1,\
         \"boot_id\":\"b\",\"generated_at\":\"2026-01-01T00:00:00Z\",\"crio\":{{\"config_hash\":\"h\",\
         \"result\":\"{}\",\"unit_state\":\"u\",\"at\":\"2026-01-01T00:00:00Z\"}}}}",
        "x".repeat(100_000)
    );
    let e = nodekeeper_core::wire::parse_body(big.as_bytes()).unwrap_err();
    assert!(
        matches!(e, nodekeeper_core::wire::BodyError::Schema(_)),
        "{e}"
    );
    assert!(e.to_string().len() < 400, "{} bytes", e.to_string().len());
    let v = format!("{{\"version\":\"{}\"}}", "9".repeat(10_000));
    let e = nodekeeper_core::wire::parse_body(v.as_bytes()).unwrap_err();
    assert!(matches!(e, nodekeeper_core::wire::BodyError::Version(_)));
    assert!(e.to_string().len() < 200);
}
