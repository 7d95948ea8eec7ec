#!/usr/bin/env bash
# Runs parascope's libFuzzer targets (test/fuzz/README.md) and prints one result line per target.
#
#   run.sh --fuzz-dir <build>/fuzz --seconds N [--mode short|long] TARGET...
#
# TARGET is proc, perf_map, elf or cfi (binary <fuzz-dir>/bin/fuzz_TARGET). Inputs: the working
# corpus, then the committed seeds (test/fuzz/corpus/TARGET), the build-time seeds
# (<fuzz-dir>/seeds/TARGET) and the saved crashes (test/fixtures/fuzz/TARGET), which libFuzzer runs
# before mutating. Everything written (corpus, crash artifacts, log) stays under
# <fuzz-dir>/run/<mode>/TARGET: the short mode (ctest's "fuzz:TARGET") starts from a fresh corpus
# each time; the long mode (make fuzz) keeps growing its corpus across runs.
# Exit status: 0 when every target ran clean, 1 when one crashed, leaked, timed out or hit an OOM
# (its log tail and the saved input are printed).
set -uo pipefail

src_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fuzz_dir=""
seconds=15
mode=short
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fuzz-dir) fuzz_dir="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ -z "$fuzz_dir" ] || [ "${#targets[@]}" -eq 0 ]; then
  echo "usage: run.sh --fuzz-dir <build>/fuzz --seconds N [--mode short|long] TARGET..." >&2
  exit 2
fi
case "$mode" in short|long) ;; *) echo "run.sh: --mode short or long" >&2; exit 2 ;; esac
fuzz_dir="$(cd "$fuzz_dir" && pwd)" || exit 2

# Final stats libFuzzer prints with -print_final_stats=1 ("stat::name: value").
final_stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }

failed=0
summary=()
for t in "${targets[@]}"; do
  bin="$fuzz_dir/bin/fuzz_$t"
  work="$fuzz_dir/run/$mode/$t"
  if [ ! -x "$bin" ]; then
    echo "run.sh: $bin not built (make build)" >&2
    failed=1
    summary+=("fuzz:$t: NOT BUILT")
    continue
  fi
  [ "$mode" = short ] && rm -rf "$work/corpus"
  mkdir -p "$work/corpus" "$work/artifacts"
  inputs=("$work/corpus")
  for d in "$src_dir/test/fuzz/corpus/$t" "$fuzz_dir/seeds/$t" "$src_dir/test/fixtures/fuzz/$t"; do
    [ -d "$d" ] && inputs+=("$d")
  done
  dict=()
  [ -f "$src_dir/test/fuzz/dict/$t.dict" ] && dict=("-dict=$src_dir/test/fuzz/dict/$t.dict")
  log="$work/log"
  echo "fuzz:$t: ${seconds}s ($mode) from ${inputs[*]}"
  # -timeout: one input taking longer is a hang; -rss_limit_mb: a parser allocating without bound.
  # ASAN_OPTIONS: leaks are reported; no core files under the build tree.
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:disable_coredump=1}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${dict[@]}" "${inputs[@]}" \
      >"$log" 2>&1
  rc=$?
  execs="$(final_stat number_of_executed_units "$log")"
  rate="$(final_stat average_exec_per_sec "$log")"
  done_line="$(grep -E '^#[0-9]+[[:space:]]+(DONE|INITED)' "$log" | tail -1)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")"
  corp="$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$done_line")"
  if [ "$rc" -eq 0 ]; then
    line="fuzz:$t: ok, ${execs:-?} execs, ${rate:-?} exec/s, cov ${cov:-?}, corpus ${corp:-?}"
  else
    failed=1
    artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
    line="fuzz:$t: FAILED (exit $rc) after ${execs:-?} execs; input: ${artifact:-none saved}; log: $log"
    echo "---- last lines of $log ----"
    tail -n 60 "$log"
    echo "----"
    if [ -n "$artifact" ]; then
      echo "reproduce: $bin $artifact"
      echo "keep it as a regression input: cp $artifact $src_dir/test/fixtures/fuzz/$t/"
    fi
  fi
  echo "$line"
  summary+=("$line")
done
if [ "${#targets[@]}" -gt 1 ]; then
  echo "==== fuzz results ($mode, ${seconds}s per target) ===="
  printf '%s\n' "${summary[@]}"
fi
exit "$failed"
