//! The controller's long-running tasks, supervised: each is spawned by name into one
//! [`JoinSet`], and the first to end before shutdown (returned or panicked) is reported, so the
//! replica can give up its Lease and exit instead of leading with a dead engine (controller-runtime
//! and kubert do the same).

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinSet};

/// A task that ended while the controller was still meant to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("controller task {task:?} {how}")]
pub struct TaskDied {
    /// Which task: `node watch`, `node maintenance`, `engine`, `report server`, `leader election`.
    pub task: &'static str,
    /// `returned` or `panicked: <message>`.
    pub how: String,
}

/// The named tasks of one controller.
#[derive(Default)]
pub struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self.names.values().copied().collect();
        names.sort_unstable();
        f.debug_struct("Tasks").field("running", &names).finish()
    }
}

impl Tasks {
    /// Spawns `fut` as the task `name`.
    pub fn spawn<F>(&mut self, name: &'static str, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = self.set.spawn(fut);
        self.names.insert(handle.id(), name);
    }

    /// Waits for the first task to end and says which and how; pending forever when there is
    /// none (so it can sit in a `select!` beside the shutdown signal).
    pub async fn first_exit(&mut self) -> TaskDied {
        let Some(result) = self.set.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let (id, how) = match result {
            Ok((id, ())) => (id, "returned".to_string()),
            Err(e) => {
                let id = e.id();
                let how = if e.is_panic() {
                    format!("panicked: {}", panic_message(e.into_panic()))
                } else {
                    "was cancelled".to_string()
                };
                (id, how)
            }
        };
        TaskDied {
            task: self.names.remove(&id).unwrap_or("unnamed"),
            how,
        }
    }

    /// Waits (up to `limit`) for every task to end after a shutdown was signalled; aborts the rest.
    pub async fn drain(&mut self, limit: std::time::Duration) {
        let all = async { while self.set.join_next().await.is_some() {} };
        if tokio::time::timeout(limit, all).await.is_err() {
            self.set.abort_all();
            while self.set.join_next().await.is_some() {}
        }
        self.names.clear();
    }
}

/// Short tasks the controller can live without (a provider call, a fast path after a notice):
/// owned here rather than detached, so that none outlives its owner (dropped, they are aborted) and
/// a panic is logged with the task's name instead of lost. [`Background::reap`] (each engine tick)
/// takes the finished ones out.
#[derive(Debug, Default)]
pub struct Background(std::sync::Mutex<JoinSet<()>>);

impl Background {
    /// Spawns `fut` as `name` on `runtime` (none: the current one).
    pub fn spawn<F>(&self, name: &'static str, runtime: Option<&tokio::runtime::Handle>, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        use futures::FutureExt;
        let task = async move {
            if let Err(p) = std::panic::AssertUnwindSafe(fut).catch_unwind().await {
                tracing::error!(task = name, panic = %panic_message(p), "background task panicked");
            }
        };
        let mut set = crate::sync::lock(&self.0);
        match runtime {
            Some(h) => drop(set.spawn_on(task, h)),
            None => drop(set.spawn(task)),
        }
    }

    /// Takes the finished tasks out; returns how many still run.
    pub fn reap(&self) -> usize {
        let mut set = crate::sync::lock(&self.0);
        while set.try_join_next().is_some() {}
        set.len()
    }
}

/// The text of a panic payload (`&str` or `String`; other payloads are named as such).
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => match p.downcast::<&'static str>() {
            Ok(s) => (*s).to_string(),
            Err(_) => "a non-string panic payload".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn names_the_task_that_panicked() {
        let mut t = Tasks::default();
        t.spawn("steady", std::future::pending());
        t.spawn("engine", async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            panic!("injected fault");
        });
        let died = t.first_exit().await;
        assert_eq!(died.task, "engine");
        assert_eq!(died.how, "panicked: injected fault");
        assert_eq!(
            died.to_string(),
            "controller task \"engine\" panicked: injected fault"
        );
    }

    #[tokio::test]
    async fn background_tasks_are_owned_reaped_and_aborted_with_their_owner() {
        let bg = Background::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        bg.spawn("done", None, async {});
        bg.spawn("panics", None, async { panic!("injected") });
        bg.spawn("waits", None, async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(bg.reap(), 1, "the finished and the panicked one reaped");
        drop(bg);
        assert!(
            rx.await.is_err(),
            "the waiting task was aborted with its owner"
        );
    }

    #[tokio::test]
    async fn a_task_that_returns_is_reported_too() {
        let mut t = Tasks::default();
        t.spawn("steady", std::future::pending());
        t.spawn("node watch", async {});
        let died = t.first_exit().await;
        assert_eq!((died.task, died.how.as_str()), ("node watch", "returned"));
    }

    #[tokio::test(start_paused = true)]
    async fn no_tasks_never_ends_and_drain_aborts_stragglers() {
        let mut t = Tasks::default();
        let waited = tokio::time::timeout(Duration::from_secs(3600), t.first_exit()).await;
        assert!(waited.is_err(), "pending with no tasks");
        t.spawn("stuck", std::future::pending());
        t.drain(Duration::from_secs(1)).await;
        assert!(t.set.is_empty(), "aborted after the limit");
    }
}
