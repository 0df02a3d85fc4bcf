//! `[checks]`: which health checks run, their thresholds, and their flap guards.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::debounce::FlapConfig;
use super::EventSeverity;
use crate::cfg_path;
use crate::config::{Diagnostic, PathSeg};

/// `[checks]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ChecksConfig {
    /// Where the host's `/proc`, `/sys` and file systems are visible (`/host` in a container).
    pub host_root: PathBuf,
    /// How often the agent runs a check round.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A check that takes longer than this is reported `Unknown` (`CheckFailed`) for the round.
    #[serde(with = "humantime_serde")]
    pub check_timeout: Duration,
    /// `[checks.memory]`
    pub memory: MemoryConfig,
    /// `[checks.disk]`
    pub disk: DiskConfig,
    /// `[checks.pids]`
    pub pids: PidsConfig,
    /// `[checks.kmsg]`
    pub kmsg: KmsgConfig,
    /// `[checks.systemd]`
    pub systemd: SystemdConfig,
    /// `[checks.runtime]`
    pub runtime: RuntimeConfig,
}

impl Default for ChecksConfig {
    fn default() -> Self {
        Self {
            host_root: PathBuf::from("/"),
            interval: Duration::from_secs(10),
            check_timeout: Duration::from_secs(5),
            memory: MemoryConfig::default(),
            disk: DiskConfig::default(),
            pids: PidsConfig::default(),
            kmsg: KmsgConfig::default(),
            systemd: SystemdConfig::default(),
            runtime: RuntimeConfig::default(),
        }
    }
}

/// A size in bytes: an integer, or a string such as `"512MiB"`, `"2GiB"`, `"1.5G"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses `"512MiB"`, `"2 GB"`, `"1024"`. Binary (`KiB`..`TiB`) and decimal (`K`/`KB`..`T`/`TB`)
    /// suffixes, case-insensitive.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num: f64 = num
            .parse()
            .map_err(|_| format!("`{text}` is not a size (e.g. 512MiB, 2GiB, 1000000)"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "m" | "mb" => 1_000_000,
            "g" | "gb" => 1_000_000_000,
            "t" | "tb" => 1_000_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            "tib" => 1 << 40,
            other => {
                return Err(format!(
                    "`{text}`: unknown size unit `{other}` (use B, KiB, MiB, GiB, TiB, K, M, G, T)"
                ))
            }
        };
        let bytes = num * mult as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(format!("`{text}` is too large"));
        }
        Ok(Self(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Int(n)) => Ok(Self(n)),
            Ok(Raw::Text(s)) => Self::parse(&s).map_err(serde::de::Error::custom),
            Err(_) => Err(serde::de::Error::custom(
                "expected a size: a non-negative integer or a string like \"512MiB\"",
            )),
        }
    }
}

/// `[checks.memory]`: `MemAvailable` from `/proc/meminfo`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Run this check.
    pub enabled: bool,
    /// The condition type reported.
    pub condition_type: String,
    /// Pressure when `MemAvailable` is below this many bytes (0: off).
    pub min_available_bytes: ByteSize,
    /// Pressure when `MemAvailable` is below this percentage of `MemTotal` (0: off).
    pub min_available_percent: f64,
    /// Flap guard.
    pub flap: FlapConfig,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            condition_type: "NodekeeperMemoryPressure".to_string(),
            min_available_bytes: ByteSize(256 << 20),
            min_available_percent: 5.0,
            flap: FlapConfig::default(),
        }
    }
}

/// `[checks.disk]`: free bytes and free inodes (statvfs) on each path.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DiskConfig {
    /// Run this check.
    pub enabled: bool,
    /// Host paths to check (resolved under `host_root`).
    pub paths: Vec<PathBuf>,
    /// The condition type for free space.
    pub condition_type: String,
    /// The condition type for free inodes.
    pub inode_condition_type: String,
    /// Pressure when a path has fewer free bytes than this (0: off).
    pub min_free_bytes: ByteSize,
    /// Pressure when a path has less than this percentage of its space free (0: off).
    pub min_free_percent: f64,
    /// Inode pressure when a path has less than this percentage of its inodes free (0: off).
    pub min_free_inodes_percent: f64,
    /// Flap guard.
    pub flap: FlapConfig,
}

impl Default for DiskConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            paths: ["/", "/var/lib/containers", "/var/lib/kubelet"]
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            condition_type: "NodekeeperDiskPressure".to_string(),
            inode_condition_type: "NodekeeperInodePressure".to_string(),
            min_free_bytes: ByteSize(0),
            min_free_percent: 10.0,
            min_free_inodes_percent: 5.0,
            flap: FlapConfig::default(),
        }
    }
}

/// `[checks.pids]`: process/thread count vs `min(pid_max, threads-max)`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PidsConfig {
    /// Run this check.
    pub enabled: bool,
    /// The condition type reported.
    pub condition_type: String,
    /// Pressure when this percentage of the limit is in use.
    pub max_used_percent: f64,
    /// Flap guard.
    pub flap: FlapConfig,
}

impl Default for PidsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            condition_type: "NodekeeperPIDPressure".to_string(),
            max_used_percent: 90.0,
            flap: FlapConfig::default(),
        }
    }
}

/// `[checks.kmsg]`: kernel log rules.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KmsgConfig {
    /// Run this check.
    pub enabled: bool,
    /// `/dev/kmsg`, or a regular file / FIFO with the same record format (tests).
    /// Not resolved under `host_root`: in a container, pass the device through.
    pub path: PathBuf,
    /// Use the built-in rules (OOM kills, hung tasks, I/O errors, read-only remounts) before
    /// the configured ones.
    pub default_rules: bool,
    /// At start, scan the records already in the kernel buffer for **condition** rules only, so a
    /// restarted agent still reports e.g. a read-only remount; events are never replayed.
    pub replay_conditions: bool,
    /// At most this many events per round; the rest are counted in one `KernelEventsDropped` event.
    pub max_events_per_round: usize,
    /// The configured rules, `[[checks.kmsg.rule]]`.
    #[serde(rename = "rule")]
    pub rules: Vec<KmsgRule>,
    /// Flap guard for the rule conditions.
    pub flap: FlapConfig,
}

impl Default for KmsgConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: PathBuf::from("/dev/kmsg"),
            default_rules: true,
            replay_conditions: true,
            max_events_per_round: 100,
            rules: Vec::new(),
            flap: FlapConfig::new(1, Duration::ZERO),
        }
    }
}

/// `[checks.systemd]`: systemd units over D-Bus.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SystemdConfig {
    /// Run this check.
    pub enabled: bool,
    /// The units, `[[checks.systemd.unit]]`.
    #[serde(rename = "unit")]
    pub units: Vec<UnitCheckConfig>,
    /// `FrequentRestarts` when `NRestarts` grew by this much within `restart_window` (0: off).
    pub max_restarts: u32,
    /// The window for `max_restarts`.
    #[serde(with = "humantime_serde")]
    pub restart_window: Duration,
    /// Flap guard.
    pub flap: FlapConfig,
}

impl Default for SystemdConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            units: vec![
                UnitCheckConfig {
                    name: "kubelet.service".into(),
                    condition_type: "NodekeeperKubeletUnhealthy".into(),
                },
                UnitCheckConfig {
                    name: "crio.service".into(),
                    condition_type: "NodekeeperContainerRuntimeUnhealthy".into(),
                },
            ],
            max_restarts: 3,
            restart_window: Duration::from_secs(600),
            flap: FlapConfig::default(),
        }
    }
}

/// `[checks.runtime]`: the container runtime's own answer to the CRI `Version` call (off by
/// default: the socket differs by runtime; the shipped OKE configs turn it on for CRI-O).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Run this check.
    pub enabled: bool,
    /// The runtime's CRI socket, under `host_root` (containerd: `/run/containerd/containerd.sock`).
    /// `/run`, not `/var/run`: where `/var/run` is an absolute symlink, under `host_root` it would
    /// lead to the container's own `/run`.
    pub socket: PathBuf,
    /// No answer within this: `RuntimeNotAnswering`.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The condition type reported.
    pub condition_type: String,
    /// Flap guard.
    pub flap: FlapConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            socket: PathBuf::from("/run/crio/crio.sock"),
            timeout: Duration::from_secs(2),
            condition_type: "NodekeeperContainerRuntimeUnreachable".to_string(),
            flap: FlapConfig::default(),
        }
    }
}

/// `[[checks.systemd.unit]]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UnitCheckConfig {
    /// The unit, e.g. `kubelet.service`.
    pub name: String,
    /// The condition type reported for it.
    pub condition_type: String,
}

/// What a kernel-log rule produces.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RuleKind {
    /// A permanent condition: once matched, `True` until the node reboots.
    Condition,
    /// A temporary event, reported once per matching line.
    Event,
}

/// `[[checks.kmsg.rule]]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KmsgRule {
    /// A regular expression (Rust `regex` syntax) matched against each kernel message.
    pub pattern: String,
    /// `condition` or `event`.
    pub kind: RuleKind,
    /// For `kind = "condition"`: the condition type set to True.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_type: Option<String>,
    /// CamelCase reason of the condition or event.
    pub reason: String,
    /// Event type for `kind = "event"` (default `Warning`).
    #[serde(default)]
    pub severity: EventSeverity,
}

impl KmsgRule {
    fn new(pattern: &str, kind: RuleKind, condition_type: Option<&str>, reason: &str) -> Self {
        Self {
            pattern: pattern.to_string(),
            kind,
            condition_type: condition_type.map(str::to_string),
            reason: reason.to_string(),
            severity: EventSeverity::Warning,
        }
    }
}

/// The built-in kernel-log rules (NPD's kernel-monitor names, with the `Nodekeeper` prefix).
pub fn default_kmsg_rules() -> Vec<KmsgRule> {
    use RuleKind::{Condition, Event};
    vec![
        KmsgRule::new(
            r"(?i)out of memory: kill(ed)? process",
            Event,
            None,
            "OOMKilling",
        ),
        KmsgRule::new(
            r"task \S+:\w+ blocked for more than \w+ seconds",
            Event,
            None,
            "TaskHung",
        ),
        KmsgRule::new(
            r"task (crio|conmon|kubelet|containerd|runc|crun):\w+ blocked for more than \w+ seconds",
            Condition,
            Some("NodekeeperKernelDeadlock"),
            "ContainerRuntimeTaskHung",
        ),
        KmsgRule::new(
            r"Buffer I/O error|blk_update_request: I/O error|I/O error, dev \S+, sector",
            Event,
            None,
            "IOError",
        ),
        KmsgRule::new(
            r"Remounting filesystem read-only",
            Condition,
            Some("NodekeeperReadonlyFilesystem"),
            "FilesystemIsReadOnly",
        ),
    ]
}

/// True for `MemoryPressure`-style CamelCase names (letters and digits, starting upper-case).
pub fn is_camel_case(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
}

/// Condition types the kubelet owns: setting them would fight the kubelet.
pub const KUBELET_CONDITIONS: &[&str] = &[
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
];

impl ChecksConfig {
    /// Semantic checks, each located at its key path under `[checks]`.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        if !self.host_root.is_absolute() {
            out.push(Diagnostic::error(
                cfg_path!["checks", "host_root"],
                "must be an absolute path",
            ));
        }
        if self.interval.is_zero() {
            out.push(Diagnostic::error(
                cfg_path!["checks", "interval"],
                "must be greater than zero",
            ));
        }
        if self.check_timeout.is_zero() {
            out.push(Diagnostic::error(
                cfg_path!["checks", "check_timeout"],
                "must be greater than zero",
            ));
        }
        let m = &self.memory;
        out.extend(check_type(
            &m.condition_type,
            cfg_path!["checks", "memory", "condition_type"],
        ));
        out.extend(check_percent(
            m.min_available_percent,
            cfg_path!["checks", "memory", "min_available_percent"],
        ));
        out.extend(check_flap(&m.flap, "memory"));
        out.extend(self.validate_disk());
        let p = &self.pids;
        out.extend(check_type(
            &p.condition_type,
            cfg_path!["checks", "pids", "condition_type"],
        ));
        out.extend(check_percent(
            p.max_used_percent,
            cfg_path!["checks", "pids", "max_used_percent"],
        ));
        if p.max_used_percent == 0.0 {
            out.push(Diagnostic::error(
                cfg_path!["checks", "pids", "max_used_percent"],
                "must be greater than zero",
            ));
        }
        out.extend(check_flap(&p.flap, "pids"));
        out.extend(self.validate_kmsg());
        out.extend(self.validate_systemd());
        let r = &self.runtime;
        out.extend(check_type(
            &r.condition_type,
            cfg_path!["checks", "runtime", "condition_type"],
        ));
        if !r.socket.is_absolute() {
            out.push(Diagnostic::error(
                cfg_path!["checks", "runtime", "socket"],
                "must be an absolute path",
            ));
        }
        if r.timeout.is_zero() {
            out.push(Diagnostic::error(
                cfg_path!["checks", "runtime", "timeout"],
                "must be greater than zero",
            ));
        } else if r.enabled && r.timeout >= self.check_timeout {
            out.push(Diagnostic::warning(
                cfg_path!["checks", "runtime", "timeout"],
                "not less than `check_timeout`: a runtime that does not answer shows as `CheckFailed` (Unknown), not `RuntimeNotAnswering`",
            ));
        }
        out.extend(check_flap(&r.flap, "runtime"));
        out
    }

    fn validate_systemd(&self) -> Vec<Diagnostic> {
        let s = &self.systemd;
        let mut out = Vec::new();
        for (i, u) in s.units.iter().enumerate() {
            let valid = u.name.contains('.') && !u.name.contains('/') && !u.name.trim().is_empty();
            if !valid {
                out.push(Diagnostic::error(
                    cfg_path!["checks", "systemd", "unit", i, "name"],
                    format!("`{}` is not a unit name (e.g. `kubelet.service`)", u.name),
                ));
            }
            out.extend(check_type(
                &u.condition_type,
                cfg_path!["checks", "systemd", "unit", i, "condition_type"],
            ));
            if s.units[..i]
                .iter()
                .any(|o| o.condition_type == u.condition_type)
            {
                out.push(Diagnostic::error(
                    cfg_path!["checks", "systemd", "unit", i, "condition_type"],
                    format!(
                        "condition type `{}` is used by an earlier unit",
                        u.condition_type
                    ),
                ));
            }
        }
        if s.max_restarts > 0 && s.restart_window.is_zero() {
            out.push(Diagnostic::error(
                cfg_path!["checks", "systemd", "restart_window"],
                "must be greater than zero",
            ));
        }
        out.extend(check_flap(&s.flap, "systemd"));
        out
    }

    fn validate_disk(&self) -> Vec<Diagnostic> {
        let d = &self.disk;
        let mut out = Vec::new();
        out.extend(check_type(
            &d.condition_type,
            cfg_path!["checks", "disk", "condition_type"],
        ));
        out.extend(check_type(
            &d.inode_condition_type,
            cfg_path!["checks", "disk", "inode_condition_type"],
        ));
        if d.condition_type == d.inode_condition_type {
            out.push(Diagnostic::error(
                cfg_path!["checks", "disk", "inode_condition_type"],
                "must differ from `condition_type`",
            ));
        }
        for (i, p) in d.paths.iter().enumerate() {
            if !p.is_absolute() {
                out.push(Diagnostic::error(
                    cfg_path!["checks", "disk", "paths", i],
                    format!("`{}` must be an absolute path", p.display()),
                ));
            }
        }
        if d.enabled && d.paths.is_empty() {
            out.push(Diagnostic::warning(
                cfg_path!["checks", "disk", "paths"],
                "no paths: the disk check reports nothing",
            ));
        }
        out.extend(check_percent(
            d.min_free_percent,
            cfg_path!["checks", "disk", "min_free_percent"],
        ));
        out.extend(check_percent(
            d.min_free_inodes_percent,
            cfg_path!["checks", "disk", "min_free_inodes_percent"],
        ));
        out.extend(check_flap(&d.flap, "disk"));
        out
    }

    fn validate_kmsg(&self) -> Vec<Diagnostic> {
        let k = &self.kmsg;
        let mut out = Vec::new();
        if !k.path.is_absolute() {
            out.push(Diagnostic::error(
                cfg_path!["checks", "kmsg", "path"],
                "must be an absolute path",
            ));
        }
        for (i, rule) in k.rules.iter().enumerate() {
            out.extend(validate_rule(i, rule));
        }
        out.extend(check_flap(&k.flap, "kmsg"));
        out
    }
}

/// The last line of a regex error (`unclosed group`), without the caret drawing above it.
pub fn regex_error_summary(e: &regex::Error) -> String {
    let text = e.to_string();
    let last = text.lines().last().unwrap_or_default().trim();
    last.strip_prefix("error: ").unwrap_or(last).to_string()
}

fn validate_rule(i: usize, rule: &KmsgRule) -> Vec<Diagnostic> {
    let at = |key: &str| -> Vec<PathSeg> { cfg_path!["checks", "kmsg", "rule", i, key] };
    let mut out = Vec::new();
    if let Err(e) = regex::Regex::new(&rule.pattern) {
        out.push(Diagnostic::error(
            at("pattern"),
            format!("invalid regular expression: {}", regex_error_summary(&e)),
        ));
    }
    if !is_camel_case(&rule.reason) {
        out.push(Diagnostic::error(
            at("reason"),
            format!("`{}` must be CamelCase (e.g. `OOMKilling`)", rule.reason),
        ));
    }
    match (rule.kind, &rule.condition_type) {
        (RuleKind::Condition, None) => {
            out.push(Diagnostic::error(
                cfg_path!["checks", "kmsg", "rule", i],
                "a rule with kind = \"condition\" needs `condition_type`",
            ));
        }
        (RuleKind::Condition, Some(t)) => out.extend(check_type(t, at("condition_type"))),
        (RuleKind::Event, Some(_)) => {
            out.push(Diagnostic::warning(
                at("condition_type"),
                "ignored: the rule has kind = \"event\"",
            ));
        }
        (RuleKind::Event, None) => {}
    }
    out
}

fn check_type(t: &str, path: Vec<PathSeg>) -> Vec<Diagnostic> {
    if !is_camel_case(t) {
        return vec![Diagnostic::error(
            path,
            format!("condition type `{t}` must be CamelCase (e.g. `NodekeeperKernelDeadlock`)"),
        )];
    }
    if KUBELET_CONDITIONS.contains(&t) {
        return vec![Diagnostic::error(
            path,
            format!("condition type `{t}` is owned by the kubelet, which would overwrite it; pick another name"),
        )];
    }
    if !t.starts_with(OWNED_PREFIX) {
        return vec![Diagnostic::warning(
            path,
            format!("condition type `{t}` does not start with `{OWNED_PREFIX}`: a controller with the default `condition_prefix` does not write it to the Node"),
        )];
    }
    Vec::new()
}

pub use crate::wire::OWNED_PREFIX;

fn check_percent(v: f64, path: Vec<PathSeg>) -> Vec<Diagnostic> {
    if !(0.0..=100.0).contains(&v) {
        return vec![Diagnostic::error(
            path,
            format!("{v} is not a percentage between 0 and 100"),
        )];
    }
    Vec::new()
}

fn check_flap(flap: &FlapConfig, check: &str) -> Vec<Diagnostic> {
    if flap.count == 0 {
        return vec![Diagnostic::error(
            cfg_path!["checks", check, "flap", "count"],
            "must be at least 1",
        )];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse() {
        assert_eq!(ByteSize::parse("512MiB"), Ok(ByteSize(512 << 20)));
        assert_eq!(ByteSize::parse("2 gib"), Ok(ByteSize(2 << 30)));
        assert_eq!(ByteSize::parse("1.5G"), Ok(ByteSize(1_500_000_000)));
        assert_eq!(ByteSize::parse("1000"), Ok(ByteSize(1000)));
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("").is_err());
        assert!(ByteSize::parse("1e30").is_err());
        assert!(ByteSize::parse("99999999999TiB").is_err());
    }

    proptest::proptest! {
        #[test]
        fn byte_size_parser_never_panics(s in "\\PC*") {
            let _ = ByteSize::parse(&s);
        }

        #[test]
        fn byte_sizes_in_mib_round_trip(n in 0u64..1 << 30) {
            proptest::prop_assert_eq!(ByteSize::parse(&format!("{n}MiB")), Ok(ByteSize(n << 20)));
        }
    }

    #[test]
    fn default_rules_compile_and_default_config_is_valid() {
        for r in default_kmsg_rules() {
            assert!(regex::Regex::new(&r.pattern).is_ok(), "{}", r.pattern);
        }
        let cfg = ChecksConfig {
            kmsg: KmsgConfig {
                rules: default_kmsg_rules(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(cfg.validate(), vec![]);
    }

    #[test]
    fn kubelet_types_and_bad_names_are_refused() {
        assert_eq!(check_type("MemoryPressure", cfg_path!["x"]).len(), 1);
        assert_eq!(check_type("memory pressure", cfg_path!["x"]).len(), 1);
        assert!(check_type("NodekeeperMemoryPressure", cfg_path!["x"]).is_empty());
        let w = check_type("KernelDeadlock", cfg_path!["x"]);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].severity, crate::config::Severity::Warning);
    }
}
