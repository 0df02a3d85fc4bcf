//! Property tests for the four clouds' metadata parsers and the notice tracker: no input makes
//! them panic, errors are typed and bounded, and valid documents parse to what they say.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use nodekeeper_core::agent::sources::{
    aws, azure, gcp, oci, parse_time, Cloud, EventKind, Notice, NoticeTracker, ParseError,
};
use proptest::prelude::*;

/// Error texts never carry more than a bounded slice of the input.
fn bounded(e: &ParseError) -> bool {
    match e {
        ParseError::Value { value, .. } | ParseError::Time { value, .. } => {
            value.chars().count() <= 81
        }
        ParseError::Json { message, .. } => message.chars().count() <= 201,
        ParseError::Utf8 { .. } => true,
    }
}

fn all_parsers(body: &[u8]) -> Vec<Result<usize, ParseError>> {
    let mut fields: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for k in gcp::IDENTITY_KEYS {
        fields.insert(k, body.to_vec());
    }
    vec![
        aws::parse_spot_action(body).map(|n| n.len()),
        aws::parse_rebalance(body).map(|n| n.len()),
        aws::parse_scheduled(body).map(|n| n.len()),
        aws::parse_identity(body, Some(body)).map(|_| 1),
        azure::parse_scheduled_events(body, Some("vm")).map(|(_, n)| n.len()),
        azure::parse_identity(body).map(|_| 1),
        gcp::parse_preempted(body).map(|n| n.len()),
        gcp::parse_maintenance_event(body).map(|n| n.len()),
        gcp::parse_identity(&fields).map(|_| 1),
        oci::parse_identity(body).map(|_| 1),
        oci::parse_signal(body, &EventKind::Preemption).map(|n| n.len()),
    ]
}

/// JSON values with the field names the parsers look for, and hostile values in them.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let keys = prop::sample::select(vec![
        "action",
        "time",
        "noticeTime",
        "Code",
        "EventId",
        "NotBefore",
        "NotAfter",
        "State",
        "Description",
        "DocumentIncarnation",
        "Events",
        "EventType",
        "Resources",
        "EventStatus",
        "DurationInSeconds",
        "instanceId",
        "region",
        "availabilityZone",
        "id",
        "metadata",
        "oke-is-preemptible",
        "timeCreated",
        "vmId",
        "priority",
        "availabilityDomain",
        "timeWindowStart",
        "notBefore",
    ]);
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        ".{0,300}".prop_map(serde_json::Value::from),
        prop::sample::select(vec![
            "terminate",
            "stop",
            "hibernate",
            "2017-09-18T08:22:00Z",
            "21 Jan 2019 09:00:43 GMT",
            "Mon, 19 Sep 2016 18:29:47 GMT",
            "Preempt",
            "Reboot",
            "Freeze",
            "active",
            "canceled",
            "system-reboot",
            "true",
            "false",
            "TRUE",
            "Spot",
            "vm",
        ])
        .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 48, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(keys.clone(), inner, 0..8).prop_map(|m| {
                serde_json::Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

fn timestamp() -> impl Strategy<Value = DateTime<Utc>> {
    (0i64..4_102_444_800).prop_map(|s| DateTime::from_timestamp(s, 0).unwrap())
}

// proptest's default 256 cases (`PROPTEST_CASES` for more), as every property of the pure tier.
proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        for r in all_parsers(&body) {
            if let Err(e) = r {
                prop_assert!(bounded(&e), "{e}");
            }
        }
        let _ = parse_time("t", &String::from_utf8_lossy(&body));
    }

    #[test]
    fn hostile_json_never_panics(v in json_value()) {
        let body = serde_json::to_vec(&v).unwrap();
        for r in all_parsers(&body) {
            if let Err(e) = r {
                prop_assert!(bounded(&e), "{e}");
            }
        }
        let arr = serde_json::to_vec(&serde_json::Value::Array(vec![v.clone(), v])).unwrap();
        let _ = aws::parse_scheduled(&arr);
    }

    #[test]
    fn long_values_are_truncated_in_errors(s in "[a-z]{100,300}") {
        let e = gcp::parse_preempted(s.as_bytes()).unwrap_err();
        prop_assert!(bounded(&e));
        let body = serde_json::json!({"action": s, "time": "2017-09-18T08:22:00Z"}).to_string();
        let is_value_error = matches!(aws::parse_spot_action(body.as_bytes()), Err(ParseError::Value { .. }));
        prop_assert!(is_value_error, "a long bad action is a Value error");
    }

    #[test]
    fn valid_spot_notices_parse_to_their_time(action in prop::sample::select(vec!["terminate", "stop", "hibernate"]), t in timestamp()) {
        let body = serde_json::json!({"action": action, "time": t.format("%Y-%m-%dT%H:%M:%SZ").to_string()}).to_string();
        let n = aws::parse_spot_action(body.as_bytes()).unwrap();
        prop_assert_eq!(n.len(), 1);
        prop_assert_eq!(n[0].deadline, Some(t));
        prop_assert_eq!(&n[0].detail["action"], action);
    }

    #[test]
    fn valid_azure_documents_keep_every_event(
        incarnation in any::<u64>(),
        events in prop::collection::vec((prop::sample::select(vec!["Preempt", "Terminate", "Reboot", "Redeploy", "Freeze"]), "[a-f0-9-]{8,36}", timestamp()), 0..6),
    ) {
        let list: Vec<_> = events.iter().map(|(ty, id, t)| serde_json::json!({
            "EventId": id, "EventType": ty, "ResourceType": "VirtualMachine", "Resources": ["vm"],
            "EventStatus": "Scheduled", "NotBefore": t.format("%a, %d %b %Y %H:%M:%S GMT").to_string(),
            "EventSource": "Platform", "DurationInSeconds": -1,
        })).collect();
        let body = serde_json::json!({"DocumentIncarnation": incarnation, "Events": list}).to_string();
        let (inc, notices) = azure::parse_scheduled_events(body.as_bytes(), Some("vm")).unwrap();
        prop_assert_eq!(inc, incarnation);
        prop_assert_eq!(notices.len(), events.len());
        for (n, (_, id, t)) in notices.iter().zip(&events) {
            prop_assert_eq!(&n.key, id);
            prop_assert_eq!(n.not_before, Some(*t));
        }
        let (_, others) = azure::parse_scheduled_events(body.as_bytes(), Some("another-vm")).unwrap();
        prop_assert!(others.is_empty());
    }

    /// Over any sequence of observed sets: one event per appearance, one cancellation per
    /// disappearance, and ids are a function of the notice.
    #[test]
    fn tracker_emits_once_per_appearance_and_disappearance(steps in prop::collection::vec(prop::collection::btree_set(0u8..6, 0..6), 1..20)) {
        let mut t = NoticeTracker::new(Some(Cloud::Gcp));
        let mut prev: BTreeSet<u8> = BTreeSet::new();
        let mut ids: BTreeMap<u8, String> = BTreeMap::new();
        for set in steps {
            let notices = set.iter().map(|k| Notice::new(k.to_string(), EventKind::Maintenance)).collect();
            let events = t.observe("c", notices, Utc::now());
            let appeared = set.difference(&prev).count();
            let gone = prev.difference(&set).count();
            let new: Vec<_> = events.iter().filter(|e| e.kind == EventKind::Maintenance).collect();
            let cancelled = events.iter().filter(|e| matches!(e.kind, EventKind::Cancelled { .. })).count();
            prop_assert_eq!(new.len(), appeared);
            prop_assert_eq!(cancelled, gone);
            for e in new {
                let key: u8 = set.iter().copied().find(|k| !prev.contains(k) && ids.get(k).is_none_or(|id| id == &e.id)).unwrap();
                let id = ids.entry(key).or_insert_with(|| e.id.clone());
                prop_assert_eq!(&*id, &e.id, "same notice, same id");
            }
            prev = set;
        }
    }
}
