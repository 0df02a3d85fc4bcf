//! The shipped RBAC, decided by the real authorizer: SubjectAccessReviews for the two ServiceAccounts
//! over every row of the API-call inventory (tests/fixtures/api-calls.toml, which tests/host/manifests.rs
//! keeps in step with the code), then over every verb of every resource the inventory names (and a few
//! it must never touch), in the cluster scope and three namespaces: what is allowed is exactly what
//! some inventory row needs.

use std::collections::BTreeSet;

use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
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
    let _grants = SHIPPED_GRANTS.lock().await;
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

/// The FlowSchema and priority level kube-apiserver's API Priority and Fairness ran a request at,
/// by name: the response's `X-Kubernetes-PF-FlowSchema-UID` and `-PriorityLevel-UID` headers,
/// looked up among the cluster's objects (set whatever the answer, 404 included).
async fn flow(
    admin: &kube::Client,
    client: &kube::Client,
    method: &str,
    uri: &str,
    body: Option<serde_json::Value>,
) -> (String, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(match body {
            Some(b) => kube::client::Body::from(serde_json::to_vec(&b).unwrap()),
            None => kube::client::Body::empty(),
        })
        .unwrap();
    let resp = client.send(req).await.expect(uri);
    let header = |h: &str| {
        resp.headers()
            .get(h)
            .unwrap_or_else(|| panic!("{uri}: no {h} in {:?}", resp.headers()))
            .to_str()
            .unwrap()
            .to_string()
    };
    let (schema_uid, level_uid) = (
        header("x-kubernetes-pf-flowschema-uid"),
        header("x-kubernetes-pf-prioritylevel-uid"),
    );
    let schemas: kube::Api<FlowSchema> = kube::Api::all(admin.clone());
    let levels: kube::Api<PriorityLevelConfiguration> = kube::Api::all(admin.clone());
    let name_of = |items: Vec<kube::core::ObjectMeta>, uid: &str| {
        items
            .into_iter()
            .find(|m| m.uid.as_deref() == Some(uid))
            .and_then(|m| m.name)
            .unwrap_or_else(|| panic!("{uri}: nothing with uid {uid}"))
    };
    let all_schemas = schemas.list(&Default::default()).await.unwrap().items;
    let all_levels = levels.list(&Default::default()).await.unwrap().items;
    (
        name_of(
            all_schemas.into_iter().map(|f| f.metadata).collect(),
            &schema_uid,
        ),
        name_of(
            all_levels.into_iter().map(|l| l.metadata).collect(),
            &level_uid,
        ),
    )
}

/// The shipped FlowSchemas as kube-apiserver applies them: the controller's Lease at
/// `leader-election`; at `workload-high` its reports' calls and the rest each in a flow of their
/// own; its drains' calls (evictions, pod and PodDisruptionBudget reads) at the shipped
/// `nodekeeper-drains` level; and the agent (no FlowSchema of ours) still at `workload-low` with
/// every other ServiceAccount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_requests_run_at_its_own_priority_levels() {
    init_tracing();
    let c = cluster();
    let admin = c.admin().await;
    let ctl = controller_client(c).await;
    let lease =
        format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/nodekeeper-controller");
    let agent_token = sa_token(&admin, NS, "nodekeeper-agent", None, None).await;
    let agent = c.client_with_token(&agent_token).await;
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": "not-a-token", "audiences": ["nodekeeper"]}});
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "no-such-pod", "namespace": "default"}});
    let got = [
        flow(&admin, &ctl, "GET", &lease, None).await,
        flow(&admin, &ctl, "GET", "/api/v1/nodes?limit=1", None).await,
        flow(&admin, &ctl, "GET", "/api/v1/pods?limit=1", None).await,
        flow(
            &admin,
            &ctl,
            "GET",
            "/apis/policy/v1/poddisruptionbudgets?limit=1",
            None,
        )
        .await,
        flow(
            &admin,
            &ctl,
            "GET",
            &format!("/api/v1/namespaces/{NS}/pods?limit=1"),
            None,
        )
        .await,
        flow(
            &admin,
            &ctl,
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            Some(review),
        )
        .await,
        flow(
            &admin,
            &ctl,
            "GET",
            &format!("/api/v1/namespaces/{NS}/pods/no-such-pod"),
            None,
        )
        .await,
        flow(
            &admin,
            &ctl,
            "POST",
            "/api/v1/namespaces/default/pods/no-such-pod/eviction",
            Some(eviction),
        )
        .await,
        flow(&admin, &agent, "GET", "/api/v1/nodes?limit=1", None).await,
    ];
    let want = [
        ("nodekeeper-controller-leader-election", "leader-election"),
        ("nodekeeper-controller", "workload-high"),
        ("nodekeeper-controller-drains", "nodekeeper-drains"),
        ("nodekeeper-controller-drains", "nodekeeper-drains"),
        ("nodekeeper-controller-reports", "workload-high"),
        ("nodekeeper-controller-reports", "workload-high"),
        ("nodekeeper-controller-reports", "workload-high"),
        ("nodekeeper-controller-drains", "nodekeeper-drains"),
        ("service-accounts", "workload-low"),
    ];
    let got: Vec<(&str, &str)> = got.iter().map(|(f, l)| (f.as_str(), l.as_str())).collect();
    assert_eq!(got, want);
}
