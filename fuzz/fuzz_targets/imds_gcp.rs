//! `cargo +nightly fuzz run imds_gcp`: see nodekeeper_core::fuzzing::imds_gcp and docs/dev/reliability.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nodekeeper_core::fuzzing::imds_gcp(data);
});
