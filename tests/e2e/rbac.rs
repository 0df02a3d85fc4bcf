//! The shipped RBAC, decided by the real authorizer: SubjectAccessReviews for the two ServiceAccounts
//! over every row of the API-call inventory (tests/fixtures/api-calls.toml, which tests/unit_like/manifests.rs
//! keeps in step with the code), then over every verb of every resource the inventory names (and a few
//! it must never touch), in the cluster scope and three namespaces: what is allowed is exactly what
//! some inventory row needs.

use std::collections::BTreeSet;

use serde_json::json;

use crate::packaging_support::rbac::{inventory, service_account, Call};
use crate::support::*;

const VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];
/// Namespaces asked about: "" (cluster-wide), the release namespace, `default`, an application's.
const NAMESPACES: [&str; 4] = ["", NS, "default", "some-app"];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Attr {
    verb: String,
    group: String,
    resource: String,
    subresource: String,
    namespace: String,
}

async fn allowed(admin: &kube::Client, sa: &str, a: &Attr) -> bool {
    let body = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:{NS}:{sa}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NS}"), "system:authenticated"],
            "resourceAttributes": {
                "verb": a.verb, "group": a.group, "resource": a.resource,
                "subresource": a.subresource, "namespace": a.namespace
            }
        }
    });
    let req = http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    let v: serde_json::Value = admin.request(req).await.expect("SubjectAccessReview");
    v["status"]["allowed"].as_bool().unwrap_or(false)
}

/// The namespace a row's call goes to, for the review of that row.
fn namespace_of(c: &Call) -> String {
    match c.scope.as_str() {
        "cluster" => String::new(),
        "any-namespace" => "some-app".into(),
        "release-namespace" => NS.into(),
        ns => ns.into(),
    }
}

/// Whether a granted row of `identity` needs `a` allowed.
fn needed(calls: &[Call], identity: &str, a: &Attr) -> bool {
    calls
        .iter()
        .filter(|c| c.made_by(identity) && c.granted)
        .any(|c| {
            c.verb == a.verb
                && c.group == a.group
                && c.resource == a.resource
                && c.subresource == a.subresource
                && match c.scope.as_str() {
                    // A cluster-wide grant of a namespaced resource holds in every namespace too.
                    "cluster" | "any-namespace" => true,
                    "release-namespace" => a.namespace == NS,
                    ns => a.namespace == ns,
                }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_authorizer_allows_exactly_the_calls_the_code_makes() {
    init_tracing();
    let c = cluster();
    let admin = c.admin().await;
    let calls = inventory();
    let mut wrong = Vec::new();

    // 1. Every row, as its identity: allowed when granted, denied when not.
    for call in &calls {
        for identity in &call.identity {
            let Some(sa) = service_account(identity) else {
                continue;
            };
            let a = Attr {
                verb: call.verb.clone(),
                group: call.group.clone(),
                resource: call.resource.clone(),
                subresource: call.subresource.clone(),
                namespace: namespace_of(call),
            };
            if allowed(&admin, sa, &a).await != call.granted {
                wrong.push(format!(
                    "{identity}: {} (granted = {})",
                    call.label(),
                    call.granted
                ));
            }
        }
    }

    // 2. Everything else about the same resources (and some that must stay out of reach): allowed
    //    only where a row needs it.
    let mut resources: BTreeSet<(String, String, String)> = calls
        .iter()
        .map(|c| (c.group.clone(), c.resource.clone(), c.subresource.clone()))
        .collect();
    for (g, r) in [
        ("", "secrets"),
        ("", "configmaps"),
        ("apps", "deployments"),
        ("", "serviceaccounts"),
    ] {
        resources.insert((g.into(), r.into(), String::new()));
    }
    resources.insert((String::new(), "serviceaccounts".into(), "token".into()));
    let mut reviews = 0;
    for identity in ["controller", "agent"] {
        let sa = service_account(identity).unwrap();
        for (group, resource, subresource) in &resources {
            for verb in VERBS {
                for ns in NAMESPACES {
                    let a = Attr {
                        verb: verb.into(),
                        group: group.clone(),
                        resource: resource.clone(),
                        subresource: subresource.clone(),
                        namespace: ns.into(),
                    };
                    reviews += 1;
                    if allowed(&admin, sa, &a).await && !needed(&calls, identity, &a) {
                        wrong.push(format!("{identity}: allowed but no call needs it: {a:?}"));
                    }
                }
            }
        }
    }
    eprintln!(
        "{} inventory rows and {reviews} further SubjectAccessReviews",
        calls.len()
    );
    assert!(
        wrong.is_empty(),
        "the real authorizer disagrees with the inventory:\n{}",
        wrong.join("\n")
    );
}
