//! The `karpenter` provider's replacement NodeClaim (`twin_of`), a pure function: the old claim's
//! shape is copied (spec, NodePool, instance labels, hash annotations, owners), what belongs to the
//! old instance is not (its hostname, Karpenter's lifecycle marks, other annotations).

use kube::core::DynamicObject;
use nodekeeper_core::controller::act::provider::karpenter::{
    nodeclaim_resource, twin_of, CREATED_BY_REQUEST_ANNOTATION, DO_NOT_DISRUPT, REPLACES_LABEL,
};
use nodekeeper_core::controller::act::provider::ReplacementRequest;
use serde_json::json;

fn old_claim() -> DynamicObject {
    let mut o = DynamicObject::new("bench-46s79", &nodeclaim_resource());
    o.metadata = serde_json::from_value(json!({
        "name": "bench-46s79",
        "labels": {
            "karpenter.sh/nodepool": "bench",
            "node.kubernetes.io/instance-type": "c-2x-amd64-linux",
            "topology.kubernetes.io/zone": "test-zone-a",
            "team": "payments",
            // set on the claim by Karpenter's launch from the provider (KWOK: the claim's name)
            "kubernetes.io/hostname": "bench-46s79",
            "karpenter.sh/registered": "true",
            "karpenter.sh/initialized": "true",
        },
        "annotations": {
            "karpenter.sh/nodepool-hash": "123",
            "karpenter.sh/nodepool-hash-version": "v3",
            "karpenter.kwok.sh/kwok": "true",
        },
        "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "name": "bench", "uid": "u-1"}],
    }))
    .unwrap();
    o.data = json!({
        "spec": {"requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
                 "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}},
        "status": {"nodeName": "kwok-bench-46s79-x", "providerID": "kwok://kwok-bench-46s79-x"},
    });
    o
}

#[test]
fn the_twin_copies_the_shape_not_the_instance() {
    let req = ReplacementRequest::new("kwok-bench-46s79-x", "repair:Ready=False", "t0");
    let twin = twin_of(&old_claim(), "bench-46s79-nk0123456789", &req);
    let labels = twin.metadata.labels.clone().unwrap();
    for gone in [
        "kubernetes.io/hostname",
        "karpenter.sh/registered",
        "karpenter.sh/initialized",
    ] {
        assert!(!labels.contains_key(gone), "{gone} copied: {labels:?}");
    }
    for (k, v) in [
        ("karpenter.sh/nodepool", "bench"),
        ("node.kubernetes.io/instance-type", "c-2x-amd64-linux"),
        ("topology.kubernetes.io/zone", "test-zone-a"),
        ("team", "payments"),
        (REPLACES_LABEL, "kwok-bench-46s79-x"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
    }
    let annotations = twin.metadata.annotations.clone().unwrap();
    let mut keys: Vec<&str> = annotations.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "karpenter.sh/do-not-disrupt",
            "karpenter.sh/nodepool-hash",
            "karpenter.sh/nodepool-hash-version",
            CREATED_BY_REQUEST_ANNOTATION,
        ]
    );
    assert_eq!(annotations[DO_NOT_DISRUPT], "true");
    assert_eq!(annotations[CREATED_BY_REQUEST_ANNOTATION], req.request_id);
    assert_eq!(twin.data["spec"], old_claim().data["spec"]);
    assert!(
        twin.data.get("status").is_none(),
        "no status: {}",
        twin.data
    );
    assert_eq!(
        twin.metadata.owner_references,
        old_claim().metadata.owner_references
    );
    assert_eq!(
        twin.metadata.name.as_deref(),
        Some("bench-46s79-nk0123456789")
    );
}
