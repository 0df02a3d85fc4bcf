//! Label and field selectors, parsed from their query-string syntax.

use std::collections::BTreeMap;

use serde_json::Value;

/// Why a selector could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The selector text is malformed.
    #[error("unable to parse requirement in selector \"{selector}\": {why}")]
    Syntax {
        /// The whole selector.
        selector: String,
        /// What is wrong.
        why: String,
    },
    /// A field selector names a field this resource does not support.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` / `key==value`.
    Eq(String, String),
    /// `key!=value` (also true when the key is absent).
    NotEq(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the key is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    NotExists(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn valid_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                && valid_name(name)
        }
        None => valid_name(k),
    }
}

fn valid_value(v: &str) -> bool {
    v.is_empty() || valid_name(v)
}

/// Splits at commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h,!i`. Empty text selects everything.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let err = |why: &str| SelectorError::Syntax {
            selector: text.to_string(),
            why: why.to_string(),
        };
        let mut reqs = Vec::new();
        if text.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top(text) {
            reqs.push(parse_requirement(part.trim()).map_err(|w| err(&w))?);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => labels.get(k) == Some(v),
            Requirement::NotEq(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// Whether the labels of a JSON object satisfy every requirement.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.0.is_empty() || self.matches(&labels_of(obj))
    }

    /// Builds a selector from a `metav1.LabelSelector` JSON object (matchLabels + matchExpressions).
    pub fn from_json(sel: &Value) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(Requirement::Eq(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        for e in sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let vals: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let op = e
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default();
            reqs.push(match op {
                "In" => Requirement::In(key, vals),
                "NotIn" => Requirement::NotIn(key, vals),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::NotExists(key),
                other => {
                    return Err(SelectorError::Syntax {
                        selector: sel.to_string(),
                        why: format!("unknown operator {other:?}"),
                    })
                }
            });
        }
        Ok(LabelSelector(reqs))
    }
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| "expected '(' ... ')' after set operator".to_string())?;
    let vals: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if let Some(bad) = vals.iter().find(|v| !valid_value(v)) {
        return Err(format!("invalid label value {bad:?}"));
    }
    Ok(vals)
}

fn parse_requirement(p: &str) -> Result<Requirement, String> {
    let check_key = |k: &str| -> Result<String, String> {
        let k = k.trim();
        if valid_key(k) {
            Ok(k.to_string())
        } else {
            Err(format!("invalid label key {k:?}"))
        }
    };
    let check_val = |v: &str| -> Result<String, String> {
        let v = v.trim();
        if valid_value(v) {
            Ok(v.to_string())
        } else {
            Err(format!("invalid label value {v:?}"))
        }
    };
    if let Some(k) = p.strip_prefix('!') {
        return Ok(Requirement::NotExists(check_key(k)?));
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(Requirement::NotEq(check_key(k)?, check_val(v)?));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        return Ok(Requirement::Eq(check_key(k)?, check_val(v)?));
    }
    let mut words = p.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default();
    let rest = words.next().unwrap_or_default().trim_start();
    if rest.is_empty() {
        return Ok(Requirement::Exists(check_key(key)?));
    }
    if let Some(set) = rest.strip_prefix("notin") {
        return Ok(Requirement::NotIn(check_key(key)?, parse_set(set)?));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Ok(Requirement::In(check_key(key)?, parse_set(set)?));
    }
    Err(format!("unexpected {rest:?} after key {key:?}"))
}

/// The labels of a JSON object.
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// One field requirement: `path=value` or `path!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// Dotted field path, e.g. `spec.nodeName`.
    pub field: String,
    /// Compared value.
    pub value: String,
    /// `!=` instead of `=`.
    pub negated: bool,
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldRequirement>);

/// Fields supported for every kind.
const COMMON_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

/// Extra fields supported per kind.
fn kind_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "Pod" => &[
            "spec.nodeName",
            "status.phase",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "Node" => &["spec.unschedulable"],
        "Namespace" => &["status.phase"],
        "Event" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
            "regarding.uid",
        ],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parses `spec.nodeName=n1,status.phase!=Failed` for objects of `kind`.
    pub fn parse(text: &str, kind: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, value, negated) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, v, false)
            } else {
                return Err(SelectorError::Syntax {
                    selector: text.to_string(),
                    why: format!("invalid field selector requirement {part:?}"),
                });
            };
            let field = field.trim();
            if !COMMON_FIELDS.contains(&field) && !kind_fields(kind).contains(&field) {
                return Err(SelectorError::UnsupportedField(field.to_string()));
            }
            reqs.push(FieldRequirement {
                field: field.to_string(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether the object satisfies every requirement (absent fields compare as "").
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let got = field_value(obj, &r.field);
            (got == r.value) != r.negated
        })
    }

    /// The value of an equality requirement on `field`, if any (used to hit an index).
    pub fn equality(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.field == field && !r.negated)
            .map(|r| r.value.as_str())
    }
}

/// Value of a dotted field as a string ("" when absent; booleans and numbers printed).
pub fn field_value(obj: &Value, field: &str) -> String {
    let mut cur = obj;
    for seg in field.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Object(m) if field == "source" => m
            .get("component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_table() {
        let l = labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("example.com/pool", "spot"),
        ]);
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("app notin (db, cache)", true),
            ("app notin (web)", false),
            ("missing notin (web)", true),
            ("tier", true),
            ("missing", false),
            ("!missing", true),
            ("!tier", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("app in (web,db),example.com/pool=spot", true),
            ("example.com/pool in (on-demand)", false),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&l), *want, "selector {sel:?}");
        }
    }

    #[test]
    fn invalid_label_selectors_are_rejected() {
        for bad in [
            "app in web",
            "=x",
            "a b c",
            "app=-bad-",
            "app in (a",
            "!",
            "k@y=v",
            "a=b,,",
        ] {
            assert!(
                LabelSelector::parse(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn label_selector_from_json() {
        let sel = json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]},
                                 {"key": "gone", "operator": "DoesNotExist"}]});
        let s = LabelSelector::from_json(&sel).unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "front")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "back")])));
        assert!(LabelSelector::from_json(
            &json!({"matchExpressions": [{"key": "a", "operator": "Bogus"}]})
        )
        .is_err());
        assert!(LabelSelector::from_json(&json!({}))
            .unwrap()
            .matches(&labels(&[])));
    }

    #[test]
    fn field_selector_table() {
        let pod = json!({"metadata": {"name": "p1", "namespace": "ns1"},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let cases: &[(&str, bool)] = &[
            ("spec.nodeName=n1", true),
            ("spec.nodeName==n1", true),
            ("spec.nodeName=n2", false),
            ("spec.nodeName!=n2", true),
            ("metadata.name=p1,metadata.namespace=ns1", true),
            ("status.phase!=Running", false),
            ("status.phase=Running,spec.nodeName=n1", true),
            ("status.podIP=", true),
        ];
        for (sel, want) in cases {
            let s = FieldSelector::parse(sel, "Pod").unwrap();
            assert_eq!(s.matches(&pod), *want, "selector {sel:?}");
        }
        assert_eq!(
            FieldSelector::parse("spec.nodeName=n1", "Pod")
                .unwrap()
                .equality("spec.nodeName"),
            Some("n1")
        );
        assert!(matches!(
            FieldSelector::parse("spec.nodeName=n1", "Node"),
            Err(SelectorError::UnsupportedField(_))
        ));
        assert!(FieldSelector::parse("nonsense", "Pod").is_err());
    }
}
