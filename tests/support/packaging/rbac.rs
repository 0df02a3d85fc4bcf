//! The API-call inventory (tests/fixtures/api-calls.toml) and a small RBAC evaluator over the
//! rendered Roles, ClusterRoles and their bindings, with kube-apiserver's matching rules
//! (`k8s.io/kubernetes/pkg/apis/rbac/v1/evaluation_helpers.go`: verb, API group, then resource,
//! where `resource/subresource` must be named as such; a RoleBinding grants only in its namespace).

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef, Subject};
use serde::Deserialize;

use super::{repo, All};

/// One row of the inventory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    pub identity: Vec<String>,
    pub site: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    pub scope: String,
    /// `false`: the shipped RBAC must deny this call (it is optional and off by default).
    #[serde(default = "yes")]
    pub granted: bool,
    #[serde(default)]
    pub note: String,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Inventory {
    call: Vec<Call>,
}

pub const IDENTITIES: [&str; 5] = ["controller", "agent", "cli", "demo", "sim"];
const SCOPES: [&str; 3] = ["cluster", "any-namespace", "release-namespace"];
const VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "patch", "update", "delete",
];

/// The inventory, checked for well-formed rows.
pub fn inventory() -> Vec<Call> {
    let path = repo().join("tests/fixtures/api-calls.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let inv: Inventory = toml::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    for c in &inv.call {
        assert!(!c.identity.is_empty(), "{c:?}: no identity");
        for i in &c.identity {
            assert!(IDENTITIES.contains(&i.as_str()), "{c:?}: identity {i}");
        }
        assert!(VERBS.contains(&c.verb.as_str()), "{c:?}: verb");
        assert!(
            SCOPES.contains(&c.scope.as_str()) || is_namespace_name(&c.scope),
            "{c:?}: scope"
        );
        assert!(c.site.contains("::"), "{c:?}: site is FILE::FUNCTION");
        assert!(
            c.granted || !c.note.is_empty(),
            "{c:?}: say why it is not granted"
        );
    }
    inv.call
}

fn is_namespace_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The service account an inventory identity runs as (None: a person, or the sim).
pub fn service_account(identity: &str) -> Option<&'static str> {
    match identity {
        "controller" => Some("nodekeeper-controller"),
        "agent" => Some("nodekeeper-agent"),
        _ => None,
    }
}

/// Where a request goes: a cluster-wide request, or one namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Cluster-scoped resources, and namespaced ones across all namespaces.
    Cluster,
    /// One object in whatever namespace it lives in: allowed only by a grant valid everywhere.
    AnyNamespace,
    Namespace(String),
}

impl Call {
    /// The row's scope, with `release-namespace` resolved to `release_ns`.
    pub fn scope_in(&self, release_ns: &str) -> Scope {
        match self.scope.as_str() {
            "cluster" => Scope::Cluster,
            "any-namespace" => Scope::AnyNamespace,
            "release-namespace" => Scope::Namespace(release_ns.to_string()),
            ns => Scope::Namespace(ns.to_string()),
        }
    }

    pub fn made_by(&self, identity: &str) -> bool {
        self.identity.iter().any(|i| i == identity)
    }

    /// `group/resource[/subresource]:verb@scope`, for messages.
    pub fn label(&self) -> String {
        format!(
            "{}/{}{}:{}@{} ({})",
            self.group,
            self.resource,
            if self.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", self.subresource)
            },
            self.verb,
            self.scope,
            self.site
        )
    }

    /// The file part of `site`.
    pub fn file(&self) -> &str {
        self.site.split("::").next().unwrap()
    }

    /// The function (last path segment) of `site`.
    pub fn function(&self) -> &str {
        self.site.rsplit("::").next().unwrap()
    }
}

/// Where a bound rule applies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Where {
    /// Bound by a ClusterRoleBinding: every namespace and cluster-scoped resources.
    Everywhere,
    /// Bound by a RoleBinding: namespaced resources of that namespace only.
    Namespace(String),
}

/// A rule bound to a subject, with the binding that brings it.
#[derive(Debug, Clone)]
pub struct Bound {
    pub rule: PolicyRule,
    pub scope: Where,
    pub via: String,
}

fn names_sa(subjects: Option<&Vec<Subject>>, ns: &str, name: &str) -> bool {
    subjects
        .into_iter()
        .flatten()
        .any(|s| s.kind == "ServiceAccount" && s.name == name && s.namespace.as_deref() == Some(ns))
}

fn role_rules(a: &All, role_ref: &RoleRef, binding_ns: Option<&str>) -> Vec<PolicyRule> {
    assert_eq!(role_ref.api_group, "rbac.authorization.k8s.io");
    let rules = match (role_ref.kind.as_str(), binding_ns) {
        ("ClusterRole", _) => a
            .cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(role_ref.name.as_str()))
            .map(|r| r.rules.clone().unwrap_or_default()),
        ("Role", Some(ns)) => a
            .roles
            .iter()
            .find(|r| {
                r.metadata.name.as_deref() == Some(role_ref.name.as_str())
                    && r.metadata.namespace.as_deref() == Some(ns)
            })
            .map(|r| r.rules.clone().unwrap_or_default()),
        (kind, _) => panic!("binding to {kind} {}", role_ref.name),
    };
    rules.unwrap_or_else(|| panic!("a binding refers to a missing {role_ref:?}"))
}

/// Every rule bound to service account `ns/name` by the ClusterRoleBindings and RoleBindings in `a`.
pub fn bound_rules(a: &All, ns: &str, name: &str) -> Vec<Bound> {
    let mut out = Vec::new();
    for b in &a.crbs {
        if names_sa(b.subjects.as_ref(), ns, name) {
            for rule in role_rules(a, &b.role_ref, None) {
                out.push(Bound {
                    rule,
                    scope: Where::Everywhere,
                    via: format!("ClusterRoleBinding {}", b.metadata.name.as_deref().unwrap()),
                });
            }
        }
    }
    for b in &a.rbs {
        let bns = b
            .metadata
            .namespace
            .as_deref()
            .expect("RoleBinding namespace");
        if names_sa(b.subjects.as_ref(), ns, name) {
            for rule in role_rules(a, &b.role_ref, Some(bns)) {
                out.push(Bound {
                    rule,
                    scope: Where::Namespace(bns.to_string()),
                    via: format!("RoleBinding {bns}/{}", b.metadata.name.as_deref().unwrap()),
                });
            }
        }
    }
    out
}

/// A resource request, as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub scope: Scope,
}

impl Request {
    pub fn of(c: &Call, release_ns: &str) -> Self {
        Request {
            verb: c.verb.clone(),
            group: c.group.clone(),
            resource: c.resource.clone(),
            subresource: c.subresource.clone(),
            scope: c.scope_in(release_ns),
        }
    }

    fn combined(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// Whether `rule` matches the request's verb, group and resource (as RBAC's `RuleAllows`;
/// a rule with resourceNames never matches: these requests carry no name the rule could list).
pub fn rule_matches(rule: &PolicyRule, r: &Request) -> bool {
    let verb = rule.verbs.iter().any(|v| v == "*" || *v == r.verb);
    let group = rule
        .api_groups
        .iter()
        .flatten()
        .any(|g| g == "*" || *g == r.group);
    let combined = r.combined();
    let resource = rule.resources.iter().flatten().any(|res| {
        res == "*"
            || *res == combined
            || (!r.subresource.is_empty() && *res == format!("*/{}", r.subresource))
    });
    let named = rule.resource_names.as_ref().is_some_and(|n| !n.is_empty());
    verb && group && resource && !named
}

/// Whether a rule bound at `at` covers a request to `scope`.
pub fn applies(at: &Where, scope: &Scope) -> bool {
    match (at, scope) {
        (Where::Everywhere, _) => true,
        (Where::Namespace(b), Scope::Namespace(n)) => b == n,
        (Where::Namespace(_), _) => false,
    }
}

/// The bindings that allow `r` (empty: denied).
pub fn allowed_by(bound: &[Bound], r: &Request) -> Vec<String> {
    bound
        .iter()
        .filter(|b| applies(&b.scope, &r.scope) && rule_matches(&b.rule, r))
        .map(|b| b.via.clone())
        .collect()
}

/// One granted permission: where, group, `resource[/subresource]`, verb.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Atom {
    pub at: Where,
    pub group: String,
    pub resource: String,
    pub verb: String,
}

/// The bound rules split into atoms; wildcards, resourceNames and non-resource URLs fail.
pub fn atoms(bound: &[Bound]) -> BTreeSet<Atom> {
    let mut out = BTreeSet::new();
    for b in bound {
        let r = &b.rule;
        assert!(r.non_resource_urls.is_none(), "{}: {r:?}", b.via);
        assert!(r.resource_names.is_none(), "{}: {r:?}", b.via);
        for group in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for verb in &r.verbs {
                    assert!(
                        group != "*" && !res.contains('*') && verb != "*",
                        "{}: wildcard in {r:?}",
                        b.via
                    );
                    out.insert(Atom {
                        at: b.scope.clone(),
                        group: group.clone(),
                        resource: res.clone(),
                        verb: verb.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Whether request `r` needs `atom`: same verb, group, resource, and the atom is the narrowest
/// place that serves it (a grant valid everywhere for a call into one namespace is too wide).
pub fn uses(r: &Request, atom: &Atom) -> bool {
    let scope_ok = match (&atom.at, &r.scope) {
        (Where::Everywhere, Scope::Cluster | Scope::AnyNamespace) => true,
        (Where::Namespace(a), Scope::Namespace(n)) => a == n,
        _ => false,
    };
    scope_ok && atom.verb == r.verb && atom.group == r.group && atom.resource == r.combined()
}

/// The RBAC in `a` (installed in `release_ns`) against the inventory, for the controller and the
/// agent (empty lists: exact).
#[derive(Debug, Default)]
pub struct Check {
    /// Inventory rows the bound rules do not allow.
    pub missing: Vec<String>,
    /// Rows marked `granted = false` that the bound rules allow.
    pub unexpected: Vec<String>,
    /// Bound permissions no row uses (or granted wider than any row needs).
    pub unused: Vec<String>,
}

pub fn check(a: &All, release_ns: &str, calls: &[Call]) -> Check {
    let mut out = Check::default();
    for identity in ["controller", "agent"] {
        let sa = service_account(identity).unwrap();
        let bound = bound_rules(a, release_ns, sa);
        assert!(!bound.is_empty(), "no rule bound to {release_ns}/{sa}");
        let rows: Vec<&Call> = calls.iter().filter(|c| c.made_by(identity)).collect();
        for c in &rows {
            let by = allowed_by(&bound, &Request::of(c, release_ns));
            match (c.granted, by.is_empty()) {
                (true, true) => out.missing.push(format!("{identity}: {}", c.label())),
                (false, false) => out
                    .unexpected
                    .push(format!("{identity}: {} (by {by:?})", c.label())),
                _ => {}
            }
        }
        for atom in atoms(&bound) {
            let used = rows
                .iter()
                .filter(|c| c.granted)
                .any(|c| uses(&Request::of(c, release_ns), &atom));
            if !used {
                out.unused.push(format!("{identity}: {atom:?}"));
            }
        }
    }
    out
}

/// Every subject of every binding in `a`, as `namespace/name`: only the two service accounts may
/// be bound (a binding to anyone else would escape the inventory check).
pub fn subjects(a: &All) -> BTreeSet<String> {
    let crbs = a.crbs.iter().flat_map(|b| b.subjects.iter().flatten());
    let rbs = a.rbs.iter().flat_map(|b| b.subjects.iter().flatten());
    crbs.chain(rbs)
        .map(|s| {
            assert_eq!(s.kind, "ServiceAccount", "{s:?}");
            format!("{}/{}", s.namespace.as_deref().unwrap_or(""), s.name)
        })
        .collect()
}

/// The workspace's source directories: the binary, the product library, the stand-ins.
pub const SOURCE_DIRS: [&str; 3] = ["src", "crates/core/src", "crates/sim/src"];

/// Files under `dir` (recursively) with the `.rs` extension, relative to the repository.
pub fn rust_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(repo()).unwrap();
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

/// Constructs that make (or set up) Kubernetes API calls with kube-rs.
pub fn api_call_pattern() -> regex::Regex {
    regex::Regex::new(
        r"\bApi::(<[^>]*>::)?(all|namespaced|default_namespaced|all_with|namespaced_with|default_namespaced_with)\b|\bApi<|\bwatcher\(|\bmetadata_watcher\(|\breflector\(|\.request::<",
    )
    .unwrap()
}

/// Roles and ClusterRoles no binding refers to (their rules would escape the inventory check).
pub fn unbound_roles(a: &All) -> Vec<String> {
    let refs: BTreeSet<(String, String, String)> = a
        .crbs
        .iter()
        .map(|b| {
            (
                b.role_ref.kind.clone(),
                String::new(),
                b.role_ref.name.clone(),
            )
        })
        .chain(a.rbs.iter().map(|b| {
            let ns = match b.role_ref.kind.as_str() {
                "Role" => b.metadata.namespace.clone().unwrap_or_default(),
                _ => String::new(),
            };
            (b.role_ref.kind.clone(), ns, b.role_ref.name.clone())
        }))
        .collect();
    let cluster = a.cluster_roles.iter().map(|r| {
        (
            "ClusterRole".to_string(),
            String::new(),
            r.metadata.name.clone().unwrap_or_default(),
        )
    });
    let ns = a.roles.iter().map(|r| {
        (
            "Role".to_string(),
            r.metadata.namespace.clone().unwrap_or_default(),
            r.metadata.name.clone().unwrap_or_default(),
        )
    });
    cluster
        .chain(ns)
        .filter(|k| !refs.contains(k))
        .map(|(kind, ns, name)| format!("{kind} {ns}/{name}"))
        .collect()
}
