//! The layering rules of docs/dev/architecture.md that the compiler does not enforce: the wire
//! schema (`crates/core/src/wire/`) and the configuration engine (`crates/core/src/config/`) are
//! leaves that import nothing from `agent` or `controller` (the file that composes the sections is
//! `config_file.rs`), and the pure policy (`crates/core/src/controller/policy/`) imports nothing
//! from `agent`. Inside `controller/`, the layers' arrows point one way (below).

use std::path::{Path, PathBuf};

use regex::Regex;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each `crate::` path in `code` (comment lines left out) that reaches one of the `forbidden`
/// top-level modules; a grouped `use crate::{…}` counts as well.
fn offending(code: &str, forbidden: &[&str]) -> Vec<String> {
    let names = forbidden.join("|");
    let direct = Regex::new(&format!(r"\bcrate::({names})\b")).unwrap();
    let grouped = Regex::new(&format!(r"\bcrate::\{{[^}}]*\b({names})\b")).unwrap();
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    direct
        .find_iter(&code)
        .chain(grouped.find_iter(&code))
        .map(|m| m.as_str().to_string())
        .collect()
}

/// [`offending`] over every file under `crates/core/src/<dir>` (or that one file), as `file: path`.
fn imports_of(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/core/src")
        .join(dir);
    let mut files = Vec::new();
    if root.is_file() {
        files.push(root.clone());
    } else {
        rust_files(&root, &mut files);
    }
    assert!(!files.is_empty(), "no Rust files under {}", root.display());
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for m in offending(&text, forbidden) {
            found.push(format!("{}: {m}", file.display()));
        }
    }
    found
}

#[test]
fn the_wire_schema_imports_neither_the_agent_nor_the_controller() {
    let found = imports_of("wire", &["agent", "controller"]);
    assert!(found.is_empty(), "wire/ must stay a leaf: {found:#?}");
}

#[test]
fn the_configuration_engine_imports_neither_the_agent_nor_the_controller() {
    let found = imports_of("config", &["agent", "controller"]);
    assert!(found.is_empty(), "config/ is the engine only: {found:#?}");
}

#[test]
fn the_policy_imports_no_agent_module() {
    let found = imports_of("controller/policy", &["agent"]);
    assert!(
        found.is_empty(),
        "the pure policy must not import the agent: {found:#?}"
    );
}

/// The controller's layers, lowest first: a layer's code names no layer above it (doc links
/// may). `config.rs` composes the sections of all of them and `status/` is the CLI's view over
/// the Nodes, so neither is ranked.
const CONTROLLER_LAYERS: [&[&str]; 6] = [
    &["policy", "catalog", "clock", "metrics"],
    &["cluster"],
    &["state"],
    &["act"],
    &["engine"],
    &["api"],
];

#[test]
fn the_controller_layers_import_only_downwards() {
    let mut found = Vec::new();
    // The top layer has nothing above it.
    for (i, layer) in CONTROLLER_LAYERS[..CONTROLLER_LAYERS.len() - 1]
        .iter()
        .enumerate()
    {
        let above: Vec<String> = CONTROLLER_LAYERS[i + 1..]
            .iter()
            .flat_map(|l| l.iter().map(|m| format!("controller::{m}")))
            .collect();
        let above: Vec<&str> = above.iter().map(String::as_str).collect();
        for m in *layer {
            let path = ["controller/", m].concat();
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("crates/core/src")
                .join(&path);
            let path = if dir.is_dir() {
                path
            } else {
                format!("{path}.rs")
            };
            found.extend(imports_of(&path, &above));
        }
    }
    assert!(
        found.is_empty(),
        "a controller layer imports one above it (docs/dev/architecture.md): {found:#?}"
    );
}

/// The scan itself: it sees a direct path and a grouped `use`, and skips comments.
#[test]
fn the_scan_finds_direct_and_grouped_imports_outside_comments() {
    let both = ["agent", "controller"];
    assert_eq!(
        offending("use crate::agent::sources::NodeEvent;", &both).len(),
        1
    );
    assert_eq!(
        offending("use crate::{\n    text,\n    agent::checks,\n};", &both).len(),
        1
    );
    assert!(offending(
        "/// see [`crate::agent::state`]\nuse crate::agents_x;",
        &both
    )
    .is_empty());
    assert!(offending("use crate::{text, wire};", &both).is_empty());
}
