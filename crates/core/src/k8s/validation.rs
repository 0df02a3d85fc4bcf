//! The apiserver's name and value rules (`k8s.io/apimachinery/pkg/util/validation`), shared by
//! `nodekeeper validate`, the controller's Event recorder and the sim, so that a key the real
//! apiserver would refuse (422) fails at validation time instead of on the first write.
//!
//! Each check returns the list of problems in the apiserver's own words (empty: valid).

/// Longest DNS-1123 label (a namespace name, the name part of a qualified name's limit too).
pub const DNS1123_LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (an object name, the prefix of a qualified name).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Longest name part of a qualified name.
pub const QUALIFIED_NAME_MAX: usize = 63;
/// Longest label value.
pub const LABEL_VALUE_MAX: usize = 63;

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let ex: Vec<String> = examples.iter().map(|e| format!("'{e}'")).collect();
    format!(
        "{msg} (e.g. {}, regex used for validation is '{fmt}')",
        ex.join(", or ")
    )
}

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, also the non-empty form of a label value.
fn is_qualified_token(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            alnum(f)
                && alnum(l)
                && b.iter()
                    .all(|&c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_dns_label_token(s: &str) -> bool {
    let b = s.as_bytes();
    let lower_alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            lower_alnum(f) && lower_alnum(l) && b.iter().all(|&c| lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// A DNS-1123 label (namespace names): at most 63 lowercase alphanumerics or '-', alphanumeric at
/// both ends.
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        out.push(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    if !is_dns_label_token(s) {
        out.push(regex_error(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    out
}

/// A DNS-1123 subdomain (object names, qualified-name prefixes): at most 253 characters, dot
/// separated DNS-1123 labels.
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        out.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    if !s.split('.').all(is_dns_label_token) {
        out.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    out
}

/// A qualified name (label, annotation and taint keys, `reportingController`): an optional
/// DNS-1123 subdomain prefix and `/`, then a name of at most 63 characters matching
/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
pub fn qualified_name(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                out.push("prefix part must be non-empty".to_string());
            } else {
                out.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            out.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return out;
        }
    };
    if name.is_empty() {
        out.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX {
        out.push(format!(
            "name part must be no more than {QUALIFIED_NAME_MAX} characters"
        ));
    }
    if !is_qualified_token(name) {
        out.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    out
}

/// A label value (also a taint value): empty, or at most 63 characters matching
/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
pub fn label_value(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > LABEL_VALUE_MAX {
        out.push(format!("must be no more than {LABEL_VALUE_MAX} characters"));
    }
    if !s.is_empty() && !is_qualified_token(s) {
        out.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    out
}

/// A taint effect the apiserver accepts.
pub fn taint_effect(s: &str) -> Vec<String> {
    match s {
        "NoSchedule" | "PreferNoSchedule" | "NoExecute" => Vec::new(),
        other => vec![format!(
            "Unsupported value: \"{other}\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""
        )],
    }
}

/// The problems joined into one sentence (`Ok` when there are none).
pub fn check(problems: Vec<String>) -> Result<(), String> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn full(re: &str) -> regex::Regex {
        regex::Regex::new(&format!("^(?:{re})$")).unwrap()
    }

    #[test]
    fn qualified_name_table() {
        let ok = [
            "a",
            "A",
            "1",
            "MyName",
            "my.name",
            "123-abc",
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "karpenter.sh/nodepool",
            "nodekeeper.io/controller",
            "last-migration-failure",
            "a_b",
            "x/a",
            &"a".repeat(63),
            &format!("{}/{}", "a".repeat(253), "b".repeat(63)),
        ];
        for k in ok {
            assert!(qualified_name(k).is_empty(), "{k}: {:?}", qualified_name(k));
        }
        let bad = [
            "",
            "-a",
            "a-",
            "_a",
            "a.",
            "a b",
            "a/b/c",
            "/a",
            "a/",
            "Example.com/a",
            "-ex.com/a",
            "ex..com/a",
            "ex_com/a",
            "über",
            &"a".repeat(64),
            &format!("{}/b", "a".repeat(254)),
        ];
        for k in bad {
            assert!(!qualified_name(k).is_empty(), "{k:?} passed");
        }
        assert_eq!(qualified_name("/a"), vec!["prefix part must be non-empty"]);
        assert_eq!(
            qualified_name(&"a".repeat(64)),
            vec!["name part must be no more than 63 characters"]
        );
    }

    #[test]
    fn label_value_table() {
        for v in [
            "",
            "a",
            "nodekeeper",
            "preemption",
            "a.b_c-d",
            &"z".repeat(63),
        ] {
            assert!(label_value(v).is_empty(), "{v}");
        }
        for v in ["-", "a-", ".a", "a/b", "a b", &"z".repeat(64)] {
            assert!(!label_value(v).is_empty(), "{v:?} passed");
        }
    }

    #[test]
    fn dns_names_table() {
        for v in ["default", "kube-system", "a", "1-2"] {
            assert!(dns1123_label(v).is_empty(), "{v}");
            assert!(dns1123_subdomain(v).is_empty(), "{v}");
        }
        assert!(dns1123_subdomain("a.b.c").is_empty());
        assert!(!dns1123_label("a.b").is_empty());
        for v in ["", "-a", "A", "a_b", "a..b", ".a", &"a".repeat(64)] {
            assert!(!dns1123_label(v).is_empty(), "{v:?} passed");
        }
        assert!(!dns1123_subdomain(&"a".repeat(254)).is_empty());
    }

    #[test]
    fn effects() {
        for e in ["NoSchedule", "PreferNoSchedule", "NoExecute"] {
            assert!(taint_effect(e).is_empty());
        }
        assert!(!taint_effect("noschedule").is_empty());
    }

    proptest! {
        // The hand-written checks agree with the apiserver's regular expressions.
        #[test]
        fn agrees_with_the_apiserver_regexes(s in "[-a-zA-Z0-9_./ ]{0,70}|[a-z0-9.-]{0,20}/[-A-Za-z0-9_.]{0,66}") {
            let name_re = full(QUALIFIED_NAME_FMT);
            let label_re = full(LABEL_VALUE_FMT);
            let dns_label_re = full(DNS1123_LABEL_FMT);
            let subdomain_re = full(DNS1123_SUBDOMAIN_FMT);
            let want_value = s.len() <= 63 && label_re.is_match(&s);
            prop_assert_eq!(label_value(&s).is_empty(), want_value);
            let want_label = s.len() <= 63 && dns_label_re.is_match(&s);
            prop_assert_eq!(dns1123_label(&s).is_empty(), want_label);
            let want_sub = s.len() <= 253 && subdomain_re.is_match(&s);
            prop_assert_eq!(dns1123_subdomain(&s).is_empty(), want_sub);
            let parts: Vec<&str> = s.split('/').collect();
            let want_qn = match parts.as_slice() {
                [n] => n.len() <= 63 && name_re.is_match(n),
                [p, n] => !p.is_empty() && p.len() <= 253 && subdomain_re.is_match(p)
                    && n.len() <= 63 && name_re.is_match(n),
                _ => false,
            };
            prop_assert_eq!(qualified_name(&s).is_empty(), want_qn, "{:?}", s);
        }
    }
}
