//! `cargo +nightly fuzz run imds_oci`: see nodekeeper::fuzzing::imds_oci and docs/reliability.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nodekeeper::fuzzing::imds_oci(data);
});
