//! The runner: builds the enabled checks from `[checks]`, runs them all once per tick, applies
//! each check's flap guard, and turns a failed check into `Unknown` conditions (`CheckFailed`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::ser::SerializeStruct;

use super::config::ChecksConfig;
use super::debounce::{Debounce, FlapConfig};
use super::disk::DiskCheck;
use super::kmsg::KmsgCheck;
use super::memory::MemoryCheck;
use super::pids::PidsCheck;
use super::runtime::RuntimeCheck;
use super::systemd_unit::SystemdUnitCheck;
use super::{CheckError, CheckEvent, CheckResult, ConditionStatus, HealthCheck, HostRoot};
use crate::agent::host::systemd::UnitManager;

/// The reason of a condition whose check failed or timed out this round.
pub const CHECK_FAILED: &str = "CheckFailed";

/// A check that failed (its conditions are `Unknown`) or reported a non-fatal problem.
#[derive(Debug)]
pub struct CheckFailure {
    /// The check's name, e.g. `memory`.
    pub check: String,
    /// What went wrong.
    pub error: CheckError,
}

impl serde::Serialize for CheckFailure {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("CheckFailure", 2)?;
        st.serialize_field("check", &self.check)?;
        st.serialize_field("message", &self.error.to_string())?;
        st.end()
    }
}

/// What one round of all checks produced.
#[derive(Debug, Default, serde::Serialize)]
pub struct Round {
    /// Debounced conditions, one per condition type of every enabled check.
    pub conditions: Vec<CheckResult>,
    /// Temporary events (not debounced).
    pub events: Vec<CheckEvent>,
    /// Failed checks and non-fatal problems, for the logs and the report.
    pub failures: Vec<CheckFailure>,
}

struct Entry {
    check: Box<dyn HealthCheck>,
    debounce: Debounce,
    /// The error of the previous round, to log a persisting failure once.
    last_error: Option<String>,
}

/// All enabled checks with their flap guards.
pub struct Checks {
    entries: Vec<Entry>,
    timeout: Duration,
}

impl std::fmt::Debug for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|e| e.check.name()).collect();
        f.debug_struct("Checks")
            .field("checks", &names)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Checks {
    /// The enabled checks of a validated `[checks]` section; the systemd check connects to the
    /// system bus on its first run.
    pub fn from_config(cfg: &ChecksConfig) -> Self {
        let mut checks = Self::without_systemd(cfg);
        if cfg.systemd.enabled {
            checks.push(
                Box::new(SystemdUnitCheck::connecting(cfg.systemd.clone())),
                cfg.systemd.flap,
            );
        }
        checks
    }

    /// As [`Checks::from_config`], with the systemd check using `manager` (a connection shared
    /// with the CRI-O apply engine, or a fake).
    pub fn from_config_with<M: UnitManager + Send + Sync + 'static>(
        cfg: &ChecksConfig,
        manager: Arc<M>,
    ) -> Self {
        let mut checks = Self::without_systemd(cfg);
        if cfg.systemd.enabled {
            checks.push(
                Box::new(SystemdUnitCheck::new(cfg.systemd.clone(), manager)),
                cfg.systemd.flap,
            );
        }
        checks
    }

    fn without_systemd(cfg: &ChecksConfig) -> Self {
        let host = HostRoot::new(&cfg.host_root);
        let mut checks: Vec<(Box<dyn HealthCheck>, FlapConfig)> = Vec::new();
        if cfg.memory.enabled {
            checks.push((
                Box::new(MemoryCheck::new(cfg.memory.clone(), &host)),
                cfg.memory.flap,
            ));
        }
        if cfg.disk.enabled {
            checks.push((
                Box::new(DiskCheck::new(cfg.disk.clone(), &host)),
                cfg.disk.flap,
            ));
        }
        if cfg.pids.enabled {
            checks.push((
                Box::new(PidsCheck::new(cfg.pids.clone(), &host)),
                cfg.pids.flap,
            ));
        }
        if cfg.kmsg.enabled {
            checks.push((Box::new(KmsgCheck::new(cfg.kmsg.clone())), cfg.kmsg.flap));
        }
        if cfg.runtime.enabled {
            checks.push((
                Box::new(RuntimeCheck::new(cfg.runtime.clone(), &host)),
                cfg.runtime.flap,
            ));
        }
        Self::new(checks, cfg.check_timeout)
    }

    /// Arbitrary checks (tests, or checks built elsewhere), each with its flap guard.
    pub fn new(checks: Vec<(Box<dyn HealthCheck>, FlapConfig)>, timeout: Duration) -> Self {
        let entries = checks
            .into_iter()
            .map(|(check, flap)| Entry::new(check, flap))
            .collect();
        Self { entries, timeout }
    }

    /// Adds one check.
    pub fn push(&mut self, check: Box<dyn HealthCheck>, flap: FlapConfig) {
        self.entries.push(Entry::new(check, flap));
    }

    /// Names of the checks, in run order.
    pub fn names(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|e| e.check.name().to_string())
            .collect()
    }

    /// The condition types the checks write, in run order (docs/checks.md, docs/catalog.md).
    pub fn condition_types(&self) -> Vec<String> {
        self.entries
            .iter()
            .flat_map(|e| e.check.condition_types())
            .collect()
    }

    /// Runs every check once; `now` drives the flap guards.
    pub async fn run_once(&mut self, now: Instant) -> Round {
        let mut round = Round::default();
        for entry in &mut self.entries {
            let raw = entry.run(self.timeout, &mut round).await;
            round
                .conditions
                .extend(raw.into_iter().map(|r| entry.debounce.observe(r, now)));
        }
        round
    }
}

impl Entry {
    fn new(check: Box<dyn HealthCheck>, flap: FlapConfig) -> Self {
        Self {
            check,
            debounce: Debounce::new(flap),
            last_error: None,
        }
    }

    /// Runs the check; events and failures go into `round`, raw conditions are returned.
    async fn run(&mut self, timeout: Duration, round: &mut Round) -> Vec<CheckResult> {
        let name = self.check.name().to_string();
        let result = match tokio::time::timeout(timeout, self.check.check()).await {
            Ok(r) => r,
            Err(_) => Err(CheckError::Timeout {
                check: name.clone(),
                timeout,
            }),
        };
        match result {
            Ok(out) => {
                if self.last_error.take().is_some() {
                    tracing::info!(check = %name, "health check recovered");
                }
                round.events.extend(out.events);
                for error in out.problems {
                    tracing::warn!(check = %name, %error, "health check problem");
                    round.failures.push(CheckFailure {
                        check: name.clone(),
                        error,
                    });
                }
                out.conditions
            }
            Err(error) => {
                let text = error.to_string();
                // Log a failure when it starts or changes, not on every round it persists.
                if self.last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(check = %name, error = %text, "health check failed");
                } else {
                    tracing::debug!(check = %name, error = %text, "health check still failing");
                }
                let msg = format!("check {name} failed: {text}");
                self.last_error = Some(text);
                round.failures.push(CheckFailure { check: name, error });
                unknown_all(self.check.as_ref(), &msg)
            }
        }
    }
}

fn unknown_all(check: &dyn HealthCheck, message: &str) -> Vec<CheckResult> {
    check
        .condition_types()
        .into_iter()
        .map(|t| CheckResult::new(t, ConditionStatus::Unknown, CHECK_FAILED, message))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// The agent loop may run a round inside a spawned task.
    #[test]
    fn checks_and_their_round_future_are_send() {
        let mut checks = Checks::from_config(&ChecksConfig::default());
        assert_send(&checks.run_once(Instant::now()));
        assert_send(&checks);
    }

    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    use super::super::CheckFuture;
    use ConditionStatus::{False, True};

    /// A check whose raw status the test sets; it answers after `delay` (`None`: never) and
    /// counts its runs.
    struct Fake {
        status: Arc<Mutex<ConditionStatus>>,
        delay: Option<Duration>,
        runs: Arc<AtomicU32>,
    }

    impl HealthCheck for Fake {
        fn name(&self) -> &str {
            "fake"
        }
        fn condition_types(&self) -> Vec<String> {
            vec!["Fake".into()]
        }
        fn check(&mut self) -> CheckFuture<'_> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            let (status, delay) = (*self.status.lock().unwrap(), self.delay);
            Box::pin(async move {
                match delay {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
                Ok(vec![CheckResult::new("Fake", status, "R", "")].into())
            })
        }
    }

    fn fake(
        flap: FlapConfig,
        delay: Option<Duration>,
        timeout: Duration,
    ) -> (Checks, Arc<Mutex<ConditionStatus>>, Arc<AtomicU32>) {
        let status = Arc::new(Mutex::new(False));
        let runs = Arc::new(AtomicU32::new(0));
        let check = Fake {
            status: status.clone(),
            delay,
            runs: runs.clone(),
        };
        let checks = Checks::new(vec![(Box::new(check), flap)], timeout);
        (checks, status, runs)
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// The agent's loop: a check round every `interval` tick, the flap guard fed tokio's clock.
    /// `raw(t)` is the raw status at tick second `t`; returns the reported status per tick.
    async fn ticks(
        flap: FlapConfig,
        interval: Duration,
        n: usize,
        raw: impl Fn(u64) -> ConditionStatus,
    ) -> Vec<(u64, ConditionStatus)> {
        let (mut checks, status, runs) = fake(flap, Some(Duration::ZERO), S(5));
        let t0 = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(interval);
        let mut out = Vec::new();
        for _ in 0..n {
            tick.tick().await;
            let t = t0.elapsed().as_secs();
            *status.lock().unwrap() = raw(t);
            let round = checks
                .run_once(tokio::time::Instant::now().into_std())
                .await;
            out.push((t, round.conditions[0].status));
        }
        assert_eq!(runs.load(Ordering::SeqCst), n as u32, "one run per tick");
        out
    }

    /// count 2, for 30 s, a round every 10 s: a failure starting at 10 s is first seen then
    /// and reported at the tick where it has lasted 30 s (40 s), not one tick earlier.
    #[tokio::test(start_paused = true)]
    async fn the_flap_guard_reports_a_change_after_its_duration_on_the_tick_clock() {
        let p = FlapConfig::new(2, S(30));
        let got = ticks(p, S(10), 6, |t| if t >= 10 { True } else { False }).await;
        assert_eq!(
            got,
            [
                (0, False),
                (10, False),
                (20, False),
                (30, False),
                (40, True),
                (50, True)
            ]
        );
    }

    /// A one-round blip back at 30 s restarts the 30 s: reported at 70 s, not 40 s.
    #[tokio::test(start_paused = true)]
    async fn a_blip_restarts_the_flap_guards_duration() {
        let p = FlapConfig::new(1, S(30));
        let got = ticks(
            p,
            S(10),
            9,
            |t| {
                if t >= 10 && t != 30 {
                    True
                } else {
                    False
                }
            },
        )
        .await;
        let reported: Vec<_> = got.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            reported,
            [False, False, False, False, False, False, False, True, True]
        );
    }

    /// With the count as the only guard (the default: 3), the duration is irrelevant: the
    /// change shows on the third consecutive round whatever the interval.
    #[tokio::test(start_paused = true)]
    async fn the_count_guard_counts_rounds_not_seconds() {
        let got = ticks(FlapConfig::default(), S(3_600), 5, |t| {
            if t >= 3_600 {
                True
            } else {
                False
            }
        })
        .await;
        let reported: Vec<_> = got.iter().map(|(_, s)| *s).collect();
        assert_eq!(reported, [False, False, False, True, True]);
    }

    /// The check timeout: a check answering just inside it counts; one answering later, or
    /// never, is cut at exactly the timeout and reported `Unknown` / `CheckFailed`.
    #[tokio::test(start_paused = true)]
    async fn a_check_is_cut_at_exactly_its_timeout() {
        let now = || tokio::time::Instant::now();
        let immediate = FlapConfig::new(1, Duration::ZERO);
        for (delay, ok) in [
            (Some(Duration::from_millis(4_999)), true),
            (Some(Duration::from_millis(5_001)), false),
            (None, false),
        ] {
            let (mut checks, _, runs) = fake(immediate, delay, S(5));
            let t0 = now();
            let round = checks.run_once(t0.into_std()).await;
            let took = t0.elapsed();
            let c = &round.conditions[0];
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            if ok {
                assert_eq!(took, Duration::from_millis(4_999));
                assert_eq!((c.status, c.reason.as_str()), (False, "R"));
                assert!(round.failures.is_empty());
            } else {
                assert_eq!(took, S(5), "delay {delay:?}");
                assert_eq!(
                    (c.status, c.reason.as_str()),
                    (ConditionStatus::Unknown, CHECK_FAILED)
                );
                assert!(matches!(
                    round.failures[0].error,
                    CheckError::Timeout { timeout, .. } if timeout == S(5)
                ));
            }
        }
    }
}
