#!/usr/bin/env bash
# Fuzzes the Thrift edge with cargo fuzz (libFuzzer), each target for its share of the
# time, and prints per target the runs, the corpus size and the coverage reached.
#
#   bash scripts/fuzz.sh [SECONDS]   (default 60: the short pass the test suite runs)
#
# Targets (integration/fuzz/fuzz_targets/): wire_decoder (the frame detector and
# splitter), theader (THeader headers and transforms), http_head (HTTP on the Thrift
# port), rpc_message (every method's arguments decoded and served), wire_session (a
# connection's bytes end to end). The corpora start from a valid call of every method in
# every transport (examples/fuzz_seeds.rs) and grow in .run/fuzz/corpus across runs; a
# crash leaves its input in .run/fuzz/artifacts/TARGET and fails the script.
#
# Up to 120 s the targets are built unoptimized and without a sanitizer (2.4 min to build
# here instead of 7.7: the suite's short pass); longer runs build them optimized with
# AddressSanitizer. FOQS_FUZZ_BUILD=dev or release chooses.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
seconds=${1:-60}
case "$seconds" in
  '' | *[!0-9]*) echo "usage: bash scripts/fuzz.sh [SECONDS]" >&2; exit 2 ;;
esac
targets=(wire_decoder theader http_head rpc_message wire_session)
each=$((seconds / ${#targets[@]}))
[ "$each" -ge 1 ] || each=1
foqs_cargo_check
command -v cargo-fuzz >/dev/null 2>&1 || {
  foqs_log "installing cargo-fuzz from crates.io"
  cargo install cargo-fuzz --locked --quiet
}
# cargo fuzz passes the sanitizer and coverage flags of a nightly compiler; the stable one
# takes them when told to (no second toolchain to install).
export RUSTC_BOOTSTRAP=1
work="$FOQS_RUN/fuzz"
mkdir -p "$work/corpus" "$work/artifacts"
cargo run -q --example fuzz_seeds -- "$work/seeds"
build=${FOQS_FUZZ_BUILD:-$([ "$seconds" -le 120 ] && echo dev || echo release)}
case "$build" in
  dev) flags=(--dev --sanitizer none) ;;
  release) flags=(-O) ;;
  *) echo "FOQS_FUZZ_BUILD is dev or release" >&2; exit 2 ;;
esac
foqs_log "building the fuzz targets ($build: ${flags[*]})"
cargo fuzz build "${flags[@]}" --fuzz-dir integration/fuzz >"$work/build.log" 2>&1 ||
  { tail -n 30 "$work/build.log" >&2; foqs_log "cargo fuzz build failed (log: $work/build.log)"; exit 1; }
failed=0
printf '%-14s %8s %10s %8s %8s\n' target seconds runs corpus cov
for t in "${targets[@]}"; do
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
  log="$work/$t.log"
  if ! cargo fuzz run "${flags[@]}" --fuzz-dir integration/fuzz "$t" "$work/corpus/$t" "$work/seeds/$t" -- \
    -max_total_time="$each" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$work/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1; then
    failed=1
    tail -n 40 "$log" >&2
    foqs_log "$t: failed; its input is in $work/artifacts/$t/ (log: $log)"
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(find "$work/corpus/$t" -type f | wc -l)
  printf '%-14s %8s %10s %8s %8s\n' "$t" "$each" "${runs:-?}" "$corpus" "${cov:-?}"
done
if [ "$failed" = 0 ]; then
  echo "fuzz: ${#targets[@]} passed, 0 failed"
else
  echo "fuzz: a target failed"
  exit 1
fi
