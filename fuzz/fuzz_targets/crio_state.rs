//! `cargo +nightly fuzz run crio_state`: see nodekeeper_core::fuzzing::crio_state and docs/dev/reliability.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nodekeeper_core::fuzzing::crio_state(data);
});
