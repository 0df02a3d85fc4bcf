//! `[controller.history]`: how much of each node's action history the controller keeps
//! (docs/operations.md, "History").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::entry::Limits;
use crate::cfg_path;
use crate::config::Diagnostic;

/// The most entries one node may keep: at the 4 KiB an entry may reach, far below the 1 MiB
/// object limit (and [`MAX_BYTES`] bounds it anyway).
pub const MAX_ENTRIES_LIMIT: usize = 1000;

/// The encoded history of one node at most, in bytes: a quarter of the API server's 1 MiB
/// object limit (etcd's request limit is 1.5 MiB), whatever the entries say.
pub const MAX_BYTES: usize = 256 * 1024;

/// `[controller.history]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Record the actions (off: nothing is written, `status NODE --history` shows what is left).
    pub enabled: bool,
    /// Entries kept per node at most (the oldest go first).
    pub max_entries: usize,
    /// Entries older than this go; a history whose entries all went is deleted (a node long
    /// gone).
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            enabled: true,
            // A repair is 3–6 entries: the last 10–30 repairs of a node.
            max_entries: 100,
            // Longer than the Events' hour by far: a month of a node's life.
            max_age: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

impl HistoryConfig {
    /// The merge's limits.
    pub fn limits(&self) -> Limits {
        Limits {
            max_entries: self.max_entries,
            max_age: chrono::Duration::from_std(self.max_age).unwrap_or(chrono::Duration::MAX),
            max_bytes: MAX_BYTES,
        }
    }

    /// Semantic checks.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let at = |k: &str| cfg_path!["controller", "history", k];
        let mut d = Vec::new();
        if self.max_entries == 0 || self.max_entries > MAX_ENTRIES_LIMIT {
            d.push(Diagnostic::error(
                at("max_entries"),
                format!("must be between 1 and {MAX_ENTRIES_LIMIT}"),
            ));
        }
        if self.max_age < Duration::from_secs(60) {
            d.push(Diagnostic::error(at("max_age"), "must be at least 1m"));
        }
        d
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::config::Env;
    use crate::config_file::Config;

    fn load(history: &str) -> Result<super::HistoryConfig, String> {
        let text = format!(
            "[controller]\nlisten = \"127.0.0.1:1\"\ninsecure_plain_http = true\n[controller.history]\n{history}"
        );
        Config::load_str(std::path::Path::new("t.toml"), &text, &Env::default())
            .map(|l| l.config.controller.controller.unwrap().history)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_history_section_has_defaults_and_is_checked_at_its_keys() {
        let d = load("").unwrap();
        assert!(d.enabled);
        assert_eq!(d.max_entries, 100);
        assert_eq!(d.max_age, std::time::Duration::from_secs(30 * 86400));
        let set = load("max_entries = 5\nmax_age = \"2h\"\n").unwrap();
        assert_eq!((set.max_entries, set.limits().max_age.num_hours()), (5, 2));
        for (bad, key) in [
            ("max_entries = 0\n", "max_entries"),
            ("max_entries = 1001\n", "max_entries"),
            ("max_age = \"10s\"\n", "max_age"),
        ] {
            let e = load(bad).unwrap_err();
            assert!(e.contains(&format!("history.{key}")), "{bad}: {e}");
        }
        assert!(load("max_entry = 1\n").is_err(), "unknown keys are refused");
    }
}
