//! A unit's own last error line, from the systemd journal, where the agent can read it (a node
//! package on the host has `journalctl`; the agent's `FROM scratch` image has not, and then there
//! is simply no line).

use std::path::Path;
use std::time::{Duration, SystemTime};

/// How long `journalctl` may take, per try.
const TIMEOUT: Duration = Duration::from_secs(3);
/// Tries (journald may store the exited process's last lines just after systemd reports it).
const TRIES: u32 = 5;
/// Longest line kept (an Event message has room for about 1 KiB).
const MAX_LINE: usize = 400;

/// The last error line `unit`'s own processes wrote since `since` (CRI-O's `level=fatal …`), read
/// with `journalctl [--root ROOT] _SYSTEMD_UNIT=UNIT --since @SECS`; `None` without a journal.
pub async fn last_error_line(root: Option<&Path>, unit: &str, since: SystemTime) -> Option<String> {
    let secs = since.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    for attempt in 0..TRIES {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut cmd = tokio::process::Command::new("journalctl");
        if let Some(r) = root {
            cmd.arg("--root").arg(r);
        }
        cmd.args(["--no-pager", "-q", "-o", "cat"])
            .arg(format!("_SYSTEMD_UNIT={unit}"))
            .arg(format!("--since=@{secs}"))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let out = match tokio::time::timeout(TIMEOUT, cmd.output()).await {
            Ok(Ok(out)) if out.status.success() => out,
            // No journalctl (the agent image), or no journal: nothing to add.
            Ok(Ok(_)) | Ok(Err(_)) | Err(_) => return None,
        };
        if let Some(line) = error_line(&String::from_utf8_lossy(&out.stdout)) {
            return Some(line);
        }
    }
    None
}

/// The line that says why: the last `level=fatal`, else the last `level=error`, else the last line.
pub fn error_line(text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let pick = ["level=fatal", "level=error"]
        .iter()
        .find_map(|level| lines.iter().rev().find(|l| l.contains(level)))
        .or(lines.last())?;
    Some(crate::text::truncate(pick, MAX_LINE))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_fatal_line_wins_over_later_ones() {
        let crio = "time=\"…\" level=info msg=\"Starting CRI-O, version: 1.34.0\"\n\
                    time=\"…\" level=error msg=\"minor\"\n\
                    time=\"…\" level=fatal msg=\"validating runtime config: default_runtime does-not-exist not found\"\n\
                    time=\"…\" level=info msg=\"bye\"\n";
        assert!(error_line(crio).unwrap().contains("level=fatal"));
        assert!(error_line("a\nlevel=error x\nb\n")
            .unwrap()
            .contains("level=error x"));
        assert_eq!(error_line("one\nlast\n\n").as_deref(), Some("last"));
        assert_eq!(error_line("\n\n"), None);
        assert!(error_line(&"x".repeat(5000)).unwrap().len() <= MAX_LINE + 4);
    }
}
