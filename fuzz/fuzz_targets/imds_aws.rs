//! `cargo +nightly fuzz run imds_aws`: see nodekeeper::fuzzing::imds_aws and docs/reliability.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nodekeeper::fuzzing::imds_aws(data);
});
