//! `cargo +nightly fuzz run report_handler`: see nodekeeper_core::fuzzing::report_handler and docs/dev/reliability.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nodekeeper_core::fuzzing::report_handler(data);
});
