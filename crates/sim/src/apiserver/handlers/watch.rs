//! Watch streaming: the initial events or a resourceVersion replay, selector transitions, bookmarks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::{partial, Render};
use crate::apiserver::error::{ApiError, ApiResult};
use crate::apiserver::resources::ResourceDef;
use crate::apiserver::store::{EventType, Filter, WatchEvent, WatchFrom};
use crate::apiserver::Sim;

/// Maps a raw event onto what a filtered watcher sees (selectors can turn MODIFIED into ADDED/DELETED).
pub(super) fn visible(ev: &WatchEvent, filter: &Filter) -> Option<EventType> {
    if !filter.in_namespace(&ev.object) {
        return None;
    }
    let now = filter.matches_stored(&ev.object);
    match ev.kind {
        EventType::Added | EventType::Deleted => now.then_some(ev.kind),
        EventType::Modified => {
            let before = ev.prev.as_ref().is_some_and(|p| filter.matches_stored(p));
            match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            }
        }
    }
}

pub(super) fn event_line(kind: &str, obj: &Value) -> Bytes {
    // Serializing a `Value` cannot fail.
    let raw = serde_json::to_vec(obj).unwrap_or_else(|_| b"null".to_vec());
    event_line_raw(kind, &raw)
}

/// A watch event line around an already serialized object.
pub(super) fn event_line_raw(kind: &str, raw: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(raw.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(raw);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

pub(super) fn bookmark(res: &ResourceDef, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta}),
    )
}

pub(super) fn watch(
    sim: &Arc<Sim>,
    res: &'static ResourceDef,
    filter: Filter,
    q: &HashMap<String, String>,
    render_as: Render,
) -> ApiResult<Response> {
    let initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let rv = q
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let from = match rv {
        _ if initial => WatchFrom::Current,
        "" | "0" => WatchFrom::Current,
        n => WatchFrom::After(
            n.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {n:?}")))?,
        ),
    };
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    // kube-apiserver's GetTimeoutForWatch: the client's timeout as asked (no cap), or, when it names
    // none (or 0), a random one between --min-request-timeout (1800 s) and twice it.
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .unwrap_or_else(|| 1800 + rand::random_range(0..1800));
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let table = render_as == Render::Table && crate::apiserver::table::supported(res.kind);
    let clock = sim.store.clock.clone();
    let render = move |k: EventType, ev: &WatchEvent| {
        if table {
            let meta = json!({"resourceVersion": ev.rv.to_string()});
            let obj = ev.object.value();
            let t =
                crate::apiserver::table::render(res.kind, std::iter::once(&obj), meta, clock.now());
            event_line(k.as_str(), &t)
        } else if render_as == Render::Metadata {
            event_line(k.as_str(), &partial(&ev.object.value()))
        } else {
            event_line_raw(k.as_str(), ev.object.raw())
        }
    };
    let start = sim.store.watch(res, &filter, from);
    let mut epoch = sim.watch_epoch();
    tokio::spawn(async move {
        let (backlog, mut live, mut seen) = match start {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(event_line("ERROR", &e.to_status())).await;
                return;
            }
        };
        for ev in &backlog {
            if let Some(k) = visible(ev, &filter) {
                if tx.send(render(k, ev)).await.is_err() {
                    return;
                }
            }
        }
        if initial && tx.send(bookmark(res, seen, true)).await.is_err() {
            return;
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = epoch.changed() => return,
                _ = tick.tick() => {
                    if bookmarks && tx.send(bookmark(res, seen, false)).await.is_err() {
                        return;
                    }
                    if tx.is_closed() {
                        return;
                    }
                }
                ev = live.recv() => match ev {
                    Ok(ev) => {
                        seen = seen.max(ev.rv);
                        if ev.res != res.index() {
                            continue;
                        }
                        if let Some(k) = visible(&ev, &filter) {
                            if tx.send(render(k, &ev)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
                },
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    });
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache, private"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::apiserver::object::StoredObject;
    use crate::apiserver::selectors::LabelSelector;

    #[test]
    fn selector_transitions_in_watches() {
        let f = Filter {
            labels: LabelSelector::parse("app=web").unwrap(),
            ..Default::default()
        };
        let obj = |app: &str| {
            Arc::new(StoredObject::new(
                &json!({"metadata": {"name": "p", "namespace": "a", "labels": {"app": app}}}),
            ))
        };
        let ev = |kind, now: &str, prev: Option<&str>| WatchEvent {
            res: 1,
            kind,
            rv: 5,
            object: obj(now),
            prev: prev.map(obj),
        };
        use EventType::*;
        let cases = [
            (ev(Added, "web", None), Some(Added)),
            (ev(Added, "db", None), None),
            (ev(Modified, "web", Some("web")), Some(Modified)),
            (ev(Modified, "web", Some("db")), Some(Added)),
            (ev(Modified, "db", Some("web")), Some(Deleted)),
            (ev(Modified, "db", Some("db")), None),
            (ev(Deleted, "web", None), Some(Deleted)),
        ];
        for (e, want) in cases {
            assert_eq!(
                visible(&e, &f),
                want,
                "{:?} {:?} prev {:?}",
                e.kind,
                e.object,
                e.prev
            );
        }
        let other_ns = Filter {
            namespace: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(visible(&ev(Added, "web", None), &other_ns), None);
    }
}
