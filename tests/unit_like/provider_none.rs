//! The `none` provider never replaces; the recording fake launches once per request id.
#![allow(clippy::unwrap_used)]

use nodekeeper_core::controller::act::provider::fake::FakeProvider;
use nodekeeper_core::controller::act::provider::none::NoReplacement;
use nodekeeper_core::controller::act::provider::{request_id, NodeProvider, ReplacementRequest};

#[tokio::test]
async fn none_never_reports_a_replacement() {
    let p = NoReplacement;
    let req = ReplacementRequest::new("n1", "repair", "e1");
    let t = p.request_replacement(&req).await.unwrap();
    assert_eq!(t.provider, "none");
    assert_eq!(t.node, "n1");
    for _ in 0..3 {
        assert_eq!(p.replacement_ready(&t).await.unwrap(), None);
    }
}

#[test]
fn request_ids_are_deterministic_and_distinct() {
    let a = request_id("n1", "repair", "e1");
    assert_eq!(a, request_id("n1", "repair", "e1"));
    assert_eq!(a, ReplacementRequest::new("n1", "repair", "e1").request_id);
    assert!(a.starts_with("nk-") && a.len() == 27, "{a}");
    assert_ne!(a, request_id("n1", "repair", "e2"));
    assert_ne!(a, request_id("n1", "interruption", "e1"));
    assert_ne!(a, request_id("n2", "repair", "e1"));
    // Length-prefixed: shifting characters between fields changes the id.
    assert_ne!(request_id("ab", "c", "e"), request_id("a", "bc", "e"));
}

#[tokio::test]
async fn fake_records_and_launches_once_per_id() {
    let p = FakeProvider::new();
    let r1 = ReplacementRequest::new("n1", "repair", "e1");
    let r2 = ReplacementRequest::new("n2", "repair", "e1");
    let t1 = p.request_replacement(&r1).await.unwrap();
    assert_eq!(p.request_replacement(&r1).await.unwrap(), t1);
    p.request_replacement(&r2).await.unwrap();
    assert_eq!(p.requests().len(), 3);
    assert_eq!(p.launched(), 2);
    assert_eq!(p.replacement_ready(&t1).await.unwrap(), None);
    p.make_ready(&r1.request_id, "n1-new");
    assert_eq!(
        p.replacement_ready(&t1).await.unwrap().as_deref(),
        Some("n1-new")
    );
    p.fail_next("quota");
    let err = p
        .request_replacement(&ReplacementRequest::new("n3", "repair", "e1"))
        .await
        .unwrap_err();
    assert!(
        err.is_permanent() && err.to_string().contains("quota"),
        "{err}"
    );
    assert_eq!(p.launched(), 2);
}
