//! Policy configuration: both repair-policy forms (nodekeeper's and KPO's, incl. the exact
//! the values OKE + KPO users run), Karpenter budgets as users write them (NodePool examples), validation with
//! located diagnostics.

use std::time::Duration;

use crate::support::config::{errors, load};
use nodekeeper_core::controller::policy::budget::{GroupBudgets, Reason};
use nodekeeper_core::controller::policy::config::{
    parse_kpo_repair_policies, Budget, Quantity, RepairPolicy, RepairStep,
};
use nodekeeper_core::controller::policy::PolicyConfig;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/policy/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn ready_false_10m() -> RepairPolicy {
    RepairPolicy {
        condition_type: "Ready".into(),
        condition_status: "False".into(),
        toleration: Duration::from_secs(600),
        ..Default::default()
    }
}

#[test]
fn kpo_json_repair_policies_parse_as_is() {
    let p = parse_kpo_repair_policies(&fixture("kpo_repair_policies.json")).unwrap();
    assert_eq!(p, vec![ready_false_10m()]);
}

#[test]
fn kpo_helm_values_parse_as_is() {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Settings {
        repair_policies: Vec<RepairPolicy>,
    }
    #[derive(serde::Deserialize)]
    struct Disruption {
        budgets: Vec<Budget>,
    }
    #[derive(serde::Deserialize)]
    struct Pool {
        disruption: Disruption,
    }
    #[derive(serde::Deserialize)]
    struct Values {
        settings: Settings,
        nodepools: std::collections::BTreeMap<String, Pool>,
    }
    let v: Values = serde_yaml::from_str(&fixture("kpo_shared_values.yaml")).unwrap();
    assert_eq!(v.settings.repair_policies, vec![ready_false_10m()]);
    for name in ["shared-spot", "shared-on-demand"] {
        assert_eq!(
            v.nodepools[name].disruption.budgets,
            vec![Budget::always(Quantity::Count(1))]
        );
    }
}

#[test]
fn nodepool_budgets_parse_and_evaluate_in_utc() {
    #[derive(serde::Deserialize)]
    struct B {
        budgets: Vec<Budget>,
    }
    let b: B = serde_yaml::from_str(&fixture("nodepool_budgets.yaml")).unwrap();
    assert_eq!(b.budgets.len(), 3);
    assert_eq!(b.budgets[1].nodes, Quantity::Percent(5));
    assert_eq!(b.budgets[1].duration, Some(Duration::from_secs(14 * 3600)));
    let g = GroupBudgets::new(&b.budgets);
    let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().to_utc();
    // 40 nodes: 10% = 4, 5% = 2, 20% = 8; min over active budgets.
    assert_eq!(
        g.limit(Reason::Repair, 40, at("2026-11-30T02:00:00Z")).max,
        Some(2)
    );
    assert_eq!(
        g.limit(Reason::Repair, 40, at("2026-11-30T19:00:00Z")).max,
        Some(4)
    );
    assert_eq!(
        g.limit(Reason::Repair, 40, at("2026-11-30T16:00:00Z")).max,
        Some(4)
    );
    // 5% of 3 nodes rounds up to 1, as Karpenter does.
    assert_eq!(
        g.limit(Reason::Repair, 3, at("2026-11-30T02:00:00Z")).max,
        Some(1)
    );
}

#[test]
fn nodekeeper_form_loads_with_every_section() {
    let l = load(&fixture("nodekeeper_policy.toml")).unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    let p = l.config.policy();
    assert!(p.controller.dry_run);
    assert_eq!(p.repair.policy.len(), 2);
    assert_eq!(p.repair.policy[0], ready_false_10m());
    assert_eq!(
        p.repair.steps,
        vec![RepairStep::Drain, RepairStep::Reboot, RepairStep::Replace]
    );
    let spot = p.repair.for_group("shared-spot");
    assert_eq!(spot.policies, vec![ready_false_10m()]);
    assert_eq!(spot.max_unhealthy, Quantity::Count(1));
    assert_eq!(
        p.repair.for_group("other").max_unhealthy,
        Quantity::Percent(20)
    );
    let d = p.budgets.for_group("other");
    assert_eq!(d.len(), 2);
    assert_eq!(d[1].timezone.as_deref(), Some("Asia/Shanghai"));
    assert_eq!(d[1].reasons, vec!["repair".to_string()]);
    assert_eq!(
        p.budgets.for_group("shared-spot"),
        &[Budget::always(Quantity::Count(1))]
    );
}

#[test]
fn kpo_form_in_toml_loads() {
    let l = load(&fixture("kpo_policy.toml")).unwrap();
    assert_eq!(
        l.config.controller.repair.repair_policies,
        vec![ready_false_10m()]
    );
    assert_eq!(
        l.config.controller.repair.for_group("x").policies,
        vec![ready_false_10m()]
    );
    let l = load(
        "[[repair.policy]]\nconditionType = \"Ready\"\nconditionStatus = \"Unknown\"\ntolerationDuration = 300000000000\n",
    )
    .unwrap();
    assert_eq!(
        l.config.controller.repair.policy[0].toleration,
        Duration::from_secs(300)
    );
    assert_eq!(
        l.config.controller.repair.policy[0].condition_status,
        "Unknown"
    );
}

#[test]
fn defaults_match_karpenter_and_capi() {
    let p = PolicyConfig::default();
    assert_eq!(
        p.budgets.default,
        vec![Budget::always(Quantity::Percent(10))]
    );
    assert_eq!(p.repair.max_unhealthy, Quantity::Percent(20));
    assert_eq!(p.repair.startup_timeout, Duration::from_secs(600));
    assert!(!p.controller.dry_run);
    assert!(p.validate().is_empty(), "{:?}", p.validate());
}

#[test]
fn semantic_errors_are_located() {
    let text = "[budgets]\nbudgets = [\n  { nodes = \"1\", schedule = \"0 9 * * 1-5\", duration = \"14h\", timezone = \"Asia/Shang\" },\n  { nodes = \"1\", schedule = \"0 9 * *\", duration = \"1h\" },\n  { nodes = \"2\", schedule = \"@daily\" },\n  { nodes = \"1\", reasons = [\"repiar\"] },\n]\n\n[[repair.policy]]\ncondition_type = \"Ready\"\ncondition_status = \"false\"\ntoleration = \"10m\"\n";
    let e = errors(text);
    assert_eq!(e.len(), 5, "{e:#?}");
    let has =
        |prefix: &str, word: &str| e.iter().any(|l| l.starts_with(prefix) && l.contains(word));
    assert!(has("c.toml:3:", "Asia/Shang"), "{e:#?}");
    assert!(has("c.toml:3:", "budgets.budgets[0].timezone"), "{e:#?}");
    assert!(has("c.toml:4:", "5"), "{e:#?}");
    assert!(has("c.toml:5:", "duration"), "{e:#?}");
    assert!(has("c.toml:6:", "repiar"), "{e:#?}");
    assert!(
        has("c.toml:11:20", "`false` is not a condition status"),
        "{e:#?}"
    );
}

#[test]
fn toleration_forms_are_exclusive_and_required() {
    let both = "[[repair.policy]]\ncondition_type = \"Ready\"\ncondition_status = \"False\"\ntoleration = \"10m\"\ntolerationDuration = 1\n";
    let e = errors(both);
    assert!(e[0].contains("not both"), "{e:?}");
    let none = "[[repair.policy]]\ncondition_type = \"Ready\"\ncondition_status = \"False\"\n";
    let e = errors(none);
    assert!(e[0].contains("missing `toleration`"), "{e:?}");
    let bad = "[repair]\nmax_unhealthy = \"150%\"\n";
    let e = errors(bad);
    assert!(e[0].contains("0–100%"), "{e:?}");
}

#[test]
fn karpenter_reasons_warn_and_steps_must_escalate() {
    let l = load("[budgets]\nbudgets = [{ nodes = \"0\", reasons = [\"Drifted\"] }]\n").unwrap();
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    assert!(l.warnings[0].message.contains("never applies"));
    assert_eq!(l.warnings[0].location.map(|l| l.0), Some(2));
    // Karpenter v1.15's `Unhealthy` is its repair: read as nodekeeper's, no warning.
    let l = load("[budgets]\nbudgets = [{ nodes = \"0\", reasons = [\"Unhealthy\"] }]\n").unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    let b = nodekeeper_core::controller::policy::budget::CompiledBudget::new(
        0,
        &l.config.policy().budgets.default[0],
    );
    assert!(b.applies_to(nodekeeper_core::controller::policy::budget::Reason::Repair));
    assert!(!b.applies_to(nodekeeper_core::controller::policy::budget::Reason::Rebalance));
    let e = errors("[repair]\nsteps = [\"replace\", \"drain\"]\n");
    assert!(
        e[0].starts_with("c.toml:2:") && e[0].contains("escalate"),
        "{e:?}"
    );
}

#[test]
fn printed_config_round_trips_with_policy() {
    let l = load(&fixture("nodekeeper_policy.toml")).unwrap();
    let again = load(&l.config.to_redacted_toml()).unwrap();
    assert_eq!(again.config, l.config);
}

mod never_panics {
    use nodekeeper_core::controller::policy::budget::Window;
    use proptest::prelude::*;

    proptest! {
        // proptest's default 256 cases (`PROPTEST_CASES` for more), as every property of the pure tier.
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// User-written schedules and zones are errors, never panics.
        #[test]
        fn window_parse_never_panics(
            fields in proptest::collection::vec("([0-9*/,A-Za-z-]{1,6}|é{1,3}|@[a-z]{1,8})", 0..8),
            tz in "[A-Za-z/_é]{0,20}",
            secs in 0u64..10_000_000,
        ) {
            let expr = fields.join(" ");
            let at = chrono::DateTime::from_timestamp(1_790_000_000, 0).unwrap();
            if let Ok(w) = Window::parse(&expr, std::time::Duration::from_secs(secs), &tz) {
                let _ = w.is_active(at);
                let _ = w.boundaries(at, chrono::Duration::days(1));
            }
        }
    }
}

/// Keys and values the API server checks (qualified names, label values, namespace names) are
/// checked by `validate`, located, instead of failing every write at runtime with a 422.
#[test]
fn kubernetes_names_are_checked_where_they_are_written() {
    let text = "[interruption]\n\
        taint_key = \"nodekeeper.io/Bad Key\"\n\
        taint_effect = \"NoExecute\"\n\
        lb_exclude_label = \"-exclude\"\n\
        \n\
        [budgets]\n\
        group_by = \"a/b/c\"\n\
        \n\
        [budgets.groups]\n\
        \"spot pool\" = [{ nodes = \"1\" }]\n\
        \n\
        [controller]\n\
        insecure_plain_http = true\n\
        namespace = \"Nodekeeper\"\n\
        label_removal_allow = [\"last-migration-failure\", \"example.com/\"]\n\
        \n\
        [[labels.cleanup]]\n\
        label = \"example.com/last_migration-\"\n\
        when_pod_ready = { namespace = \"kube_system\", selector = \"k8s-app=cilium\" }\n";
    let e = errors(text);
    let has = |prefix: &str, words: &[&str]| {
        e.iter()
            .any(|l| l.starts_with(prefix) && words.iter().all(|w| l.contains(w)))
    };
    assert!(
        has(
            "c.toml:2:",
            &[
                "`nodekeeper.io/Bad Key` is not a valid taint key",
                "name part",
                "[interruption.taint_key]"
            ]
        ),
        "{e:#?}"
    );
    assert!(
        has(
            "c.toml:3:",
            &[
                "NoExecute is not allowed",
                "deletes every pod",
                "PodDisruptionBudgets",
                "NoSchedule"
            ]
        ),
        "{e:#?}"
    );
    assert!(has("c.toml:4:", &["`-exclude`", "label key"]), "{e:#?}");
    assert!(
        has("c.toml:7:", &["`a/b/c`", "[budgets.group_by]"]),
        "{e:#?}"
    );
    assert!(has("c.toml:10:", &["`spot pool`", "group name"]), "{e:#?}");
    assert!(
        has("c.toml:14:", &["`Nodekeeper`", "namespace name"]),
        "{e:#?}"
    );
    assert!(
        has(
            "c.toml:15:",
            &[
                "`example.com/`",
                "name part must be non-empty",
                "label_removal_allow[1]"
            ]
        ),
        "{e:#?}"
    );
    assert!(
        has("c.toml:18:", &["`example.com/last_migration-`"]),
        "{e:#?}"
    );
    assert!(
        has("c.toml:19:", &["`kube_system`", "namespace name"]),
        "{e:#?}"
    );
    assert_eq!(e.len(), 9, "{e:#?}");

    // The defaults, and what good configs use, pass; so do the values nodekeeper writes itself.
    let ok = "[interruption]\ntaint_effect = \"PreferNoSchedule\"\nlb_exclude_label = \"\"\n\
        [budgets]\ngroup_by = \"node.kubernetes.io/instance-type\"\n[budgets.groups]\n\"\" = [{ nodes = \"1\" }]\n\"shared-spot\" = [{ nodes = \"2\" }]\n";
    let l = load(ok).unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    use nodekeeper_core::agent::sources::EventKind as K;
    for k in [
        K::Preemption,
        K::Termination,
        K::Maintenance,
        K::Rebalance,
        K::Reboot,
        K::Redeploy,
        K::Freeze,
        K::ShuttingDown,
        K::Cancelled { of: "x".into() },
    ] {
        assert!(
            nodekeeper_core::k8s::validation::label_value(k.name()).is_empty(),
            "taint value {}",
            k.name()
        );
    }
    for key in nodekeeper_core::controller::policy::view::keys::ALL {
        assert!(
            nodekeeper_core::k8s::validation::qualified_name(key).is_empty(),
            "annotation {key}"
        );
    }
}

#[test]
fn policy_reason_and_ladder_forms_load_and_errors_are_located() {
    let text = "[[repair.policy]]\ncondition_type = \"Ready\"\ncondition_status = \"False\"\ntoleration = \"5m\"\nreason = \"ContainerRuntime(Down|NotReady)\"\nsteps = [{ step = \"restart-unit\", unit = \"kubelet.service\", timeout = \"3m\" }, \"restart-unit:crio.service\", \"reboot\", \"replace\"]\n";
    let l = load(text).unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    let p = &l.config.policy().repair.policy[0];
    let r = p.reason.as_ref().unwrap();
    assert!(r.matches("ContainerRuntimeDown") && !r.matches("xContainerRuntimeDown"));
    let steps = p.steps.as_ref().unwrap();
    assert_eq!(steps[0].timeout, Some(Duration::from_secs(180)));
    assert_eq!(steps[1].label(), "restart-unit:crio.service");
    assert_eq!(steps[3].step, RepairStep::Replace);
    // Printed and read again, the same.
    let again = load(&l.config.to_redacted_toml()).unwrap();
    assert_eq!(again.config, l.config);

    let policy = |extra: &str| {
        format!("[[repair.policy]]\ncondition_type = \"Ready\"\ncondition_status = \"False\"\ntoleration = \"5m\"\n{extra}\n")
    };
    let e = errors(&policy("reason = \"Kubelet(\""));
    assert!(
        e[0].starts_with("c.toml:")
            && e[0].contains("reason `Kubelet(` is not a regular expression"),
        "{e:?}"
    );
    let e = errors(&policy("steps = [\"restart-unit\"]"));
    assert!(e[0].contains("restart-unit needs its unit"), "{e:?}");
    let e = errors(&policy("steps = [\"restart-unit:kubelet\"]"));
    assert!(e[0].contains("not a systemd service name"), "{e:?}");
    let e = errors(&policy(
        "steps = [\"reboot\", \"restart-unit:kubelet.service\"]",
    ));
    assert!(
        e[0].starts_with("c.toml:5:")
            && e[0].contains("repair.policy[0].steps")
            && e[0].contains("escalate"),
        "{e:?}"
    );
    let e = errors(&policy("steps = []"));
    assert!(e[0].contains("cannot be empty"), "{e:?}");
    let e = errors("[repair]\nsteps = [\"restart-unit\", \"replace\"]\n");
    assert!(e[0].contains("restart-unit names its unit"), "{e:?}");
    // Another component's condition with a destructive step: a warning naming the policy.
    let l = load("[[repair.policy]]\ncondition_type = \"KernelDeadlock\"\ncondition_status = \"True\"\ntoleration = \"5m\"\n").unwrap();
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    assert!(
        l.warnings[0].message.contains("cannot see it clear"),
        "{:?}",
        l.warnings
    );
    let l = load("[[repair.policy]]\ncondition_type = \"KernelDeadlock\"\ncondition_status = \"True\"\ntoleration = \"5m\"\nallow_destructive = true\n").unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    // KPO's JSON, unchanged: no reason, no steps (the global ladder).
    let kpo = parse_kpo_repair_policies(
        r#"[{"conditionType":"Ready","conditionStatus":"False","tolerationDuration":600000000000}]"#,
    )
    .unwrap();
    assert_eq!(kpo, vec![ready_false_10m()]);
}

#[test]
fn the_ladder_examples_of_docs_policy_md_load_without_warnings() {
    let doc =
        std::fs::read_to_string(format!("{}/docs/policy.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let section = doc
        .split("### Policies per (condition, reason), and escalation ladders")
        .nth(1)
        .unwrap();
    let blocks: Vec<&str> = section
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .take_while(|b| b.contains("[[repair.policy]]"))
        .collect();
    assert_eq!(blocks.len(), 2, "the AKS-like and the EKS-like examples");
    for b in blocks {
        let l = load(b).unwrap_or_else(|e| panic!("{e}\n{b}"));
        assert!(l.warnings.is_empty(), "{:?}\n{b}", l.warnings);
        assert!(!l.config.policy().repair.policy.is_empty());
    }
}

#[test]
fn the_agents_restart_allow_list_defaults_to_kubelet_and_crio_and_is_checked() {
    let l = load("").unwrap();
    assert_eq!(
        l.config.agent.agent.restart_units,
        vec!["kubelet.service".to_string(), "crio.service".to_string()]
    );
    let l = load("[agent]\nrestart_units = [\"containerd.service\"]\n").unwrap();
    assert_eq!(
        l.config.agent.agent.restart_units,
        vec!["containerd.service".to_string()]
    );
    let e = errors("[agent]\nrestart_units = [\"kubelet.service\", \"../etc/passwd\"]\n");
    assert!(
        e[0].starts_with("c.toml:2:") && e[0].contains("agent.restart_units[1]"),
        "{e:?}"
    );
}
