//! The demo's live timeline: one line per thing that happened (to which node, why, when) in
//! real seconds and in policy time (real × speed), plus the summary table of outcomes.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;

/// Where lines go and how times are shown.
pub struct Timeline {
    start: Instant,
    speed: f64,
    out: Mutex<Box<dyn Write + Send>>,
    outcomes: Mutex<Vec<Outcome>>,
}

/// One expected outcome of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// What was expected.
    pub what: String,
    /// Node(s) concerned.
    pub node: String,
    /// How long it took (real time), when it happened.
    pub took: Option<Duration>,
    /// Whether it happened as expected.
    pub ok: bool,
    /// Detail (why it failed, or a figure).
    pub detail: String,
}

impl Timeline {
    /// A timeline writing to `out`.
    pub fn new(speed: f64, out: Box<dyn Write + Send>) -> Self {
        Timeline {
            start: Instant::now(),
            speed: speed.max(1.0),
            out: Mutex::new(out),
            outcomes: Mutex::new(Vec::new()),
        }
    }

    /// Real time since the start.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// `  12.3s  (12m18s)` — real and policy time.
    pub fn stamp(&self, at: Duration) -> String {
        let policy = at.mul_f64(self.speed).as_secs();
        format!(
            "{:>6.1}s ({:>2}m{:02}s)",
            at.as_secs_f64(),
            policy / 60,
            policy % 60
        )
    }

    /// Writes one line (ignores a closed stdout).
    pub fn raw(&self, line: &str) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// A timeline entry: what happened to `node`.
    pub fn line(&self, node: &str, what: &str, detail: &str) {
        self.raw(&format!(
            "{}  {:<16} {:<22} {}",
            self.stamp(self.elapsed()),
            node,
            what,
            detail
        ));
    }

    /// A phase header with progress `n/of`.
    pub fn phase(&self, n: usize, of: usize, title: &str) {
        self.raw("");
        self.raw(&format!("── [{n}/{of}] {title}"));
    }

    /// Records an outcome (and prints it).
    pub fn outcome(&self, o: Outcome) {
        let mark = if o.ok { "✔" } else { "✘" };
        self.line(&o.node, &format!("{mark} {}", o.what), &o.detail);
        self.outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(o);
    }

    /// Every outcome so far.
    pub fn outcomes(&self) -> Vec<Outcome> {
        self.outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The summary table; returns whether every outcome was ok.
    pub fn summary(&self) -> bool {
        let outcomes = self.outcomes();
        self.raw("");
        self.raw(&summary_table(&outcomes));
        !outcomes.is_empty() && outcomes.iter().all(|o| o.ok)
    }
}

/// Formats the outcomes as a table.
pub fn summary_table(outcomes: &[Outcome]) -> String {
    let w0 = outcomes
        .iter()
        .map(|o| o.what.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let w1 = outcomes
        .iter()
        .map(|o| o.node.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut s = format!(
        "{:<4} {:<w0$}  {:<w1$}  {:>8}  DETAIL\n",
        "OK", "OUTCOME", "NODE", "TOOK"
    );
    for o in outcomes {
        let took = o
            .took
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        s.push_str(&format!(
            "{:<4} {:<w0$}  {:<w1$}  {:>8}  {}\n",
            if o.ok { "yes" } else { "NO" },
            o.what,
            o.node,
            took,
            o.detail
        ));
    }
    let ok = outcomes.iter().filter(|o| o.ok).count();
    s.push_str(&format!(
        "{ok}/{} expected outcomes happened",
        outcomes.len()
    ));
    s
}

/// Prints every Event nodekeeper records about Nodes in `namespace` until the stream ends.
pub async fn follow_events(client: kube::Client, namespace: &str, tl: &Timeline) {
    let api: Api<Event> = Api::namespaced(client, namespace);
    let mut seen = std::collections::HashSet::new();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        let Ok(ev) = item else { continue };
        let Some(uid) = ev.metadata.uid.clone() else {
            continue;
        };
        if !seen.insert(uid) {
            continue;
        }
        let node = ev
            .regarding
            .as_ref()
            .and_then(|r| r.name.clone())
            .unwrap_or_default();
        let reason = ev.reason.clone().unwrap_or_default();
        let note = ev.note.clone().unwrap_or_default();
        tl.line(&node, &reason, &note);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_counts_and_marks_failures() {
        let o = |ok| Outcome {
            what: "drained before deadline".into(),
            node: "spot-0".into(),
            took: Some(Duration::from_millis(1500)),
            ok,
            detail: String::new(),
        };
        let t = summary_table(&[o(true), o(false)]);
        assert!(t.contains("1/2 expected outcomes happened"), "{t}");
        assert!(t.contains("NO"), "{t}");
        assert!(t.contains("1.5s"), "{t}");
    }

    #[test]
    fn stamp_shows_policy_time() {
        let tl = Timeline::new(60.0, Box::new(std::io::sink()));
        assert_eq!(tl.stamp(Duration::from_secs(10)), "  10.0s (10m00s)");
    }
}
