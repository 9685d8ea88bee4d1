#!/usr/bin/env bash
# Coverage-guided fuzzing of xfmr's parsers with LLVM's libFuzzer, on stable Rust.
#
#   fuzz/run.sh [--runs N] [SECONDS] [TARGET...]     # default: 600 s per target, every target
#
# Builds the `fuzz_<target>` binaries (feature `libfuzzer`) with the instrumentation cargo-fuzz
# uses (SanitizerCoverage: inline 8-bit counters, PC table, comparison tracing; stable `-C`
# flags, no sanitizer runtime) into target/fuzz, then runs each target for SECONDS (or until
# it has tried N inputs, with --runs) from its kept corpus (fuzz/corpus/<target>), its local
# working corpus (target/fuzz/corpus/<target>, kept between runs on one machine) and its seeds
# (which the binary writes when asked, `xfmr_fuzz::init`), one input at most 10 s, 4 GiB at
# most in all. Then the inputs that add coverage are merged (libFuzzer's `-merge=1`, smallest
# first) and the repository keeps at most 256 KiB of them per target in fuzz/corpus/<target>. A crash is saved as
# target/fuzz/artifacts/<target>/crash-* and the script exits 1; replay it with
# `target/fuzz/x86_64-unknown-linux-gnu/release/fuzz_<target> FILE`. Each target's line of
# libFuzzer's final statistics (inputs tried, coverage) goes to target/fuzz/logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=-1
if [ "${1:-}" = "--runs" ]; then
  runs=$2
  shift 2
fi
seconds=${1:-600}
shift || true

triple=x86_64-unknown-linux-gnu
out=target/fuzz
# `--target` keeps the flags off build scripts and proc macros (as cargo-fuzz does).
RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks" \
  CARGO_INCREMENTAL=0 cargo build --release -q -p xfmr-fuzz --features libfuzzer \
  --bin 'fuzz_*' --target "$triple" --target-dir "$out"
bin=$out/$triple/release

if [ "$#" -eq 0 ]; then
  set -- $(cd "$bin" && ls fuzz_* | grep -v '\.d$' | sed 's/^fuzz_//')
fi
mkdir -p "$out/logs"
status=0
for t in "$@"; do
  [ -x "$bin/fuzz_$t" ] || { echo "fuzz/run.sh: no target $t" >&2; exit 2; }
  # The target's seeds (made from real files and requests) and its largest input.
  rm -rf "$out/seeds/$t"
  XFMR_FUZZ_SEEDS="$out/seeds/$t" XFMR_FUZZ_SEEDS_ONLY=1 "$bin/fuzz_$t" 2>/dev/null
  max_len=$(cat "$out/seeds/$t.max_len")
  mkdir -p "fuzz/corpus/$t" "$out/corpus/$t" "$out/artifacts/$t"
  echo "== $t: ${seconds} s (max_len $max_len)"
  set +e
  # New inputs go to the local working corpus (target/fuzz/corpus, kept between local runs).
  "$bin/fuzz_$t" "$out/corpus/$t" "fuzz/corpus/$t" "$out/seeds/$t" \
    -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=4096 \
    -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$out/artifacts/$t/" \
    > "$out/logs/$t.log" 2>&1
  code=$?
  set -e
  grep -E "^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|stat::peak_rss_mb)|(DONE|INITED) +cov: " \
    "$out/logs/$t.log" | tail -6
  if [ "$code" != 0 ]; then
    echo "fuzz/run.sh: $t stopped with $code; see $out/logs/$t.log and $out/artifacts/$t/" >&2
    status=1
  fi
  # The repository keeps the inputs that add coverage (libFuzzer's merge, smallest first),
  # at most 256 KiB of them per target; the seeds are made from code and not kept.
  rm -rf "$out/merged/$t"
  mkdir -p "$out/merged/$t"
  "$bin/fuzz_$t" -merge=1 "$out/merged/$t" "fuzz/corpus/$t" "$out/corpus/$t" \
    -max_len="$max_len" > "$out/logs/$t.merge.log" 2>&1 || true
  # Inputs that once crashed (`crash-*`, copied in by hand with their fix) always stay.
  rm -rf "$out/crashes/$t"
  mkdir -p "$out/crashes/$t"
  cp "fuzz/corpus/$t"/crash-* "$out/crashes/$t/" 2>/dev/null || true
  rm -rf "fuzz/corpus/$t"
  mkdir -p "fuzz/corpus/$t"
  cp "$out/crashes/$t"/* "fuzz/corpus/$t/" 2>/dev/null || true
  kept=0
  for f in $(ls -Sr "$out/merged/$t"); do
    size=$(stat -c %s "$out/merged/$t/$f")
    [ $((kept + size)) -le 262144 ] || break
    cp "$out/merged/$t/$f" "fuzz/corpus/$t/"
    kept=$((kept + size))
  done
  echo "kept: $(ls "fuzz/corpus/$t" | wc -l) of $(ls "$out/merged/$t" | wc -l) inputs that add coverage, $kept bytes, in fuzz/corpus/$t"
done
exit $status
