//! The whole configuration file: one typed TOML document composed of each component's sections
//! ([`AgentSections`]; in the full build [`ControllerSections`]) and the shared `[log]`. Loaded by
//! the engine in [`crate::config`], which collects every error, located.
//!
//! The composition root of the library, above `agent` and `controller` (nothing below imports
//! it): the binary loads it for every command, and the demo in `nodekeeper-sim` and the tests load
//! the same file, so it lives here rather than in the binary crate, which they cannot reach.
//!
//! A new top-level section: a field in its component's part, its key in `KEYS` (in print
//! order), one arm in `Sections::visit_map` and one line in `Serialize for Config`.
//!
//! The agent build has no controller: a file's `[controller]`, `[repair]`, `[budgets]` and
//! `[interruption]` are accepted as they are there, neither checked nor printed (the full
//! build's `nodekeeper validate` checks them).

use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::agent::config::AgentSections;
use crate::config::{ConfigError, Diagnostic, Document, Env, LogConfig};
#[cfg(feature = "controller")]
use crate::controller::config::ControllerSections;

/// A loaded [`Config`], with its warnings.
pub type Loaded = crate::config::Loaded<Config>;

/// The whole configuration file. Every section has defaults, so an empty file is valid.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// `[log]`
    pub log: LogConfig,
    /// The agent's sections.
    pub agent: AgentSections,
    /// The controller's sections.
    #[cfg(feature = "controller")]
    pub controller: ControllerSections,
}

/// Every top-level key, in the order the file is printed and an unknown key's error lists them.
const KEYS: &[&str] = &[
    "log",
    "node",
    "crio",
    "agent",
    "checks",
    "labels",
    "sources",
    "controller",
    "report",
    "repair",
    "budgets",
    "interruption",
];

/// The documented environment overrides: (variable, key path it overrides).
pub const ENV_OVERRIDES: &[(&str, &str)] = &[
    ("NODEKEEPER_LOG_FORMAT", "log.format"),
    ("NODEKEEPER_LOG_LEVEL", "log.level"),
    ("NODEKEEPER_NODE_NAME", "node.name"),
    ("NODEKEEPER_CRIO_DROPIN_DIR", "crio.dropin_dir"),
    ("NODEKEEPER_CRIO_UNIT", "crio.unit"),
    ("NODEKEEPER_CRIO_RESTART_TIMEOUT", "crio.restart_timeout"),
    ("NODEKEEPER_CRIO_STATE_DIR", "crio.state_dir"),
    ("NODEKEEPER_CRIO_SOCKET", "crio.socket"),
    ("NODEKEEPER_CRIO_VERSION", "crio.version"),
];

impl Config {
    /// Reads, parses, applies environment overrides, and validates `path`
    /// ([`crate::config::load`]).
    pub fn load(path: &Path, env: &Env) -> Result<Loaded, ConfigError> {
        crate::config::load(path, env)
    }

    /// As [`Config::load`], from text already read.
    pub fn load_str(path: &Path, text: &str, env: &Env) -> Result<Loaded, ConfigError> {
        crate::config::load_str(path, text, env)
    }

    /// The agent's part of a whole-file load: what `agent::run` reads again on a reload.
    pub fn load_agent(
        path: &Path,
        env: &Env,
    ) -> Result<crate::config::Loaded<AgentSections>, ConfigError> {
        Self::load(path, env).map(|l| l.map(|c| c.agent))
    }

    /// The policy: `[repair]`, `[budgets]`, `[interruption]` and `[controller] dry_run`.
    #[cfg(feature = "controller")]
    pub fn policy(&self) -> crate::controller::policy::PolicyConfig {
        self.controller.policy()
    }

    /// The effective configuration as TOML, with secrets redacted (sections mark theirs with
    /// [`crate::config::REDACTED`]).
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

impl Document for Config {
    fn apply_env(&mut self, env: &Env) -> Vec<Diagnostic> {
        let mut diags = self.log.apply_env(env);
        diags.extend(self.agent.apply_env(env));
        diags
    }

    fn validate(&self) -> Vec<Diagnostic> {
        let mut diags = self.log.validate();
        diags.extend(self.agent.validate());
        #[cfg(feature = "controller")]
        diags.extend(self.controller.validate());
        diags
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_redacted_toml())
    }
}

/// Deserializes a top-level key, refusing one not in [`KEYS`] (as `#[serde(deny_unknown_fields)]`
/// does, with the same message; the TOML reader puts the key's place on it).
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = &'static str;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for Key {
    type Value = &'static str;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field identifier")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        KEYS.iter()
            .find(|k| **k == v)
            .copied()
            .ok_or_else(|| E::unknown_field(v, KEYS))
    }
}

/// Reads the file's sections into their components' parts, each section as its own type reads it
/// (spans and messages as a derived struct's).
struct Sections;

impl<'de> Visitor<'de> for Sections {
    type Value = Config;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct Config")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Config, A::Error> {
        let mut c = Config::default();
        let a = &mut c.agent;
        while let Some(key) = map.next_key_seed(Key)? {
            match key {
                "log" => c.log = map.next_value()?,
                "node" => a.node = map.next_value()?,
                "crio" => a.crio = map.next_value()?,
                "agent" => a.agent = map.next_value()?,
                "checks" => a.checks = map.next_value()?,
                "labels" => a.labels = map.next_value()?,
                "sources" => a.sources = map.next_value()?,
                "report" => a.report = map.next_value()?,
                #[cfg(feature = "controller")]
                "controller" => c.controller.controller = map.next_value()?,
                #[cfg(feature = "controller")]
                "repair" => c.controller.repair = map.next_value()?,
                #[cfg(feature = "controller")]
                "budgets" => c.controller.budgets = map.next_value()?,
                #[cfg(feature = "controller")]
                "interruption" => c.controller.interruption = map.next_value()?,
                // The agent build: the controller's sections, accepted unread.
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(c)
    }
}

impl<'de> Deserialize<'de> for Config {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct("Config", KEYS, Sections)
    }
}

impl Serialize for Config {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = &self.agent;
        let mut st = s.serialize_struct("Config", KEYS.len())?;
        st.serialize_field("log", &self.log)?;
        st.serialize_field("node", &a.node)?;
        st.serialize_field("crio", &a.crio)?;
        st.serialize_field("agent", &a.agent)?;
        st.serialize_field("checks", &a.checks)?;
        st.serialize_field("labels", &a.labels)?;
        st.serialize_field("sources", &a.sources)?;
        #[cfg(feature = "controller")]
        if let Some(controller) = &self.controller.controller {
            st.serialize_field("controller", controller)?;
        }
        if let Some(report) = &a.report {
            st.serialize_field("report", report)?;
        }
        #[cfg(feature = "controller")]
        {
            st.serialize_field("repair", &self.controller.repair)?;
            st.serialize_field("budgets", &self.controller.budgets)?;
            st.serialize_field("interruption", &self.controller.interruption)?;
        }
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::config::{ConfigError, MAX_CONFIG_BYTES};
    use crate::telemetry::LogFormat;

    fn load(text: &str) -> Result<Loaded, ConfigError> {
        Config::load_str(Path::new("c.toml"), text, &Env::default())
    }

    fn errors(text: &str) -> Vec<String> {
        match load(text) {
            Err(ConfigError::Invalid { diagnostics, .. }) => diagnostics
                .iter()
                .map(|d| d.render(Path::new("c.toml")))
                .collect(),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn empty_file_gives_defaults() {
        let l = load("").expect("valid");
        assert_eq!(l.config, Config::default());
        assert_eq!(
            l.config.agent.crio.dropin_dir,
            PathBuf::from("/etc/crio/crio.conf.d")
        );
        assert_eq!(l.config.agent.crio.restart_timeout, Duration::from_secs(90));
    }

    #[test]
    fn unknown_key_is_located() {
        let e = errors("[crio]\nunit = \"crio.service\"\nbogus = 1\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("c.toml:3:1: error: unknown field `bogus`"),
            "{e:?}"
        );
    }

    #[test]
    fn every_type_error_and_unknown_key_is_reported() {
        let text = "[crio]\nunit = 5\nbogus = 1\n\n[nope]\nx = 1\n\n[log]\nformat = \"xml\"\n";
        let e = errors(text);
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].starts_with("c.toml:2:8: error: invalid type"), "{e:?}");
        assert!(
            e[1].starts_with("c.toml:3:1: error: unknown field `bogus`"),
            "{e:?}"
        );
        assert!(
            e[2].starts_with("c.toml:5:2: error: unknown field `nope`"),
            "{e:?}"
        );
        assert!(
            e[3].starts_with("c.toml:9:10: error: unknown variant `xml`"),
            "{e:?}"
        );
    }

    #[test]
    fn syntax_errors_are_located() {
        let e = errors("[crio\nunit = 1\n");
        assert!(e[0].starts_with("c.toml:1:"), "{e:?}");
    }

    #[test]
    fn semantic_errors_are_all_reported_with_locations() {
        let text = "[crio]\n\n[[crio.dropin]]\nname = \"bad name\"\ncontent = \"\"\n\n[[crio.dropin]]\nname = \"ok.conf\"\n";
        let e = errors(text);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e.iter()
                .any(|l| l.starts_with("c.toml:4:8: error:") && l.contains("bad name")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|l| l.starts_with("c.toml:7:1: error:")
                && l.contains("content")
                && l.contains("settings")),
            "{e:?}"
        );
    }

    #[test]
    fn env_overrides_apply_and_bad_values_fail() {
        let env = Env::from_pairs([
            ("NODEKEEPER_CRIO_UNIT", "x.service"),
            ("NODEKEEPER_LOG_FORMAT", "json"),
        ]);
        let l = Config::load_str(Path::new("c.toml"), "", &env).expect("valid");
        assert_eq!(l.config.agent.crio.unit, "x.service");
        assert_eq!(l.config.log.format, LogFormat::Json);
        let env = Env::from_pairs([("NODEKEEPER_CRIO_RESTART_TIMEOUT", "soon")]);
        let err = Config::load_str(Path::new("c.toml"), "", &env).expect_err("invalid");
        assert!(
            err.to_string().contains("NODEKEEPER_CRIO_RESTART_TIMEOUT"),
            "{err}"
        );
    }

    #[test]
    fn the_crio_version_comes_from_the_config_only() {
        let gated = "[crio]\nversion = \"1.31.0\"\n[[crio.dropin]]\nname = \"a.conf\"\ncontent = \"[crio.image]\\nshort_name_mode = \\\"enforcing\\\"\\n\"\n";
        let l = Config::load_str(Path::new("c.toml"), gated, &Env::default()).expect("valid");
        assert!(
            l.warnings[0].message.contains("CRI-O 1.31 ignores it"),
            "{:?}",
            l.warnings
        );
        let unversioned = gated.replace("version = \"1.31.0\"\n", "");
        let l =
            Config::load_str(Path::new("c.toml"), &unversioned, &Env::default()).expect("valid");
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    }

    /// Probe 6: every parse error is located, nesting included (a deep table header had none),
    /// and a text over 1 MiB is refused at the byte past the limit.
    #[test]
    fn deep_nesting_and_oversized_texts_are_refused_with_a_location() {
        let deep_header = format!(
            "[log]\nlevel = \"info\"\n[{}]\nb = 1\n",
            vec!["a"; 3000].join(".")
        );
        let deep_array = format!("x = {}{}\n", "[".repeat(3000), "]".repeat(3000));
        let deep_inline = format!("x = {}1{}\n", "{a = ".repeat(3000), "}".repeat(3000));
        for (name, text, line) in [
            ("header", deep_header, 3),
            ("array", deep_array, 1),
            ("inline", deep_inline, 1),
        ] {
            let e = errors(&text);
            assert!(!e.is_empty(), "{name}");
            for d in &e {
                assert!(d.starts_with(&format!("c.toml:{line}:")), "{name}: {d}");
            }
        }
        let big = format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES));
        let e = errors(&big);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("c.toml:1:") && e[0].contains("at most 1048576 bytes"),
            "{e:?}"
        );
        // At the limit: read as usual.
        let fits = format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES - 3));
        assert!(load(&fits).is_ok());
    }

    #[test]
    fn printed_config_round_trips() {
        let text = "[[crio.dropin]]\nname = \"10-a.conf\"\n[crio.dropin.settings.crio.runtime]\npids_limit = 4096\n";
        let l = load(text).expect("valid");
        let again = load(&l.config.to_redacted_toml()).expect("printed config is valid");
        assert_eq!(again.config, l.config);
    }
}
