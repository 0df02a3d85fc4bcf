//! `nodekeeper demo`: bad input is refused with the file and line named (exit 2).

use std::process::Command;

fn demo(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .arg("demo")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn broken_scenario_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("scenario.toml");
    std::fs::write(&f, "[[pools]]\nname = \"spot\"\ncount = \"three\"\n").unwrap();
    let (code, err) = demo(&["--scenario", f.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("scenario.toml"), "{err}");
    assert!(err.contains("line 3"), "{err}");
}

#[test]
fn broken_controller_config_is_located() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("controller.toml");
    std::fs::write(&f, "[budgets]\nbudgets = [{ nodes = \"1\", schedule = \"0 9 * * 1-5\", duration = \"1h\", timezone = \"Mars/Olympus\" }]\n").unwrap();
    let (code, err) = demo(&["--controller-config", f.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("controller.toml:2:"), "{err}");
}

#[test]
fn speed_below_one_is_refused() {
    let (code, err) = demo(&["--speed", "0.5"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--speed"), "{err}");
}
