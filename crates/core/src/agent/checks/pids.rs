//! PID check: kernel scheduling entities in use (the denominator of field 4 of
//! `<host_root>/proc/loadavg`, which counts processes **and** threads, as the kubelet reads it)
//! against `min(kernel.pid_max, kernel.threads-max)`. Reasons: `PIDUsageHigh` (True),
//! `PIDUsageOk` (False).

use std::path::PathBuf;

use super::config::PidsConfig;
use super::{
    read_host_file, CheckError, CheckFuture, CheckResult, ConditionStatus, HealthCheck, HostRoot,
};

/// PID usage figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidUsage {
    /// Processes and threads that exist now.
    pub used: u64,
    /// `min(pid_max, threads-max)`.
    pub limit: u64,
}

/// Parses `/proc/loadavg` (`0.78 0.56 0.29 3/95 16044`): returns the total entity count (95).
pub fn parse_loadavg(text: &str) -> Result<u64, String> {
    let field = text
        .split_whitespace()
        .nth(3)
        .ok_or("fewer than 4 fields")?;
    let (_, total) = field
        .split_once('/')
        .ok_or_else(|| format!("field 4 `{field}` is not RUNNING/TOTAL"))?;
    total
        .parse()
        .map_err(|_| format!("`{total}` is not a number"))
}

/// Parses a single-number sysctl file such as `pid_max`.
pub fn parse_sysctl_number(text: &str) -> Result<u64, String> {
    let t = text.trim();
    match t.parse::<u64>() {
        Ok(0) => Err("value is 0".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{t}` is not a number")),
    }
}

/// The PID check.
#[derive(Debug, Clone)]
pub struct PidsCheck {
    config: PidsConfig,
    loadavg: PathBuf,
    pid_max: PathBuf,
    threads_max: PathBuf,
}

impl PidsCheck {
    /// A check reading under `host`.
    pub fn new(config: PidsConfig, host: &HostRoot) -> Self {
        Self {
            config,
            loadavg: host.join("/proc/loadavg"),
            pid_max: host.join("/proc/sys/kernel/pid_max"),
            threads_max: host.join("/proc/sys/kernel/threads-max"),
        }
    }

    /// The condition for `u` (pure).
    pub fn evaluate(&self, u: PidUsage) -> CheckResult {
        let percent = u.used as f64 * 100.0 / u.limit as f64;
        let message = format!(
            "{} of {} PIDs in use ({percent:.1}%); threshold {}%",
            u.used, u.limit, self.config.max_used_percent
        );
        let (status, reason) = if percent >= self.config.max_used_percent {
            (ConditionStatus::True, "PIDUsageHigh")
        } else {
            (ConditionStatus::False, "PIDUsageOk")
        };
        CheckResult::new(&self.config.condition_type, status, reason, message)
    }

    /// Reads the current usage from the host.
    pub fn read(&self) -> Result<PidUsage, CheckError> {
        let parse = |path: &PathBuf, f: fn(&str) -> Result<u64, String>| {
            let text = read_host_file(path)?;
            f(&text).map_err(|message| CheckError::Parse {
                path: path.clone(),
                message,
            })
        };
        let used = parse(&self.loadavg, parse_loadavg)?;
        let pid_max = parse(&self.pid_max, parse_sysctl_number)?;
        // threads-max is optional (absent in some sandboxes); pid_max alone still bounds PIDs.
        let limit = match parse(&self.threads_max, parse_sysctl_number) {
            Ok(t) => t.min(pid_max),
            Err(CheckError::Read { .. }) => pid_max,
            Err(e) => return Err(e),
        };
        Ok(PidUsage { used, limit })
    }
}

impl HealthCheck for PidsCheck {
    fn name(&self) -> &str {
        "pids"
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

    #[test]
    fn parses_loadavg_and_sysctls() {
        assert_eq!(parse_loadavg("0.78 0.56 0.29 3/95 16044\n"), Ok(95));
        assert!(parse_loadavg("0.78 0.56 0.29").is_err());
        assert!(parse_loadavg("0.78 0.56 0.29 95 1").is_err());
        assert!(parse_loadavg("0.78 0.56 0.29 3/x 1").is_err());
        assert_eq!(parse_sysctl_number("32768\n"), Ok(32768));
        assert!(parse_sysctl_number("0").is_err());
        assert!(parse_sysctl_number("-1").is_err());
    }

    #[test]
    fn threshold_both_ways() {
        let c = PidsCheck::new(
            PidsConfig {
                max_used_percent: 50.0,
                ..Default::default()
            },
            &HostRoot::default(),
        );
        let r = c.evaluate(PidUsage {
            used: 50,
            limit: 100,
        });
        assert_eq!(
            (r.status, r.reason.as_str()),
            (ConditionStatus::True, "PIDUsageHigh")
        );
        let r = c.evaluate(PidUsage {
            used: 49,
            limit: 100,
        });
        assert_eq!(
            (r.status, r.reason.as_str()),
            (ConditionStatus::False, "PIDUsageOk")
        );
        assert_eq!(r.message, "49 of 100 PIDs in use (49.0%); threshold 50%");
    }

    proptest::proptest! {
        #[test]
        fn loadavg_parser_never_panics(s in "\\PC*") {
            let _ = parse_loadavg(&s);
            let _ = parse_sysctl_number(&s);
        }
    }
}
