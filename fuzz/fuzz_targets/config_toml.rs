//! `cargo +nightly fuzz run config_toml`: see nodekeeper_core::fuzzing::config_toml and docs/dev/reliability.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nodekeeper_core::fuzzing::config_toml(data);
});
