//! The pods on the node between a drain's rounds: a list, then a watch from the list's
//! resourceVersion whose events are applied to the listed pods, as an informer does. A round lists
//! again only when the watch is down or ended, or [`RELIST`] after the last list; otherwise it
//! re-plans on the pods it holds (the deadline and the retries are times, not changes). A change
//! wakes the waiting round at once, with every event already queued behind it applied too, so a
//! burst of deletions costs one round. A drain so costs one watch and a list every [`RELIST`], not
//! a list every poll interval (nor one per change): at a few hundred drains at once, polling alone
//! filled the controller's API Priority and Fairness queue
//! (bench/results/2026-12-02-scale-real-first-run.md).

use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
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
    /// The pods (the last list with the watch's events since applied) and when that list was
    /// taken.
    cached: Option<(Vec<Pod>, Instant)>,
    /// The resourceVersion of the last list (where a new watch starts).
    rv: Option<String>,
    /// The watch. In a `Mutex` only so that the drain (which holds the feed across `&self`
    /// awaits) is `Sync` while the stream is not; reached through `get_mut`, never locked.
    watch: std::sync::Mutex<Option<Events>>,
    /// The watch ended or broke since the last list: the next round lists.
    dirty: bool,
    /// No watch attempt before this.
    retry_watch_at: Option<Instant>,
}

/// How a wait for a change ended.
enum Woke {
    Timer,
    Change(Box<WatchEvent<Pod>>),
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

    /// The pods now: those held while the watch runs (and the last list is younger than
    /// [`RELIST`]), else a fresh list.
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
    /// first when none runs), and applies the change and every one already queued behind it.
    /// Without a watch it sleeps `d`, and the next round lists.
    pub(super) async fn wait(&mut self, d: Duration, call_timeout: Duration) {
        let until = Instant::now() + d;
        self.open(call_timeout).await;
        let mut woke = match self.watch().as_mut() {
            None => {
                tokio::time::sleep_until(until).await;
                Woke::Timer
            }
            Some(w) => loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => break Woke::Timer,
                    ev = w.next() => match classify(ev) {
                        Some(woke) => break woke,
                        None => continue,
                    },
                }
            },
        };
        // The burst behind a change: apply what is already queued, without waiting.
        while let Woke::Change(event) = woke {
            self.apply(*event);
            woke = match self.watch().as_mut().and_then(|w| w.next().now_or_never()) {
                None => Woke::Timer,
                Some(ev) => classify(ev).unwrap_or(Woke::Timer),
            };
        }
        match woke {
            Woke::Timer | Woke::Change(_) => {}
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

    /// Applies one watch event to the pods held (matched by namespace and name; a pod recreated
    /// under its name arrives as a deletion, then an addition).
    fn apply(&mut self, event: WatchEvent<Pod>) {
        let Some((pods, _)) = self.cached.as_mut() else {
            return;
        };
        let same = |a: &Pod, b: &Pod| {
            a.metadata.name == b.metadata.name && a.metadata.namespace == b.metadata.namespace
        };
        match event {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                match pods.iter_mut().find(|p| same(p, &pod)) {
                    Some(held) => *held = pod,
                    None => pods.push(pod),
                }
            }
            WatchEvent::Deleted(pod) => pods.retain(|p| !same(p, &pod)),
            WatchEvent::Bookmark(_) | WatchEvent::Error(_) => {}
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

/// What one item of the watch means for the waiting round; `None`: keep waiting (a bookmark).
fn classify(ev: Option<kube::Result<WatchEvent<Pod>>>) -> Option<Woke> {
    match ev {
        Some(Ok(WatchEvent::Bookmark(_))) => None,
        Some(Ok(e @ (WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)))) => {
            Some(Woke::Change(Box::new(e)))
        }
        // The server's timeout, or 410 Gone (its history moved past our list): the next round
        // lists, and the watch reopens from there.
        None => Some(Woke::Ended),
        Some(Ok(WatchEvent::Error(s))) if s.code == 410 => Some(Woke::Ended),
        Some(Ok(WatchEvent::Error(_)) | Err(_)) => Some(Woke::Broken),
    }
}
