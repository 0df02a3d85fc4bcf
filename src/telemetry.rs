//! Logging set-up: text or JSON lines on stderr, filtered by an `EnvFilter` directive.

use crate::config::LogFormat;

/// Installs the global tracing subscriber. Safe to call more than once (later calls are ignored).
pub fn init(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        // A closed stderr (e.g. a log collector gone) must never turn into a panic: the
        // subscriber's fallback `eprintln!` would panic on EPIPE.
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}
