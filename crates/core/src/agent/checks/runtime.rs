//! Container runtime check: the CRI `RuntimeService/Version` call on the runtime's socket, as the
//! kubelet makes it first (CRI-O's `/var/run/crio/crio.sock` by default; any CRI runtime answers
//! it). It sees the runtime itself, where the `[checks.systemd]` check sees only a unit, which a
//! node whose runtime is no systemd unit lacks. Reasons: `RuntimeAnswers` (False),
//! `RuntimeUnreachable` (True: no socket, or it refuses connections), `RuntimeNotAnswering` (True:
//! no answer in time, or not a CRI answer).

use std::path::PathBuf;

use super::config::RuntimeConfig;
use super::{CheckFuture, CheckResult, ConditionStatus, HealthCheck, HostRoot};
use crate::agent::crio::runtime::{self, RuntimeError, RuntimeVersion};

/// The container runtime check.
#[derive(Debug, Clone)]
pub struct RuntimeCheck {
    config: RuntimeConfig,
    socket: PathBuf,
}

impl RuntimeCheck {
    /// A check calling the socket `config.socket` names, under `host`.
    pub fn new(config: RuntimeConfig, host: &HostRoot) -> Self {
        let socket = host.join(&config.socket);
        Self { config, socket }
    }

    /// The condition for one call's outcome (pure).
    pub fn evaluate(&self, outcome: &Result<RuntimeVersion, RuntimeError>) -> CheckResult {
        let (status, reason, message) = match outcome {
            Ok(v) => (
                ConditionStatus::False,
                "RuntimeAnswers",
                format!(
                    "{} {} answers the CRI Version call on {} (CRI {})",
                    v.runtime_name,
                    v.runtime_version,
                    self.config.socket.display(),
                    v.runtime_api_version
                ),
            ),
            Err(e @ RuntimeError::Connect { .. }) => {
                (ConditionStatus::True, "RuntimeUnreachable", e.to_string())
            }
            Err(e) => (ConditionStatus::True, "RuntimeNotAnswering", e.to_string()),
        };
        CheckResult::new(&self.config.condition_type, status, reason, message)
    }
}

impl HealthCheck for RuntimeCheck {
    fn name(&self) -> &str {
        "runtime"
    }

    fn condition_types(&self) -> Vec<String> {
        vec![self.config.condition_type.clone()]
    }

    fn check(&mut self) -> CheckFuture<'_> {
        Box::pin(async move {
            let outcome = runtime::version(&self.socket, self.config.timeout).await;
            Ok(vec![self.evaluate(&outcome)].into())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn check(dir: &std::path::Path) -> RuntimeCheck {
        RuntimeCheck::new(
            RuntimeConfig {
                enabled: true,
                socket: PathBuf::from("/run/rt.sock"),
                timeout: Duration::from_millis(300),
                ..Default::default()
            },
            &HostRoot::new(dir),
        )
    }

    async fn run(c: &mut RuntimeCheck) -> CheckResult {
        c.check().await.unwrap().conditions.remove(0)
    }

    #[tokio::test]
    async fn no_socket_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let r = run(&mut check(dir.path())).await;
        assert_eq!(
            (r.status, r.reason.as_str(), r.condition_type.as_str()),
            (
                ConditionStatus::True,
                "RuntimeUnreachable",
                "NodekeeperContainerRuntimeUnreachable"
            )
        );
        assert!(r.message.contains("rt.sock"), "{}", r.message);
    }

    #[tokio::test]
    async fn a_socket_that_never_answers_is_not_answering() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        // Accepts, then says nothing: no HTTP/2 handshake within the timeout.
        let listener = tokio::net::UnixListener::bind(dir.path().join("run/rt.sock")).unwrap();
        let held = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(s);
        });
        let r = run(&mut check(dir.path())).await;
        held.abort();
        assert_eq!(
            (r.status, r.reason.as_str()),
            (ConditionStatus::True, "RuntimeNotAnswering")
        );
        assert!(r.message.contains("did not answer"), "{}", r.message);
    }

    #[test]
    fn an_answer_is_healthy_and_named() {
        let c = check(std::path::Path::new("/"));
        let r = c.evaluate(&Ok(RuntimeVersion {
            runtime_name: "cri-o".into(),
            runtime_version: "1.34.2".into(),
            runtime_api_version: "v1".into(),
        }));
        assert_eq!(
            (r.status, r.reason.as_str()),
            (ConditionStatus::False, "RuntimeAnswers")
        );
        assert_eq!(
            r.message,
            "cri-o 1.34.2 answers the CRI Version call on /run/rt.sock (CRI v1)"
        );
    }
}
