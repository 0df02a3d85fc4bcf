//! Kernel-log check: reads `/dev/kmsg` (or a file / FIFO with the same record format) without
//! blocking, matches each message against regex rules, and turns matches into permanent
//! conditions or temporary events (NPD's kernel monitor, in-process).
//!
//! Live reading starts at the end of the buffer (SEEK_END), so old records never produce events.
//! With `replay_conditions` (default) the records already in the buffer at open time are scanned
//! for **condition** rules only, so an agent restart does not forget a read-only remount.
//!
//! Conditions: the rule's reason (True) once any condition rule of that type matched; otherwise
//! `NoKernelLogMatch` (False). Events: one per matching line and event rule, capped per round
//! (excess summarised as one `KernelEventsDropped` event).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use regex::Regex;

use super::config::{default_kmsg_rules, regex_error_summary, KmsgConfig, KmsgRule, RuleKind};
use super::{
    CheckError, CheckEvent, CheckFuture, CheckOutput, CheckResult, ConditionStatus, EventSeverity,
    HealthCheck,
};

/// The longest message text copied into a condition or event.
pub const MAX_MESSAGE_LEN: usize = 1024;
/// At most this many records are read per round (the rest wait for the next round).
pub const MAX_RECORDS_PER_READ: usize = 10_000;
/// At most this many records are scanned as backlog at open time.
pub const MAX_BACKLOG: usize = 1_000_000;

/// One `/dev/kmsg` record: `PRI,SEQ,TS_USEC,FLAGS[,...];MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgRecord {
    /// Syslog level 0 (emerg) .. 7 (debug).
    pub level: u8,
    /// Syslog facility (0 = kernel).
    pub facility: u32,
    /// Sequence number.
    pub seq: u64,
    /// Microseconds since boot.
    pub ts_usec: u64,
    /// The message text (kernel `\xNN` escapes kept as they are).
    pub message: String,
}

/// Parses the first line of one kmsg record.
pub fn parse_record(line: &str) -> Result<KmsgRecord, String> {
    let (prefix, message) = line
        .split_once(';')
        .ok_or("no `;` between prefix and message")?;
    let mut fields = prefix.split(',');
    let mut num = |name: &str| -> Result<u64, String> {
        let f = fields
            .next()
            .ok_or_else(|| format!("missing {name} field"))?;
        f.parse()
            .map_err(|_| format!("{name} `{f}` is not a number"))
    };
    let pri = num("priority")?;
    let seq = num("sequence")?;
    let ts_usec = num("timestamp")?;
    let facility =
        u32::try_from(pri >> 3).map_err(|_| format!("priority {pri} is out of range"))?;
    Ok(KmsgRecord {
        level: (pri & 7) as u8,
        facility,
        seq,
        ts_usec,
        message: message.trim_end_matches('\n').to_string(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `/dev/kmsg`: each read returns one record.
    Device,
    /// Regular file or FIFO: newline-separated records.
    Stream,
}

/// A non-blocking reader of kmsg records.
#[derive(Debug)]
pub struct KmsgReader {
    path: PathBuf,
    file: File,
    mode: Mode,
    partial: Vec<u8>,
}

fn kmsg_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckError + '_ {
    move |source| CheckError::Kmsg {
        path: path.to_path_buf(),
        source,
    }
}

impl KmsgReader {
    /// Opens `path` non-blocking. Without `replay`, positions at the end and returns no backlog;
    /// with it, returns the records already present (the caller uses them for conditions only).
    pub fn open(path: &Path, replay: bool) -> Result<(Self, Vec<String>), CheckError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(path)
            .map_err(kmsg_err(path))?;
        let kind = file.metadata().map_err(kmsg_err(path))?.file_type();
        let mode = if kind.is_char_device() {
            Mode::Device
        } else {
            Mode::Stream
        };
        let mut reader = Self {
            path: path.to_path_buf(),
            file,
            mode,
            partial: Vec::new(),
        };
        if replay {
            let backlog = reader.drain_backlog()?;
            return Ok((reader, backlog));
        }
        if !kind.is_fifo() {
            reader.file.seek(SeekFrom::End(0)).map_err(kmsg_err(path))?;
        }
        Ok((reader, Vec::new()))
    }

    /// Everything already readable, in batches, so a full kernel buffer is not cut short
    /// (bounded by [`MAX_BACKLOG`] in case records arrive faster than we read).
    fn drain_backlog(&mut self) -> Result<Vec<String>, CheckError> {
        let mut backlog = Vec::new();
        loop {
            let batch = self.read_available()?;
            if batch.is_empty() || backlog.len() >= MAX_BACKLOG {
                return Ok(backlog);
            }
            backlog.extend(batch);
        }
    }

    /// Every complete record available now (first lines only; continuation lines dropped).
    pub fn read_available(&mut self) -> Result<Vec<String>, CheckError> {
        match self.mode {
            Mode::Device => self.read_device(),
            Mode::Stream => self.read_stream(),
        }
    }

    fn read_device(&mut self) -> Result<Vec<String>, CheckError> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        while out.len() < MAX_RECORDS_PER_READ {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    out.push(text.lines().next().unwrap_or_default().to_string());
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // EPIPE: records were overwritten before we read them; reading continues after them.
                Err(e)
                    if e.kind() == ErrorKind::Interrupted
                        || e.raw_os_error() == Some(nix::libc::EPIPE) => {}
                Err(e) => return Err(kmsg_err(&self.path)(e)),
            }
        }
        Ok(out)
    }

    fn read_stream(&mut self) -> Result<Vec<String>, CheckError> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(kmsg_err(&self.path)(e)),
            }
            if self.partial.len() > 16 * 1024 * 1024 {
                break;
            }
        }
        let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Ok(Vec::new());
        };
        let complete: Vec<u8> = self.partial.drain(..=end).collect();
        let text = String::from_utf8_lossy(&complete);
        Ok(text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with(' '))
            .map(str::to_string)
            .collect())
    }
}

/// A rule with its regex compiled.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    regex: Regex,
    rule: KmsgRule,
}

/// The built-in rules (when enabled) followed by the configured ones, compiled. Rules whose
/// pattern does not compile are returned as errors (validation normally refuses them first).
pub fn compile_rules(cfg: &KmsgConfig) -> (Vec<CompiledRule>, Vec<CheckError>) {
    let defaults = if cfg.default_rules {
        default_kmsg_rules()
    } else {
        Vec::new()
    };
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    for rule in defaults.into_iter().chain(cfg.rules.iter().cloned()) {
        match Regex::new(&rule.pattern) {
            Ok(regex) => rules.push(CompiledRule { regex, rule }),
            Err(e) => errors.push(CheckError::Parse {
                path: cfg.path.clone(),
                message: format!(
                    "rule `{}` skipped: invalid regular expression `{}`: {}",
                    rule.reason,
                    rule.pattern,
                    regex_error_summary(&e)
                ),
            }),
        }
    }
    (rules, errors)
}

fn truncate(s: &str) -> String {
    if s.len() <= MAX_MESSAGE_LEN {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// The kernel-log check.
#[derive(Debug)]
pub struct KmsgCheck {
    config: KmsgConfig,
    rules: Vec<CompiledRule>,
    reader: Option<KmsgReader>,
    /// Condition type → (reason, message) of the first match.
    matched: BTreeMap<String, (String, String)>,
    problems: Vec<CheckError>,
}

impl KmsgCheck {
    /// A check with `config`'s rules; the source is opened on the first run (and re-opened after
    /// a read error).
    pub fn new(config: KmsgConfig) -> Self {
        let (rules, problems) = compile_rules(&config);
        Self {
            config,
            rules,
            reader: None,
            matched: BTreeMap::new(),
            problems,
        }
    }

    /// Applies one raw record line: sets conditions; returns events unless `backlog`.
    pub fn apply(
        &mut self,
        line: &str,
        backlog: bool,
        events: &mut Vec<CheckEvent>,
    ) -> Result<(), String> {
        let record = parse_record(line)?;
        for r in &self.rules {
            if !r.regex.is_match(&record.message) {
                continue;
            }
            match (r.rule.kind, &r.rule.condition_type) {
                (RuleKind::Condition, Some(t)) => {
                    let entry = (
                        r.rule.reason.clone(),
                        format!("kernel: {}", truncate(&record.message)),
                    );
                    self.matched.entry(t.clone()).or_insert(entry);
                }
                (RuleKind::Event, _) if !backlog => events.push(CheckEvent {
                    reason: r.rule.reason.clone(),
                    message: truncate(&record.message),
                    severity: r.rule.severity,
                }),
                _ => {}
            }
        }
        Ok(())
    }

    fn read(&mut self) -> Result<Vec<CheckEvent>, CheckError> {
        let mut lines = Vec::new();
        let mut backlog = Vec::new();
        if self.reader.is_none() {
            let (reader, old) = KmsgReader::open(&self.config.path, self.config.replay_conditions)?;
            self.reader = Some(reader);
            backlog = old;
        }
        if let Some(reader) = self.reader.as_mut() {
            match reader.read_available() {
                Ok(l) => lines = l,
                Err(e) => {
                    self.reader = None;
                    return Err(e);
                }
            }
        }
        let mut events = Vec::new();
        let mut bad = 0usize;
        let mut first_bad = None;
        for (line, is_backlog) in backlog
            .iter()
            .map(|l| (l, true))
            .chain(lines.iter().map(|l| (l, false)))
        {
            if let Err(e) = self.apply(line, is_backlog, &mut events) {
                bad += 1;
                first_bad.get_or_insert_with(|| format!("{e}: `{}`", truncate(line)));
            }
        }
        if let Some(first) = first_bad {
            self.problems.push(CheckError::Parse {
                path: self.config.path.clone(),
                message: format!("{bad} malformed record(s) skipped; first: {first}"),
            });
        }
        Ok(self.cap(events))
    }

    fn cap(&self, mut events: Vec<CheckEvent>) -> Vec<CheckEvent> {
        let max = self.config.max_events_per_round;
        if events.len() > max {
            let dropped = events.len() - max;
            events.truncate(max);
            events.push(CheckEvent {
                reason: "KernelEventsDropped".to_string(),
                message: format!("{dropped} more kernel-log events this round were dropped (max_events_per_round = {max})"),
                severity: EventSeverity::Warning,
            });
        }
        events
    }

    fn conditions(&self) -> Vec<CheckResult> {
        self.condition_types()
            .into_iter()
            .map(|t| match self.matched.get(&t) {
                Some((reason, message)) => {
                    CheckResult::new(&t, ConditionStatus::True, reason, message)
                }
                None => CheckResult::new(
                    &t,
                    ConditionStatus::False,
                    "NoKernelLogMatch",
                    format!("no kernel message matched the {t} rules"),
                ),
            })
            .collect()
    }
}

impl HealthCheck for KmsgCheck {
    fn name(&self) -> &str {
        "kmsg"
    }

    fn condition_types(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self
            .rules
            .iter()
            .filter(|r| r.rule.kind == RuleKind::Condition)
        {
            if let Some(t) = &r.rule.condition_type {
                if !out.contains(t) {
                    out.push(t.clone());
                }
            }
        }
        out
    }

    fn check(&mut self) -> CheckFuture<'_> {
        Box::pin(async move {
            let events = self.read()?;
            Ok(CheckOutput {
                conditions: self.conditions(),
                events,
                problems: std::mem::take(&mut self.problems),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_records() {
        let r =
            parse_record("6,1234,5678,-;Out of memory: Killed process 42 (stress)").expect("valid");
        assert_eq!(
            r,
            KmsgRecord {
                level: 6,
                facility: 0,
                seq: 1234,
                ts_usec: 5678,
                message: "Out of memory: Killed process 42 (stress)".into()
            }
        );
        let r = parse_record("30,7,8,c,caller=T1;a;b").expect("valid");
        assert_eq!((r.level, r.facility, r.message.as_str()), (6, 3, "a;b"));
        assert!(parse_record("no separator").is_err());
        assert!(parse_record("x,1,2,-;m").is_err());
        assert!(parse_record("6,1;m").is_err());
        assert!(parse_record(";m").is_err());
    }

    fn rules_check() -> KmsgCheck {
        KmsgCheck::new(KmsgConfig {
            path: PathBuf::from("/nonexistent"),
            ..Default::default()
        })
    }

    #[test]
    fn default_rules_match_real_kernel_lines() {
        let mut c = rules_check();
        let lines = [
            (
                "6,1,1,-;Out of memory: Killed process 1234 (stress) total-vm:1kB",
                Some("OOMKilling"),
            ),
            (
                "6,1,1,-;Memory cgroup out of memory: Killed process 99 (java)",
                Some("OOMKilling"),
            ),
            (
                "3,1,1,-;INFO: task kworker/u8:2:1234 blocked for more than 120 seconds.",
                Some("TaskHung"),
            ),
            (
                "3,1,1,-;Buffer I/O error on dev sda1, logical block 0, async page read",
                Some("IOError"),
            ),
            (
                "3,1,1,-;blk_update_request: I/O error, dev sdb, sector 2048",
                Some("IOError"),
            ),
            (
                "3,1,1,-;I/O error, dev nvme0n1, sector 123 op 0x0:(READ)",
                Some("IOError"),
            ),
            ("6,1,1,-;eth0: link up", None),
        ];
        for (line, want) in lines {
            let mut ev = Vec::new();
            c.apply(line, false, &mut ev).expect("valid record");
            assert_eq!(ev.first().map(|e| e.reason.as_str()), want, "{line}");
            assert!(ev.len() <= 1, "{ev:?}");
        }
        assert!(c.matched.is_empty());
        let mut ev = Vec::new();
        c.apply(
            "3,1,1,-;EXT4-fs error (device sda1): Remounting filesystem read-only",
            false,
            &mut ev,
        )
        .expect("ok");
        assert!(ev.is_empty());
        c.apply(
            "3,1,1,-;INFO: task crio:4242 blocked for more than 120 seconds.",
            false,
            &mut ev,
        )
        .expect("ok");
        assert_eq!(ev.len(), 1, "TaskHung event as well as the condition");
        let conds = c.conditions();
        let get = |t: &str| {
            conds
                .iter()
                .find(|r| r.condition_type == t)
                .cloned()
                .expect("present")
        };
        assert_eq!(
            get("NodekeeperReadonlyFilesystem").reason,
            "FilesystemIsReadOnly"
        );
        assert_eq!(
            get("NodekeeperReadonlyFilesystem").status,
            ConditionStatus::True
        );
        assert_eq!(
            get("NodekeeperKernelDeadlock").reason,
            "ContainerRuntimeTaskHung"
        );
    }

    #[test]
    fn backlog_sets_conditions_but_no_events() {
        let mut c = rules_check();
        let mut ev = Vec::new();
        c.apply("6,1,1,-;Out of memory: Killed process 1 (x)", true, &mut ev)
            .expect("ok");
        c.apply("6,1,1,-;Remounting filesystem read-only", true, &mut ev)
            .expect("ok");
        assert!(ev.is_empty());
        assert_eq!(c.matched.len(), 1);
    }

    #[test]
    fn events_are_capped() {
        let c = KmsgCheck::new(KmsgConfig {
            max_events_per_round: 2,
            ..Default::default()
        });
        let ev = |r: &str| CheckEvent {
            reason: r.into(),
            message: String::new(),
            severity: EventSeverity::Warning,
        };
        let out = c.cap(vec![ev("A"), ev("B"), ev("C"), ev("D")]);
        assert_eq!(
            out.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
            ["A", "B", "KernelEventsDropped"]
        );
        assert!(out[2].message.starts_with("2 more"), "{}", out[2].message);
    }

    #[test]
    fn long_messages_are_truncated_on_char_boundaries() {
        let s = "é".repeat(MAX_MESSAGE_LEN);
        let t = truncate(&s);
        assert!(t.len() <= MAX_MESSAGE_LEN + 3 && t.ends_with("..."));
    }

    proptest::proptest! {
        #[test]
        fn record_parser_never_panics(s in "\\PC*") {
            let _ = parse_record(&s);
        }

        #[test]
        fn record_parser_round_trips(pri in 0u64..2048, seq: u64, ts: u64, msg in "[^\n]*") {
            let r = parse_record(&format!("{pri},{seq},{ts},-;{msg}")).expect("valid");
            proptest::prop_assert_eq!(r.level as u64, pri & 7);
            proptest::prop_assert_eq!(r.seq, seq);
            proptest::prop_assert_eq!(r.message, msg);
        }
    }
}
