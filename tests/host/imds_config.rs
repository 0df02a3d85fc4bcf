//! `[sources]` in a real configuration file: defaults, and located diagnostics through
//! `nodekeeper validate`.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use nodekeeper_core::agent::sources::config::CloudChoice;
use nodekeeper_core::config::{ConfigError, Env};
use nodekeeper_core::config_file::Config;

#[test]
fn sources_section_defaults_and_overrides() {
    let l = Config::load_str(Path::new("c.toml"), "", &Env::default()).unwrap();
    assert_eq!(l.config.agent.sources.cloud, CloudChoice::Auto);
    assert_eq!(l.config.agent.sources.endpoint, "http://169.254.169.254");
    assert_eq!(l.config.agent.sources.poll_interval, Duration::from_secs(1));
    let text = "[sources]\ncloud = \"gcp\"\nendpoint = \"http://127.0.0.1:8169\"\n[sources.gcp]\nlong_poll_timeout = \"30s\"\n";
    let l = Config::load_str(Path::new("c.toml"), text, &Env::default()).unwrap();
    assert_eq!(l.config.agent.sources.cloud, CloudChoice::Gcp);
    assert_eq!(
        l.config.agent.sources.gcp.long_poll_timeout,
        Duration::from_secs(30)
    );
}

#[test]
fn bad_sources_values_are_located() {
    let text = "[sources]\ncloud = \"aws\"\nendpoint = \"https://169.254.169.254\"\n\n[sources.aws]\ntoken_ttl = \"7h\"\n";
    let Err(ConfigError::Invalid { diagnostics, .. }) =
        Config::load_str(Path::new("c.toml"), text, &Env::default())
    else {
        panic!("expected invalid");
    };
    let lines: Vec<String> = diagnostics
        .iter()
        .map(|d| d.render(Path::new("c.toml")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("c.toml:3:12: error:") && l.contains("http://")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("c.toml:6:13: error:") && l.contains("21600")),
        "{lines:?}"
    );
    let err = Config::load_str(
        Path::new("c.toml"),
        "[sources]\ncloud = \"mars\"\n",
        &Env::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("c.toml:2:9: error: unknown variant `mars`"),
        "{err}"
    );
}

#[test]
fn validate_command_reports_sources_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    std::fs::write(&file, "[sources.oci]\npoll_paths = [{ path = \"/opc/v2/instance/metadata/user_data\", kind = \"preemption\" }]\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .arg("validate")
        .arg("-c")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("agent.toml:2:24: error:") && stderr.contains("user_data"),
        "{stderr}"
    );
}
