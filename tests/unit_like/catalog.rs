//! docs/catalog.md lists exactly the catalogs of the code: the Event reasons with their types
//! (`controller::catalog::Reason`), the `NodekeeperHeld` condition's reasons and the condition
//! types nodekeeper writes; and no reason of the catalog is spelled as a string literal outside
//! it. (The CLI's exit codes are checked in `src/cli/exit.rs`: the binary has no library.)

use std::path::Path;

use nodekeeper_core::agent::checks::{Checks, ChecksConfig};
use nodekeeper_core::controller::catalog::{
    Reason, DRAINED, DRAIN_CONDITION_REASONS, DRAIN_IN_PROGRESS,
    GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS, HELD_CONDITION, MAINTENANCE_IN_PROGRESS,
    MAINTENANCE_PLANNED, NOTICE_CONDITION_REASONS,
};

fn doc(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs")
            .join(name),
    )
    .unwrap()
}

/// The cells of the rows of the table whose header row starts with `header`.
fn table(text: &str, header: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut lines = text.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table {header:?}");
    for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cells = line.split('|').map(|c| c.trim().to_string());
        rows.push(cells.skip(1).collect());
    }
    rows
}

/// `` `A`, `B` `` → `[A, B]`.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_docs_list_exactly_the_event_reasons_with_their_types() {
    let rows: Vec<(String, String)> =
        table(&doc("catalog.md"), "| reason | type | action | when |")
            .into_iter()
            // `*check reason*`: the agent's own reasons, not the catalog's.
            .filter(|r| r[0].starts_with('`'))
            .map(|r| (r[0].trim_matches('`').to_string(), r[1].clone()))
            .collect();
    let want: Vec<(String, String)> = Reason::ALL
        .iter()
        .map(|r| {
            let types: Vec<&str> = r.event_types().iter().map(|t| t.as_str()).collect();
            (r.as_str().to_string(), types.join(", "))
        })
        .collect();
    assert_eq!(rows, want, "docs/catalog.md's reason table vs Reason::ALL");
}

#[test]
fn the_docs_list_exactly_the_held_condition_reasons() {
    let rows = table(&doc("catalog.md"), "| item | stable contract |");
    let held = rows
        .iter()
        .find(|r| r[0] == "`held.reason`")
        .expect("a `held.reason` row");
    let want: Vec<&str> = Reason::HELD.iter().map(|r| r.as_str()).collect();
    // "the `NodekeeperHeld` condition reasons: `BlockedByPDB`, ..."
    let (_, listed) = held[1].split_once(':').unwrap();
    assert_eq!(ticked(listed), want, "docs/catalog.md `held.reason`");
    let by_kind = table(&doc("policy.md"), "| kind | condition/Event reason |");
    let reasons: Vec<String> = by_kind.iter().map(|r| ticked(&r[1])[0].clone()).collect();
    assert_eq!(reasons, want, "docs/policy.md's blocker kinds");
    let fields = table(&doc("status.md"), "| field | type | meaning |");
    let held = fields
        .iter()
        .find(|r| r[0] == "`.held`")
        .expect("a `.held` row");
    let named: Vec<String> = ticked(&held[2])
        .into_iter()
        .filter(|t| Reason::ALL.iter().any(|r| r.as_str() == t))
        .collect();
    assert_eq!(named, want, "docs/status.md `.held`");
}

/// The catalog is the only place a reason is spelled: every other file names a `Reason`.
#[test]
fn no_reason_is_a_string_literal_outside_the_catalog() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/core/src");
    let mut found = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("controller/catalog.rs")
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // The product code: a file's unit tests may spell what they expect.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for r in Reason::ALL {
                if code.contains(&format!("\"{}\"", r.as_str())) {
                    found.push(format!(
                        "{}: {r}",
                        path.strip_prefix(&root).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "reason literals outside the catalog: {found:?}"
    );
}

/// The condition types of the checks of the default `[checks]`, with the off-by-default runtime
/// check on (the shipped manifests turn it on), sorted.
fn default_check_types() -> Vec<String> {
    let mut cfg = ChecksConfig::default();
    cfg.runtime.enabled = true;
    let mut types = Checks::from_config(&cfg).condition_types();
    types.sort();
    types
}

#[test]
fn the_docs_list_exactly_the_condition_types() {
    let checks = default_check_types();
    let mut want = checks.clone();
    want.push(HELD_CONDITION.to_string());
    want.extend([DRAIN_IN_PROGRESS, DRAINED].map(String::from));
    want.extend(NOTICE_CONDITIONS.map(String::from));
    want.sort();
    let mut rows: Vec<String> = table(
        &doc("catalog.md"),
        "| condition type | written by | reasons |",
    )
    .into_iter()
    .map(|r| r[0].trim_matches('`').to_string())
    .collect();
    rows.sort();
    assert_eq!(rows, want, "docs/catalog.md's condition types");
    let mut listed: Vec<String> = table(&doc("checks.md"), "| check | file | reads | conditions |")
        .iter()
        .flat_map(|r| ticked(&r[3]))
        .filter(|t| t.starts_with("Nodekeeper"))
        .collect();
    listed.sort();
    assert_eq!(listed, checks, "docs/checks.md's checks table");
}

/// The lifecycle conditions that follow notices.
const NOTICE_CONDITIONS: [&str; 3] = [
    MAINTENANCE_PLANNED,
    MAINTENANCE_IN_PROGRESS,
    GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS,
];

/// The reasons docs/catalog.md lists in the rows of `types`, sorted, once each.
fn listed_reasons(types: &[&str]) -> Vec<String> {
    let rows = table(
        &doc("catalog.md"),
        "| condition type | written by | reasons |",
    );
    let mut listed: Vec<String> = rows
        .iter()
        .filter(|r| types.contains(&r[0].trim_matches('`')))
        .flat_map(|r| ticked(&r[2]))
        .collect();
    listed.sort();
    listed.dedup();
    listed
}

/// The lifecycle conditions' rows name exactly the reasons the controller writes.
#[test]
fn the_docs_list_exactly_the_drain_condition_reasons() {
    let mut want: Vec<String> = DRAIN_CONDITION_REASONS.map(String::from).to_vec();
    want.sort();
    assert_eq!(
        listed_reasons(&[DRAIN_IN_PROGRESS, DRAINED]),
        want,
        "docs/catalog.md's DrainInProgress and Drained reasons"
    );
    let mut want: Vec<String> = NOTICE_CONDITION_REASONS.map(String::from).to_vec();
    want.sort();
    assert_eq!(
        listed_reasons(&NOTICE_CONDITIONS),
        want,
        "docs/catalog.md's maintenance and shutdown condition reasons"
    );
}
