//! Validation of `[crio]` and its drop-ins: names, TOML syntax, `short_name_mode`, CRI-O
//! version gates, and unknown CRI-O keys (which CRI-O silently ignores, so they only warn).

use super::config::{CrioConfig, DropIn};
use crate::cfg_path;
use crate::config::{Diagnostic, PathSeg};

/// The first CRI-O release that reads `[crio.image] short_name_mode` (older ones hard-code `disabled`).
pub const SHORT_NAME_MODE_SINCE: (u32, u32) = (1, 34);

/// Checks the `[crio]` section. `crio_version` is `[crio] version`.
pub fn lint(crio: &CrioConfig, crio_version: Option<&str>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if crio.unit.trim().is_empty() {
        out.push(Diagnostic::error(
            cfg_path!["crio", "unit"],
            "must name a systemd unit, e.g. `crio.service`",
        ));
    }
    if crio.restart_timeout.is_zero() {
        out.push(Diagnostic::error(
            cfg_path!["crio", "restart_timeout"],
            "must be greater than zero",
        ));
    }
    for (key, dir) in [
        ("dropin_dir", &crio.dropin_dir),
        ("state_dir", &crio.state_dir),
        ("socket", &crio.socket),
    ] {
        if !dir.is_absolute() {
            out.push(Diagnostic::error(
                cfg_path!["crio", key],
                format!("`{}` must be an absolute path", dir.display()),
            ));
        }
    }
    if crio.dropin_dir == crio.state_dir || crio.state_dir.starts_with(&crio.dropin_dir) {
        out.push(Diagnostic::error(
            cfg_path!["crio", "state_dir"],
            "must be outside `dropin_dir`: CRI-O loads every file in its drop-in directory, including nodekeeper's state and temp files",
        ));
    }
    let version = match crio_version.map(|v| (v, parse_version(v))) {
        Some((v, None)) => {
            out.push(Diagnostic::warning(
                cfg_path!["crio", "version"],
                format!(
                    "cannot read a CRI-O version from `{v}`; version-dependent checks are skipped"
                ),
            ));
            None
        }
        Some((_, parsed)) => parsed,
        None => None,
    };
    for (i, d) in crio.dropins.iter().enumerate() {
        if let Some(j) = crio.dropins[..i].iter().position(|o| o.name == d.name) {
            out.push(Diagnostic::error(
                cfg_path!["crio", "dropin", i, "name"],
                format!(
                    "drop-in `{}` is declared twice (first as dropin[{j}])",
                    d.name
                ),
            ));
        }
        out.extend(lint_dropin(i, d, version));
    }
    out
}

/// Is `name` a plain drop-in file name nodekeeper may own?
pub fn valid_name(name: &str) -> bool {
    name.len() > ".conf".len()
        && name.ends_with(".conf")
        && name != "..conf"
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn lint_dropin(i: usize, d: &DropIn, version: Option<(u32, u32)>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let at = |key: &str| -> Vec<PathSeg> { cfg_path!["crio", "dropin", i, key] };
    if !valid_name(&d.name) {
        out.push(Diagnostic::error(
            at("name"),
            format!("drop-in name `{}` must match ^[0-9A-Za-z._-]+\\.conf$ (a plain file name, not hidden)", d.name),
        ));
    }
    let table = match (&d.content, &d.settings) {
        (Some(_), Some(_)) | (None, None) => {
            out.push(Diagnostic::error(
                cfg_path!["crio", "dropin", i],
                format!("drop-in `{}` needs exactly one of `content` (TOML text) or `settings` (a table)", d.name),
            ));
            return out;
        }
        (Some(content), None) => match content.parse::<toml::Table>() {
            Ok(t) => t,
            Err(e) => {
                let where_ = e
                    .span()
                    .map(|s| {
                        let (l, c) = crate::config::line_col(content, s.start);
                        format!(" (line {l}, column {c} of the content)")
                    })
                    .unwrap_or_default();
                out.push(Diagnostic::error(
                    at("content"),
                    format!("content of `{}` is not valid TOML{where_}: {}; CRI-O would refuse to start", d.name, e.message().trim()),
                ));
                return out;
            }
        },
        (None, Some(settings)) => settings.clone(),
    };
    let key_at = if d.content.is_some() {
        at("content")
    } else {
        at("settings")
    };
    out.extend(lint_crio_keys(&d.name, &table, &key_at));
    if let Some(mode) = table
        .get("crio")
        .and_then(|c| c.get("image"))
        .and_then(|i| i.get("short_name_mode"))
    {
        match mode.as_str() {
            Some("enforcing") => {}
            Some("disabled") => out.push(Diagnostic::warning(
                key_at.clone(),
                format!(
                    "`{}` sets short_name_mode = \"disabled\": this does NOT require full image names, it PERMITS short ones \
                     (each unqualified-search registry of registries.conf is tried in turn). \"enforcing\" refuses a short name \
                     only when it is ambiguous (two or more unqualified-search registries) and still resolves it when there is one; \
                     to require fully qualified names, set `unqualified-search-registries = []` in /etc/containers/registries.conf",
                    d.name
                ),
            )),
            _ => out.push(Diagnostic::error(
                key_at.clone(),
                format!("`{}`: crio.image.short_name_mode must be \"enforcing\" or \"disabled\", got {mode}", d.name),
            )),
        }
        if let Some(v) = version.filter(|v| *v < SHORT_NAME_MODE_SINCE) {
            out.push(Diagnostic::warning(
                key_at.clone(),
                format!(
                    "`{}` sets short_name_mode, but CRI-O {}.{} ignores it (read since {}.{}; older releases behave as \"disabled\")",
                    d.name, v.0, v.1, SHORT_NAME_MODE_SINCE.0, SHORT_NAME_MODE_SINCE.1
                ),
            ));
        }
    }
    out
}

/// `(major, minor)` from `1.34.2`, `v1.34`, or `crio --version` output (`crio version 1.34.2`, `Version: 1.34.2`).
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let re = regex::Regex::new(r"(?m)(?:^|[\sv:])(\d+)\.(\d+)(?:\.\d+)?").ok()?;
    let caps = re.captures(text)?;
    Some((caps[1].parse().ok()?, caps[2].parse().ok()?))
}

/// Known keys per CRI-O table (crio.conf(5)); `None` marks a table of user-named entries.
const KNOWN: &[(&str, Option<&[&str]>)] = &[
    (
        "crio",
        Some(&[
            "root",
            "runroot",
            "imagestore",
            "storage_driver",
            "storage_option",
            "log_dir",
            "version_file",
            "version_file_persist",
            "internal_wipe",
            "internal_repair",
            "clean_shutdown_file",
            "api",
            "runtime",
            "image",
            "network",
            "metrics",
            "tracing",
            "stats",
            "nri",
        ]),
    ),
    (
        "crio.api",
        Some(&[
            "listen",
            "stream_address",
            "stream_port",
            "stream_enable_tls",
            "stream_idle_timeout",
            "stream_tls_cert",
            "stream_tls_key",
            "stream_tls_ca",
            "grpc_max_send_msg_size",
            "grpc_max_recv_msg_size",
        ]),
    ),
    (
        "crio.runtime",
        Some(&[
            "default_ulimits",
            "no_pivot",
            "decryption_keys_path",
            "conmon",
            "conmon_cgroup",
            "conmon_env",
            "default_env",
            "selinux",
            "seccomp_profile",
            "privileged_seccomp_profile",
            "seccomp_use_default_when_empty",
            "apparmor_profile",
            "blockio_config_file",
            "blockio_reload",
            "irqbalance_config_file",
            "irqbalance_config_restore_file",
            "rdt_config_file",
            "cgroup_manager",
            "separate_pull_cgroup",
            "default_capabilities",
            "add_inheritable_capabilities",
            "default_sysctls",
            "allowed_devices",
            "additional_devices",
            "cdi_spec_dirs",
            "device_ownership_from_security_context",
            "hooks_dir",
            "default_mounts_file",
            "pids_limit",
            "log_size_max",
            "log_to_journald",
            "container_exits_dir",
            "container_attach_socket_dir",
            "bind_mount_prefix",
            "read_only",
            "log_level",
            "log_filter",
            "uid_mappings",
            "gid_mappings",
            "minimum_mappable_uid",
            "minimum_mappable_gid",
            "ctr_stop_timeout",
            "drop_infra_ctr",
            "infra_ctr_cpuset",
            "shared_cpuset",
            "namespaces_dir",
            "pinns_path",
            "enable_criu_support",
            "enable_pod_events",
            "default_runtime",
            "absent_mount_sources_to_reject",
            "hostnetwork_disable_selinux",
            "disable_hostport_mapping",
            "timezone",
            "runtimes",
            "workloads",
        ]),
    ),
    ("crio.runtime.runtimes", None),
    ("crio.runtime.workloads", None),
    (
        "crio.image",
        Some(&[
            "default_transport",
            "global_auth_file",
            "pause_image",
            "pause_image_auth_file",
            "pause_command",
            "pinned_images",
            "signature_policy",
            "signature_policy_dir",
            "insecure_registries",
            "image_volumes",
            "big_files_temporary_dir",
            "auto_reload_registries",
            "pull_progress_timeout",
            "short_name_mode",
            "oci_artifact_mount_support",
            "registries",
        ]),
    ),
    (
        "crio.network",
        Some(&["cni_default_network", "network_dir", "plugin_dirs"]),
    ),
    (
        "crio.metrics",
        Some(&[
            "enable_metrics",
            "metrics_collectors",
            "metrics_host",
            "metrics_port",
            "metrics_socket",
            "metrics_cert",
            "metrics_key",
        ]),
    ),
    (
        "crio.tracing",
        Some(&[
            "enable_tracing",
            "tracing_endpoint",
            "tracing_sampling_rate_per_million",
        ]),
    ),
    (
        "crio.stats",
        Some(&[
            "stats_collection_period",
            "collection_period",
            "included_pod_metrics",
        ]),
    ),
    (
        "crio.nri",
        Some(&[
            "enable_nri",
            "nri_listen",
            "nri_plugin_dir",
            "nri_plugin_config_dir",
            "nri_plugin_registration_timeout",
            "nri_plugin_request_timeout",
            "nri_disable_connections",
        ]),
    ),
];

/// Warns about keys CRI-O does not know (it ignores them silently, which hides typos).
fn lint_crio_keys(file: &str, table: &toml::Table, at: &[PathSeg]) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (k, v) in table {
        if k != "crio" {
            out.push(Diagnostic::warning(
                at.to_vec(),
                format!("`{file}`: top-level key `{k}` is not a CRI-O option (all options sit under [crio.*]); CRI-O ignores it"),
            ));
        } else if let Some(t) = v.as_table() {
            walk(file, "crio", t, at, &mut out);
        }
    }
    out
}

fn walk(
    file: &str,
    table_path: &str,
    table: &toml::Table,
    at: &[PathSeg],
    out: &mut Vec<Diagnostic>,
) {
    let Some((_, known)) = KNOWN.iter().find(|(p, _)| *p == table_path) else {
        return;
    };
    let Some(known) = known else { return };
    for (k, v) in table {
        let child = format!("{table_path}.{k}");
        if !known.contains(&k.as_str()) {
            out.push(Diagnostic::warning(
                at.to_vec(),
                format!("`{file}`: `{child}` is not a known CRI-O option; CRI-O ignores unknown keys (typo?)"),
            ));
        } else if let Some(t) = v.as_table() {
            walk(file, &child, t, at, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dropin(name: &str, content: &str) -> CrioConfig {
        CrioConfig {
            dropins: vec![DropIn {
                name: name.into(),
                content: Some(content.into()),
                settings: None,
                adopt: false,
            }],
            ..CrioConfig::default()
        }
    }

    fn messages(c: &CrioConfig, v: Option<&str>) -> Vec<(crate::config::Severity, String)> {
        lint(c, v)
            .into_iter()
            .map(|d| (d.severity, d.message))
            .collect()
    }

    #[test]
    fn names() {
        for ok in ["11-default.conf", "a.b_c-d.conf", "99.conf"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            ".conf",
            ".hidden.conf",
            "a/b.conf",
            "../x.conf",
            "x.toml",
            "x y.conf",
            "",
            "x.conf.bak",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn short_name_mode_values() {
        use crate::config::Severity::*;
        let m = messages(
            &dropin("a.conf", "[crio.image]\nshort_name_mode = \"enforcing\"\n"),
            Some("1.34.0"),
        );
        assert!(m.is_empty(), "{m:?}");
        let m = messages(
            &dropin("a.conf", "[crio.image]\nshort_name_mode = \"disabled\"\n"),
            None,
        );
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].0, Warning);
        assert!(m[0]
            .1
            .contains("does NOT require full image names, it PERMITS short ones"));
        let m = messages(
            &dropin("a.conf", "[crio.image]\nshort_name_mode = \"permissive\"\n"),
            None,
        );
        assert_eq!(m[0].0, Error);
        assert!(m[0].1.contains("\"enforcing\" or \"disabled\""), "{m:?}");
        let m = messages(
            &dropin("a.conf", "[crio.image]\nshort_name_mode = \"enforcing\"\n"),
            Some("crio version 1.31.4"),
        );
        assert_eq!(m.len(), 1);
        assert!(m[0].1.contains("CRI-O 1.31 ignores it"), "{m:?}");
    }

    #[test]
    fn bad_toml_and_unknown_keys() {
        use crate::config::Severity::*;
        let m = messages(&dropin("a.conf", "[crio.image\n"), None);
        assert_eq!(m[0].0, Error);
        assert!(m[0].1.contains("not valid TOML (line 1"), "{m:?}");
        let m = messages(
            &dropin(
                "a.conf",
                "[crio.runtime]\npids_limt = 5\n[crio.runtime.runtimes.crun]\nanything = 1\n",
            ),
            None,
        );
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[0].0, Warning);
        assert!(m[0].1.contains("crio.runtime.pids_limt"));
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version("1.34.2"), Some((1, 34)));
        assert_eq!(parse_version("v1.30"), Some((1, 30)));
        assert_eq!(
            parse_version("crio version 1.28.1\nVersion: 1.28.1"),
            Some((1, 28))
        );
        assert_eq!(
            parse_version("Version:        1.33.0\nGitCommit: abc"),
            Some((1, 33))
        );
        assert_eq!(parse_version("unknown"), None);
    }

    #[test]
    fn state_dir_inside_dropin_dir_is_refused() {
        let c = CrioConfig {
            state_dir: "/etc/crio/crio.conf.d/state".into(),
            ..CrioConfig::default()
        };
        assert!(messages(&c, None)
            .iter()
            .any(|(_, m)| m.contains("outside `dropin_dir`")));
    }
}
