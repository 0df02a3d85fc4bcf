//! Text helpers shared by every layer (a leaf: depends on nothing in the crate).

/// The first `max` characters of `s`, with `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}
