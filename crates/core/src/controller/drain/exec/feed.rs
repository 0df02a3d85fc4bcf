//! The pods on the node between a drain's rounds: a list, then a watch from the list's
//! resourceVersion. A round lists again only when the watch saw a change, when the watch is down,
//! or [`RELIST`] after the last list; otherwise it re-plans on the pods it has (the deadline and the
//! retries are times, not changes). A drain waiting for terminating pods so costs one watch and a
//! list per change, not a list every poll interval: at a few hundred drains at once, polling alone
//! filled the controller's API Priority and Fairness queue (docs/comparison.md, "Scale").

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::time::Instant;

/// A fresh list at least this often, whatever the watch says.
const RELIST: Duration = Duration::from_secs(10);
/// After a watch that could not open or broke, the next attempt waits this long (rounds list
/// meanwhile, as without a watch).
const WATCH_RETRY: Duration = Duration::from_secs(10);
/// Server-side timeout of the watch (kube-rs's watcher default).
const WATCH_SECS: u32 = 290;

type Events = BoxStream<'static, kube::Result<WatchEvent<Pod>>>;

/// The node's pods, listed and watched.
pub(super) struct PodFeed {
    api: Api<Pod>,
    fields: String,
    /// The last list and when it was taken.
    cached: Option<(Vec<Pod>, Instant)>,
    /// The resourceVersion of the last list (where a new watch starts).
    rv: Option<String>,
    /// The watch. In a `Mutex` only so that the drain (which holds the feed across `&self`
    /// awaits) is `Sync` while the stream is not; reached through `get_mut`, never locked.
    watch: std::sync::Mutex<Option<Events>>,
    /// A change seen since the last list, or the watch down: the next round lists.
    dirty: bool,
    /// No watch attempt before this.
    retry_watch_at: Option<Instant>,
}

/// How a wait for a change ended.
enum Woke {
    Timer,
    Change,
    /// The server ended the watch (its timeout, or 410 Gone): reopen at the next wait.
    Ended,
    Broken,
}

impl PodFeed {
    pub(super) fn new(api: Api<Pod>, node: &str) -> Self {
        PodFeed {
            api,
            fields: format!("spec.nodeName={node}"),
            cached: None,
            rv: None,
            watch: std::sync::Mutex::new(None),
            dirty: true,
            retry_watch_at: None,
        }
    }

    fn watch(&mut self) -> &mut Option<Events> {
        self.watch.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// The pods now: those of the last list while the watch runs and has seen no change since
    /// (and the list is younger than [`RELIST`]), else a fresh list.
    pub(super) async fn pods(&mut self) -> Result<Vec<Pod>, kube::Error> {
        let now = Instant::now();
        if let Some((pods, at)) = &self.cached {
            let watching = self.watch.get_mut().is_ok_and(|w| w.is_some());
            if !self.dirty && watching && now < *at + RELIST {
                return Ok(pods.clone());
            }
        }
        let list = self
            .api
            .list(&ListParams::default().fields(&self.fields))
            .await?;
        self.rv = list.metadata.resource_version.clone();
        self.cached = Some((list.items.clone(), now));
        self.dirty = false;
        Ok(list.items)
    }

    /// Waits `d`, or less when the watch sees a change on the node's pods (opening the watch
    /// first when none runs). Without a watch it sleeps `d`, and the next round lists.
    pub(super) async fn wait(&mut self, d: Duration, call_timeout: Duration) {
        let until = Instant::now() + d;
        self.open(call_timeout).await;
        let woke = match self.watch().as_mut() {
            None => {
                tokio::time::sleep_until(until).await;
                Woke::Timer
            }
            Some(w) => loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => break Woke::Timer,
                    ev = w.next() => match ev {
                        Some(Ok(WatchEvent::Bookmark(_))) => continue,
                        Some(Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_))) => {
                            break Woke::Change
                        }
                        // The server's timeout, or 410 Gone (its history moved past our list):
                        // the next round lists, and the watch reopens from there.
                        None => break Woke::Ended,
                        Some(Ok(WatchEvent::Error(s))) if s.code == 410 => break Woke::Ended,
                        Some(Ok(WatchEvent::Error(_)) | Err(_)) => break Woke::Broken,
                    },
                }
            },
        };
        match woke {
            Woke::Timer => {}
            Woke::Change => self.dirty = true,
            Woke::Ended => {
                *self.watch() = None;
                self.dirty = true;
            }
            Woke::Broken => {
                tracing::debug!(fields = %self.fields, "drain: pod watch broke; listing every round meanwhile");
                *self.watch() = None;
                self.dirty = true;
                self.retry_watch_at = Some(Instant::now() + WATCH_RETRY);
            }
        }
    }

    /// Opens the watch from the last list's resourceVersion, unless one runs or a failed
    /// attempt is too recent.
    async fn open(&mut self, call_timeout: Duration) {
        let now = Instant::now();
        if self.watch().is_some() || self.retry_watch_at.is_some_and(|at| now < at) {
            return;
        }
        let Some(rv) = self.rv.clone() else {
            return;
        };
        let wp = WatchParams::default()
            .fields(&self.fields)
            .timeout(WATCH_SECS);
        match tokio::time::timeout(call_timeout, self.api.watch(&wp, &rv)).await {
            Ok(Ok(stream)) => *self.watch() = Some(stream.boxed()),
            Ok(Err(error)) => {
                tracing::debug!(fields = %self.fields, %error, "drain: cannot watch the pods; listing every round");
                self.dirty = true;
                self.retry_watch_at = Some(now + WATCH_RETRY);
            }
            Err(_) => {
                self.dirty = true;
                self.retry_watch_at = Some(now + WATCH_RETRY);
            }
        }
    }
}
