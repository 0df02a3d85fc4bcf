//! The one polling helper of the integration tests: [`until`] polls a condition every
//! [`INTERVAL`] until it holds, and fails the test naming what it waited for (and the last state
//! seen, when the condition reports one) once the timeout has passed.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::time::Duration;

/// How often [`until`] polls.
pub const INTERVAL: Duration = Duration::from_millis(25);

/// What a polled condition returns: `bool` (true: done), `Option<T>` (`Some`: done with a
/// value) or `Result<T, E>` (`Ok`: done with a value; `Err`: not yet, and the error describes
/// the last state seen, shown when the wait times out).
pub trait Ready {
    type Out;
    /// `Ok` when done; `Err` with the last state seen (if any) when not yet.
    fn ready(self) -> Result<Self::Out, Option<String>>;
}

impl Ready for bool {
    type Out = ();
    fn ready(self) -> Result<(), Option<String>> {
        if self {
            Ok(())
        } else {
            Err(None)
        }
    }
}

impl<T> Ready for Option<T> {
    type Out = T;
    fn ready(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Debug> Ready for Result<T, E> {
    type Out = T;
    fn ready(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(format!("{e:?}")))
    }
}

/// Polls `f` every [`INTERVAL`] until it is ready and returns its value; panics naming `what`
/// (and the last state seen) after `timeout`.
pub async fn until<F, Fut>(
    timeout: Duration,
    what: impl Display,
    mut f: F,
) -> <Fut::Output as Ready>::Out
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Ready,
{
    let end = tokio::time::Instant::now() + timeout;
    loop {
        let last = match f().await.ready() {
            Ok(v) => return v,
            Err(last) => last,
        };
        if tokio::time::Instant::now() >= end {
            match last {
                Some(last) => {
                    panic!("timed out after {timeout:?} waiting for {what}; last: {last}")
                }
                None => panic!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(INTERVAL).await;
    }
}
