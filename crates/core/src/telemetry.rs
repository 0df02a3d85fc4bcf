//! Logging set-up: text or JSON lines on stderr, filtered by a target/level directive list
//! (`info`, `nodekeeper=debug,warn`: [`Targets`], parsed without regular expressions, which keeps
//! the agent's resident code and heap small).

use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Log output format.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses a `[log] level` directive list.
pub fn parse_level(level: &str) -> Result<Targets, String> {
    Targets::from_str(level).map_err(|e| e.to_string())
}

/// Installs the global tracing subscriber. Safe to call more than once (later calls are ignored).
pub fn init(format: LogFormat, level: &str) {
    // (`try_init` also forwards the `log` records of dependencies.)
    let _ = subscriber(format, level, std::io::stderr).try_init();
}

/// The subscriber [`init`] installs, writing to `writer`. An invalid `level` means `info`
/// (`validate` refuses it before).
pub fn subscriber<W>(
    format: LogFormat,
    level: &str,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = parse_level(level).unwrap_or_else(|_| {
        Targets::new().with_default(tracing_subscriber::filter::LevelFilter::INFO)
    });
    // The registry under the layers: the filter's level is the only one (a `fmt()` subscriber
    // would also keep its own default of INFO under it).
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_target(true)
        // A closed stderr (e.g. a log collector gone) must never turn into a panic: the
        // subscriber's fallback `eprintln!` would panic on EPIPE.
        .log_internal_errors(false);
    let registry = tracing_subscriber::registry();
    match format {
        LogFormat::Text => Box::new(registry.with(layer).with(filter)),
        LogFormat::Json => Box::new(
            registry
                .with(layer.json().flatten_event(true).with_current_span(false))
                .with(filter),
        ),
    }
}

/// `outer: inner: innermost` (each source once: a message already part of the text is skipped).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let msg = c.to_string();
        if !s.contains(&msg) {
            s.push_str(": ");
            s.push_str(&msg);
        }
        cur = c.source();
    }
    s
}

/// Log output captured in memory, for tests that assert what is logged.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Captured(pub(crate) std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Captured {
    /// A subscriber at `level` writing here, and the text written so far through [`Self::text`].
    pub(crate) fn subscriber(&self, level: &str) -> Box<dyn tracing::Subscriber + Send + Sync> {
        let w = self.clone();
        subscriber(LogFormat::Text, level, move || w.clone())
    }

    /// What was logged.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&crate::sync::lock(&self.0)).into_owned()
    }
}

#[cfg(test)]
impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        crate::sync::lock(&self.0).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_level, subscriber, Captured, LogFormat};

    fn logged(format: LogFormat, level: &str) -> String {
        let out = Captured::default();
        let w = out.clone();
        let sub = subscriber(format, level, move || w.clone());
        tracing::subscriber::with_default(sub, || {
            tracing::debug!(target: "nodekeeper::agent", "a debug line");
            tracing::info!(target: "nodekeeper::agent", "an info line");
            tracing::debug!(target: "hyper", "a dependency's debug line");
        });
        let bytes = crate::sync::lock(&out.0).clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn the_level_list_alone_decides_what_is_logged() {
        for format in [LogFormat::Text, LogFormat::Json] {
            let all = logged(format, "debug");
            assert!(all.contains("a debug line") && all.contains("a dependency's debug line"));
            let info = logged(format, "info");
            assert!(
                info.contains("an info line") && !info.contains("debug line"),
                "{info}"
            );
            let ours = logged(format, "nodekeeper=debug,info");
            assert!(ours.contains("a debug line"), "{ours}");
            assert!(!ours.contains("a dependency's debug line"), "{ours}");
        }
    }

    #[test]
    fn level_directives_parse_and_bad_levels_are_refused() {
        for ok in [
            "info",
            "warn",
            "nodekeeper=debug,warn",
            "nodekeeper::agent=trace",
        ] {
            assert!(parse_level(ok).is_ok(), "{ok}");
        }
        for bad in ["nodekeeper=loud", "=info,nodekeeper=verbose"] {
            assert!(parse_level(bad).is_err(), "{bad}");
        }
    }
}
