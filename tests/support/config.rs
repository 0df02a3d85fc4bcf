//! The configuration file loaded from text, as the binary loads it (file name `c.toml`, no
//! environment overrides).

use std::path::Path;

use nodekeeper_core::config::{ConfigError, Env};
use nodekeeper_core::config_file::{Config, Loaded};

/// `text` loaded as `c.toml`.
pub fn load(text: &str) -> Result<Loaded, ConfigError> {
    Config::load_str(Path::new("c.toml"), text, &Env::default())
}

/// The located diagnostics of an invalid `text`, rendered (`c.toml:L:C: error: … [key.path]`);
/// panics if it loads.
pub fn errors(text: &str) -> Vec<String> {
    match load(text) {
        Err(ConfigError::Invalid { diagnostics, .. }) => diagnostics
            .iter()
            .map(|d| d.render(Path::new("c.toml")))
            .collect(),
        other => panic!("expected invalid, got {other:?}"),
    }
}
