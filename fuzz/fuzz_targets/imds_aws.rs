//! `cargo +nightly fuzz run imds_aws`: see nodekeeper_core::fuzzing::imds_aws and docs/dev/reliability.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nodekeeper_core::fuzzing::imds_aws(data);
});
