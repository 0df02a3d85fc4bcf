//! `cargo +nightly fuzz run oci_event`: see nodekeeper_core::fuzzing::oci_event and docs/dev/reliability.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nodekeeper_core::fuzzing::oci_event(data);
});
