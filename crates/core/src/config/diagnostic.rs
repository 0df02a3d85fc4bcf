//! Findings about a configuration file, each naming a key path and, once located, its line and
//! column: the leaf every component's `validate` uses. Depends on nothing else in the crate but the
//! Kubernetes value checks ([`k8s_value_error`]).

use std::path::Path;

use serde::Serialize;

/// How serious a [`Diagnostic`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The configuration is used, but the user should look.
    Warning,
    /// The configuration is refused.
    Error,
}

/// One step of a key path inside the document, e.g. `crio` / `dropin` / `1` / `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSeg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// Builds a key path from string keys and indices: `path!["crio", "dropin", 2, "name"]`.
#[macro_export]
macro_rules! cfg_path {
    ($($seg:expr),* $(,)?) => { vec![$($crate::config::PathSeg::from($seg)),*] };
}

impl From<&str> for PathSeg {
    fn from(s: &str) -> Self {
        PathSeg::Key(s.to_string())
    }
}
impl From<String> for PathSeg {
    fn from(s: String) -> Self {
        PathSeg::Key(s)
    }
}
impl From<usize> for PathSeg {
    fn from(i: usize) -> Self {
        PathSeg::Index(i)
    }
}

/// A finding about the configuration, located in the file where possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// Key path of the offending value (empty: the whole file).
    pub path: Vec<PathSeg>,
    /// What is wrong, in words a user can act on.
    pub message: String,
    /// 1-based line and column, filled in by `locate`.
    pub location: Option<(usize, usize)>,
}

impl Diagnostic {
    /// An error at `path`.
    pub fn error(path: Vec<PathSeg>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            path,
            message: message.into(),
            location: None,
        }
    }
    /// A warning at `path`.
    pub fn warning(path: Vec<PathSeg>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            path,
            message: message.into(),
            location: None,
        }
    }
    /// Renders `FILE:LINE:COL: error: message` (or without LINE:COL when it has no location).
    pub fn render(&self, file: &Path) -> String {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let key = display_path(&self.path);
        let key = if key.is_empty() {
            String::new()
        } else {
            format!(" [{key}]")
        };
        match self.location {
            Some((line, col)) => format!(
                "{}:{line}:{col}: {sev}: {}{key}",
                file.display(),
                self.message
            ),
            None => format!("{}: {sev}: {}{key}", file.display(), self.message),
        }
    }
}

/// An error at `path` when the apiserver would refuse `value` as a `what` (a label key, a taint
/// value, ...): `problems` are the findings of a [`crate::k8s::validation`] check (none: `None`).
pub fn k8s_value_error(
    path: Vec<PathSeg>,
    what: &str,
    value: &str,
    problems: Vec<String>,
) -> Option<Diagnostic> {
    crate::k8s::validation::check(problems).err().map(|why| {
        Diagnostic::error(
            path,
            format!("`{value}` is not a valid {what} (the API server would refuse it): {why}"),
        )
    })
}

/// `crio.dropin[1].name`
pub fn display_path(path: &[PathSeg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            PathSeg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            PathSeg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// 1-based line and column (in characters) of byte offset `off`.
pub fn line_col(text: &str, off: usize) -> (usize, usize) {
    let off = off.min(text.len());
    let before = &text[..floor_char_boundary(text, off)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

pub(super) fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
