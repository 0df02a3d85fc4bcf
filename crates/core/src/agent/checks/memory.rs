//! Memory check: `MemAvailable` from `<host_root>/proc/meminfo` against a byte and a percentage
//! threshold. Reasons: `MemoryAvailableLow` (True), `MemoryAvailableOk` (False);
//! `CheckFailed` (Unknown, from the runner) when the file cannot be read or parsed.

use std::path::PathBuf;

use super::config::MemoryConfig;
use super::{
    human_bytes, read_host_file, CheckError, CheckFuture, CheckResult, ConditionStatus,
    HealthCheck, HostRoot,
};

/// The figures the check uses, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`.
    pub available: u64,
}

/// Parses `/proc/meminfo` text. `MemTotal` and `MemAvailable` are required (kB units).
pub fn parse_meminfo(text: &str) -> Result<MemInfo, String> {
    let mut total = None;
    let mut available = None;
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let slot = match key.trim() {
            "MemTotal" => &mut total,
            "MemAvailable" => &mut available,
            _ => continue,
        };
        *slot = Some(parse_kb(key.trim(), rest)?);
    }
    let total = total.ok_or("no MemTotal line")?;
    let available = available.ok_or("no MemAvailable line (kernel older than 3.14?)")?;
    if total == 0 {
        return Err("MemTotal is 0".to_string());
    }
    Ok(MemInfo { total, available })
}

fn parse_kb(key: &str, rest: &str) -> Result<u64, String> {
    let mut parts = rest.split_whitespace();
    let value = parts.next().ok_or_else(|| format!("{key}: no value"))?;
    let kb: u64 = value
        .parse()
        .map_err(|_| format!("{key}: `{value}` is not a number"))?;
    match parts.next() {
        Some("kB") => kb
            .checked_mul(1024)
            .ok_or_else(|| format!("{key}: {kb} kB overflows")),
        Some(unit) => Err(format!("{key}: unexpected unit `{unit}`")),
        None => Err(format!("{key}: missing unit kB")),
    }
}

/// The memory check.
#[derive(Debug, Clone)]
pub struct MemoryCheck {
    config: MemoryConfig,
    meminfo: PathBuf,
}

impl MemoryCheck {
    /// A check reading `<host_root>/proc/meminfo`.
    pub fn new(config: MemoryConfig, host: &HostRoot) -> Self {
        Self {
            config,
            meminfo: host.join("/proc/meminfo"),
        }
    }

    /// The condition for figures `m` (pure).
    pub fn evaluate(&self, m: MemInfo) -> CheckResult {
        let c = &self.config;
        let percent = m.available as f64 * 100.0 / m.total as f64;
        let figures = format!(
            "MemAvailable {} of {} ({percent:.1}%); thresholds: {} and {}%",
            human_bytes(m.available),
            human_bytes(m.total),
            human_bytes(c.min_available_bytes.0),
            c.min_available_percent
        );
        let low_bytes = c.min_available_bytes.0 > 0 && m.available < c.min_available_bytes.0;
        let low_percent = c.min_available_percent > 0.0 && percent < c.min_available_percent;
        let (status, reason) = if low_bytes || low_percent {
            (ConditionStatus::True, "MemoryAvailableLow")
        } else {
            (ConditionStatus::False, "MemoryAvailableOk")
        };
        CheckResult::new(&c.condition_type, status, reason, figures)
    }

    fn read(&self) -> Result<MemInfo, CheckError> {
        let text = read_host_file(&self.meminfo)?;
        parse_meminfo(&text).map_err(|message| CheckError::Parse {
            path: self.meminfo.clone(),
            message,
        })
    }
}

impl HealthCheck for MemoryCheck {
    fn name(&self) -> &str {
        "memory"
    }

    fn condition_types(&self) -> Vec<String> {
        vec![self.config.condition_type.clone()]
    }

    fn check(&mut self) -> CheckFuture<'_> {
        Box::pin(async move { Ok(vec![self.evaluate(self.read()?)].into()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::checks::config::ByteSize;

    const REAL: &str = "MemTotal:       16314424 kB\nMemFree:          507644 kB\nMemAvailable:    9876543 kB\nBuffers:          123 kB\nHugePages_Total:       0\n";

    #[test]
    fn parses_real_format() {
        let m = parse_meminfo(REAL).expect("valid");
        assert_eq!(
            m,
            MemInfo {
                total: 16314424 * 1024,
                available: 9876543 * 1024
            }
        );
    }

    #[test]
    fn malformed_is_an_error() {
        assert!(parse_meminfo("").is_err());
        assert!(parse_meminfo("MemTotal: 10 kB\n")
            .expect_err("invalid")
            .contains("MemAvailable"));
        assert!(parse_meminfo("MemTotal: x kB\nMemAvailable: 1 kB")
            .expect_err("invalid")
            .contains("not a number"));
        assert!(parse_meminfo("MemTotal: 10 MB\nMemAvailable: 1 kB")
            .expect_err("invalid")
            .contains("unit"));
        assert!(parse_meminfo("MemTotal: 0 kB\nMemAvailable: 0 kB").is_err());
        assert!(parse_meminfo("MemTotal: 99999999999999999999 kB\nMemAvailable: 1 kB").is_err());
        assert!(
            parse_meminfo("MemTotal: 18446744073709551615 kB\nMemAvailable: 1 kB")
                .expect_err("invalid")
                .contains("overflows")
        );
    }

    fn check(bytes: u64, percent: f64) -> MemoryCheck {
        let cfg = MemoryConfig {
            min_available_bytes: ByteSize(bytes),
            min_available_percent: percent,
            ..Default::default()
        };
        MemoryCheck::new(cfg, &HostRoot::default())
    }

    #[test]
    fn thresholds_both_ways() {
        let gib = 1u64 << 30;
        let m = MemInfo {
            total: 10 * gib,
            available: gib,
        };
        let cases = [
            (0, 0.0, ConditionStatus::False),
            (gib + 1, 0.0, ConditionStatus::True),
            (gib, 0.0, ConditionStatus::False),
            (0, 10.5, ConditionStatus::True),
            (0, 10.0, ConditionStatus::False),
            (gib / 2, 50.0, ConditionStatus::True),
        ];
        for (bytes, percent, want) in cases {
            let r = check(bytes, percent).evaluate(m);
            assert_eq!(r.status, want, "bytes {bytes} percent {percent}: {r:?}");
            assert_eq!(r.condition_type, "NodekeeperMemoryPressure");
            assert!(
                r.message
                    .contains("MemAvailable 1.0 GiB of 10.0 GiB (10.0%)"),
                "{}",
                r.message
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC*") {
            let _ = parse_meminfo(&s);
        }

        #[test]
        fn parser_never_panics_on_meminfo_like(lines in proptest::collection::vec("(MemTotal|MemAvailable|X)?:? *[0-9a-z ]{0,24}( kB)?", 0..6)) {
            let text = lines.join("\n");
            if let Ok(m) = parse_meminfo(&text) {
                proptest::prop_assert!(m.total > 0);
            }
        }
    }
}
