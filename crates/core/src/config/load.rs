//! The TOML engine under [`Config::load`](super::Config::load): every error of a file at once, each
//! located. `toml` reports one error per parse, so [`deserialize_all`] blanks the offending line (a
//! table header: its whole table) and parses again, at most 64 times; [`locate`] finds a key path's
//! line and column for the semantic checks.

use super::diagnostic::{floor_char_boundary, line_col, Diagnostic, PathSeg};

/// Deserializes the typed config, collecting every type error and unknown key instead of only
/// the first: each offending line (or table, for a header) is blanked out in place, keeping all
/// other offsets intact, and deserialization is retried.
pub(super) fn deserialize_all<T: serde::de::DeserializeOwned>(
    text: &str,
) -> (Option<T>, Vec<Diagnostic>) {
    let mut work = text.to_string();
    let mut diags = Vec::new();
    for _ in 0..64 {
        let err = match toml::from_str::<T>(&work) {
            Ok(c) => return (Some(c), diags),
            Err(e) => e,
        };
        let mut d = Diagnostic::error(Vec::new(), err.message().trim().to_string());
        d.location = err.span().map(|s| line_col(text, s.start));
        if d.location.is_none() {
            // serde's recursion limit has no span: the most deeply nested line is the cause.
            d.location = deepest_nesting(&work).map(|at| line_col(text, at));
            d.message = format!("{} (nested too deeply here)", d.message);
        }
        diags.push(d);
        let Some(span) = err.span() else { break };
        if !blank_out(&mut work, span.start) || toml::de::DeTable::parse(&work).is_err() {
            break;
        }
    }
    (None, diags)
}

/// The byte offset of the start of the most deeply nested line (the first of the deepest): a
/// table header or key counts its dots, brackets and braces. `None` for an empty text.
pub(super) fn deepest_nesting(text: &str) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let depth = line
            .bytes()
            .filter(|b| matches!(b, b'.' | b'[' | b'{'))
            .count();
        if !line.trim().is_empty() && best.is_none_or(|(d, _)| depth > d) {
            best = Some((depth, at + (line.len() - line.trim_start().len())));
        }
        at += line.len();
    }
    best.map(|(_, at)| at)
}

/// Replaces the line holding byte `at` with spaces; a table header takes its whole table along.
/// Returns false when there was nothing left to blank.
pub(super) fn blank_out(work: &mut String, at: usize) -> bool {
    let at = floor_char_boundary(work, at.min(work.len()));
    let start = work[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = |from: usize| work[from..].find('\n').map_or(work.len(), |i| from + i);
    let mut end = line_end(start);
    if work[start..end].trim_start().starts_with('[') {
        while end < work.len() {
            let next = end + 1;
            let next_end = line_end(next);
            if work[next..next_end].trim_start().starts_with('[') {
                break;
            }
            end = next_end;
        }
    }
    if work[start..end].trim().is_empty() {
        return false;
    }
    let blank: String = work[start..end]
        .chars()
        .map(|c| if c == '\n' { '\n' } else { ' ' })
        .collect();
    // Same length in bytes only for ASCII; keep offsets exact by padding to the byte length.
    let pad = (end - start).saturating_sub(blank.len());
    work.replace_range(start..end, &(blank + &" ".repeat(pad)));
    true
}

/// Parses the document keeping spans. Syntax errors are all reported, each located.
pub(super) fn parse_document(
    text: &str,
) -> Result<toml::Spanned<toml::de::DeTable<'_>>, Vec<Diagnostic>> {
    let (doc, errors) = toml::de::DeTable::parse_recoverable(text);
    if errors.is_empty() {
        return Ok(doc);
    }
    Err(errors
        .into_iter()
        .map(|e| {
            let mut d = Diagnostic::error(Vec::new(), e.message().trim().to_string());
            d.location = e
                .span()
                .map(|s| s.start)
                .or_else(|| deepest_nesting(text))
                .map(|at| line_col(text, at));
            d
        })
        .collect())
}

/// Finds the byte offset of the value (or, failing that, the deepest key) at `path`.
pub(super) fn locate(
    doc: &toml::Spanned<toml::de::DeTable<'_>>,
    path: &[PathSeg],
) -> Option<usize> {
    use toml::de::DeValue;
    let mut best = None;
    let mut table = Some(doc.get_ref());
    let mut value: Option<&toml::Spanned<DeValue<'_>>> = None;
    for seg in path {
        match seg {
            PathSeg::Key(k) => {
                let t = match (table, value.map(|v| v.get_ref())) {
                    (Some(t), None) => t,
                    (_, Some(DeValue::Table(t))) => t,
                    _ => return best,
                };
                let (key, v) = t
                    .iter()
                    .find(|(key, _)| key.get_ref().as_ref() == k.as_str())?;
                best = Some(key.span().start);
                value = Some(v);
                table = None;
            }
            PathSeg::Index(i) => {
                let Some(DeValue::Array(items)) = value.map(|v| v.get_ref()) else {
                    return best;
                };
                let item = items.get(*i)?;
                best = Some(item.span().start);
                value = Some(item);
            }
        }
    }
    match value {
        Some(v) if !matches!(v.get_ref(), DeValue::Table(_)) => Some(v.span().start),
        _ => best,
    }
}
