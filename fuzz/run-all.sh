#!/bin/sh
# Long fuzzing run of every target (needs nightly and cargo-fuzz; not part of CI).
#   fuzz/run-all.sh [SECONDS_PER_TARGET=180] [TARGET...]     (FUZZ_SKIP_BUILD=1: use the built binaries)
# New inputs go to fuzz/work/<target>/ (gitignored); the committed seeds in fuzz/corpus/<target>/
# are only read. Crashes land in fuzz/artifacts/<target>/; reproduce one with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/crash-...
# A summary line per target (executions, crashes) is printed at the end.
set -eu
cd "$(dirname "$0")/.."
secs=${1:-180}
[ $# -gt 0 ] && shift
targets=${*:-"config_toml imds_aws imds_azure imds_gcp imds_oci oci_event report_body report_handler crio_state"}
# Rust is memory-safe here (unsafe_code = deny): no sanitizer, which doubles the speed.
# The binaries are run directly: `cargo fuzz run` would rebuild nodekeeper whenever its build script
# reruns (in a git worktree `.git/HEAD` is no file, so it reruns on every cargo call).
[ -n "${FUZZ_SKIP_BUILD:-}" ] || cargo +nightly fuzz build -s none
bin=fuzz/target/x86_64-unknown-linux-gnu/release
summary=""
for t in $targets; do
    mkdir -p "fuzz/work/$t" "fuzz/artifacts/$t"
    log="fuzz/work/$t.log"
    set +e
    "$bin/$t" -artifact_prefix="fuzz/artifacts/$t/" "fuzz/work/$t" "fuzz/corpus/$t" \
        -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    crashes=$(find "fuzz/artifacts/$t" -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' \) | wc -l)
    cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+).*/\1/')
    summary="$summary$t: ${execs:-?} executions in ${secs}s, coverage ${cov:-?} edges, $crashes crash/oom/timeout files, exit $rc
"
done
printf '%s' "$summary"
