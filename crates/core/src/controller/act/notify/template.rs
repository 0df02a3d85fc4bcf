//! The body template mini-language: `{name}` placeholders, every other brace literal.

use super::config::NotifyConfig;
use super::queue::Queued;

/// A template placeholder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Node,
    Action,
    Phase,
    Result,
    Reason,
    Message,
    Time,
    Id,
}

const FIELDS: &[(&str, Field)] = &[
    ("node", Field::Node),
    ("action", Field::Action),
    ("phase", Field::Phase),
    ("result", Field::Result),
    ("reason", Field::Reason),
    ("message", Field::Message),
    ("time", Field::Time),
    ("id", Field::Id),
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    Text(String),
    Var(Field),
}

/// Splits a template: `{name}` (letters, digits, `_`) is a placeholder and must be known; every
/// other brace is literal, so JSON templates need no escaping.
pub(super) fn parse_template(tpl: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = tpl;
    while let Some(open) = rest.find('{') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if name_len == 0 || !after[name_len..].starts_with('}') {
            text.push('{');
            rest = after;
            continue;
        }
        let name = &after[..name_len];
        let field = FIELDS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                let known: Vec<String> = FIELDS.iter().map(|(n, _)| format!("{{{n}}}")).collect();
                format!("unknown placeholder {{{name}}}; known: {}", known.join(" "))
            })?;
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Var(field));
        rest = &after[name_len + 1..];
    }
    text.push_str(rest);
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// The body for `q` under `cfg` (template or default JSON).
pub(super) fn body(cfg: &NotifyConfig, pieces: Option<&[Piece]>, q: &Queued) -> Vec<u8> {
    let Some(pieces) = pieces else {
        return serde_json::to_vec(&q.payload()).unwrap_or_default();
    };
    let json = cfg.effective_content_type().contains("json");
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Var(f) if json => out.push_str(&json_escape(&q.field(*f))),
            Piece::Var(f) => out.push_str(&q.field(*f)),
        }
    }
    out.into_bytes()
}

/// `s` escaped for use inside a JSON string (without the quotes).
fn json_escape(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or_default()
        .to_string()
}
