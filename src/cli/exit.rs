//! The exit codes of every `nodekeeper` command, in one table (docs/catalog.md "CLI exit codes",
//! checked by the test below). Each command's own page (drain.md, status.md, demo.md) says which
//! of them it uses and when.

/// A process exit code.
// Not every variant is built by every build: the drain codes are absent from the agent build, and
// `SecondSignal` is `nodekeeper_core::shutdown`'s (a test ties the two).
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Success: the configuration is valid, the nodes were listed, the node is drained, ...
    Ok = 0,
    /// The operation failed (after rollback where one applies), or an error (API server
    /// unreachable, kubeconfig unreadable, ...).
    Failure = 1,
    /// Invalid configuration or usage (clap exits with it on bad arguments too).
    Invalid = 2,
    /// `drain`: the deadline passed while a PodDisruptionBudget or a do-not-disrupt annotation
    /// held a pod.
    Blocked = 3,
    /// `drain`: the deadline passed for another reason (pods terminating, volumes attached, API errors).
    TimedOut = 4,
    /// `drain`: interrupted by SIGINT/SIGTERM (the node stays cordoned).
    Interrupted = 5,
    /// A second SIGTERM/SIGINT: the process exits at once
    /// ([`nodekeeper_core::shutdown::SECOND_SIGNAL_EXIT`]).
    SecondSignal = 130,
}

impl Exit {
    /// Every exit code, in order (for the docs test).
    #[allow(dead_code)]
    pub const ALL: &'static [Exit] = &[
        Exit::Ok,
        Exit::Failure,
        Exit::Invalid,
        Exit::Blocked,
        Exit::TimedOut,
        Exit::Interrupted,
        Exit::SecondSignal,
    ];

    /// The code.
    pub const fn code(self) -> u8 {
        self as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of the table whose header row starts with `header`, as cells.
    fn table<'a>(text: &'a str, header: &str) -> Vec<Vec<&'a str>> {
        let mut lines = text.lines().skip_while(|l| !l.starts_with(header));
        assert!(lines.next().is_some(), "no table {header:?}");
        lines
            .skip(1)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.split('|').map(str::trim).skip(1).collect())
            .collect()
    }

    /// docs/catalog.md's exit code table lists exactly [`Exit::ALL`]; the commands' own tables
    /// use no other code.
    #[test]
    fn the_docs_list_exactly_the_exit_codes() {
        let catalog = include_str!("../../docs/catalog.md");
        let rows: Vec<(String, String)> = table(catalog, "| code | name | commands | meaning |")
            .iter()
            .map(|r| {
                (
                    r[0].trim_matches('`').to_string(),
                    r[1].trim_matches('`').to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = Exit::ALL
            .iter()
            .map(|e| (e.code().to_string(), format!("{e:?}")))
            .collect();
        assert_eq!(rows, want, "docs/catalog.md's exit codes vs Exit::ALL");
        let known: Vec<String> = want.into_iter().map(|(c, _)| c).collect();
        for (doc, text, header) in [
            (
                "drain.md",
                include_str!("../../docs/drain.md"),
                "| code | meaning |",
            ),
            (
                "status.md",
                include_str!("../../docs/status.md"),
                "| code | when |",
            ),
        ] {
            for r in table(text, header) {
                assert!(
                    known.contains(&r[0].to_string()),
                    "docs/{doc}: exit code {}",
                    r[0]
                );
            }
        }
        assert_eq!(
            Exit::SecondSignal.code() as i32,
            nodekeeper_core::shutdown::SECOND_SIGNAL_EXIT
        );
    }
}
