#!/usr/bin/env bash
# The one-call GPU suite: the GPU model's calls measured launch by launch, compiled-Triton
# correctness on CUDA, the microbenchmark grid, the end-to-end benchmark (bench/e2e.py, when
# present) and the CPU test suite, most valuable first, all inside one time budget. Results go to
# $OUT (8 files at most, no sub-folders); a summary table is printed last.
#
#   OUT=/path bash bench/gpu_suite.sh     # on the GPU machine (9 minutes: run it with a 600 s limit)
#   bash bench/gpu_suite.sh --dry-run     # rehearsal on CPU with tiny shapes (same as CPU_SMOKE=1)
#
# Environment: OUT (default: a new folder in /tmp), PYTHON (default python3), SUITE_BUDGET_S (540:
# under a 10-minute call with a margin; on a fresh machine compiling the kernels takes minutes),
# BUILD_CPP=1 (build the C++ CPU op first: ~1-2 min, not needed for the CUDA stages), MICRO_ARGS
# (extra arguments for `python -m bench`), E2E_ARGS (arguments for `python -m bench.e2e` instead of
# `--device <dev> --out <dir>`), E2E_LIMIT_S (60).
#
# No `set -e` on purpose: each stage runs under `timeout`, a failure is recorded and the next stage
# still runs, and the summary is printed whatever happened (EXIT trap).
set -u -o pipefail

SUITE_START=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1

DRY=${CPU_SMOKE:-0}
for arg in "$@"; do
  case "$arg" in
    --dry-run | --cpu-smoke) DRY=1 ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
BUDGET=${SUITE_BUDGET_S:-540}
RESERVE=15 # seconds kept back for collecting files and printing the summary
DEADLINE=$((SUITE_START + BUDGET))
OUT=${OUT:-$(mktemp -d /tmp/specdec-suite.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/specdec-suite-work.XXXXXX)
touch "$WORK/stamp" # files newer than this were written by this run

# The repository runs from its source tree: nothing is installed on the GPU machine.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# No network there: fail at once instead of waiting on a download.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  MICRO_SIZE=--smoke
else
  DEVICE=cuda
  MICRO_SIZE=
fi

TESTS_LOG=$WORK/tests.log # build, CUDA identity, tests
BENCH_LOG=$WORK/bench.log # microbenchmarks, then end to end
: >"$TESTS_LOG"
: >"$BENCH_LOG"

STAGES=()
declare -A RESULT TOOK

# Seconds a stage that wants $1 seconds may have, given what is left of the budget.
stage_limit() {
  local left=$((DEADLINE - RESERVE - $(date +%s)))
  echo $(($1 < left ? $1 : left))
}

# run_stage NAME LIMIT_S LOG CMD...: CMD under timeout, output appended to LOG, outcome recorded.
run_stage() {
  local name=$1 limit=$2 log=$3
  shift 3
  STAGES+=("$name")
  if ((limit < 5)); then
    RESULT[$name]="skipped: budget spent"
    TOOK[$name]=0
    return 0
  fi
  local t0 rc first_line
  first_line=$(wc -l <"$log")
  echo "== [$name] limit ${limit}s: $*" | tee -a "$log"
  t0=$(date +%s)
  # pytest stopped by SIGINT still prints its summary (failures, outcomes); others get SIGTERM.
  local signal=TERM
  [[ " $* " == *" pytest "* ]] && signal=INT
  timeout -s "$signal" -k 15 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  TOOK[$name]=$(($(date +%s) - t0))
  # pytest's closing line ("3 passed, 2 skipped in 4.1s") says more than its exit status; only
  # this stage's part of the (shared) log is searched.
  local tally=""
  if [[ " $* " == *" pytest "* ]]; then
    tally=$(tail -n +"$((first_line + 1))" "$log" | grep -E '[0-9]+ (passed|failed|skipped|errors?|deselected)|no tests ran' | tail -n 1 | sed -E 's/=+//g; s/ in [0-9.]+s.*$//; s/^ +//; s/ +$//')
  fi
  case $rc in
    0) RESULT[$name]="ok${tally:+: $tally}" ;;
    124 | 137) RESULT[$name]="TIMEOUT (limit ${limit}s)" ;;
    5) RESULT[$name]="no tests collected" ;; # pytest's code for an empty selection
    *) RESULT[$name]="FAILED (exit $rc)${tally:+: $tally}" ;;
  esac
  echo "== [$name] ${RESULT[$name]} in ${TOOK[$name]}s" | tee -a "$log"
  tail -n 2 "$log" | sed 's/^/     /'
  return 0
}

skip_stage() {
  STAGES+=("$1")
  RESULT[$1]=$2
  TOOK[$1]=0
}

finish() {
  trap - EXIT
  # At most 8 files come back from the machine: summary.txt, tests.log (environment, tests),
  # bench.log, rows.json, micro.json, micro.png, e2e.json, e2e.png.
  cp "$TESTS_LOG" "$OUT/tests.log" 2>/dev/null
  cp "$BENCH_LOG" "$OUT/bench.log" 2>/dev/null
  local ext found
  found=$(ls -t "$WORK"/rows/*.json 2>/dev/null | head -n 1)
  [ -n "$found" ] && cp "$found" "$OUT/rows.json"
  for ext in json png; do
    found=$(ls -t "$WORK"/micro/*."$ext" 2>/dev/null | head -n 1)
    [ -n "$found" ] && cp "$found" "$OUT/micro.$ext"
    # bench.e2e writes into its --out folder (or, given other arguments, bench/results).
    found=$(find "$WORK/e2e" "$ROOT/bench/results" -maxdepth 1 -name "*.$ext" -newer "$WORK/stamp" 2>/dev/null | head -n 1)
    [ -n "$found" ] && cp "$found" "$OUT/e2e.$ext"
  done

  {
    echo
    if [ -n "${RESULT[e2e]:-}" ] && [[ "${RESULT[e2e]}" != skipped* ]]; then
      echo "---- end to end (last lines of bench.log)"
      tail -n 12 "$BENCH_LOG"
      echo
    fi
    if [ -f "$OUT/micro.json" ]; then
      echo "---- microbenchmarks: goals (table in bench.log, data in micro.json)"
      "$PY" -m bench --summary "$OUT/micro.json" --goals-only 2>&1 | tail -n 8
      echo
    fi
    echo "---- specdec_ext suite on ${DEVICE}: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - SUITE_START)) s of ${BUDGET} s"
    printf '%-14s %-48s %6s\n' stage result seconds
    local name
    for name in "${STAGES[@]}"; do
      printf '%-14s %-48s %6s\n' "$name" "${RESULT[$name]}" "${TOOK[$name]}"
    done
    echo "files: $OUT ($(ls "$OUT" | tr '\n' ' '))"
  } | tee "$OUT/summary.txt"
  rm -rf "$WORK"
}
trap finish EXIT

# 1. What ran where.
run_stage env "$(stage_limit 30)" "$TESTS_LOG" bash -c '
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  git -C "$0" rev-parse HEAD 2>/dev/null; git -C "$0" status --short 2>/dev/null | head -n 40
  "$1" - <<EOF
import importlib, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda, "| cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))
for name in ("triton", "transformers", "pytest", "pytest_benchmark", "hypothesis", "scipy", "matplotlib"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as error:
        print(name, "MISSING", type(error).__name__, error)
import specdec_ext
from specdec_ext._triton_backend import key_window_default
print("statistics key windows (Triton 3.8 or later: tl.histogram by shared-memory atomics):", "on" if key_window_default() else "off")
print("backends: cuda", specdec_ext.available_backends("cuda") if torch.cuda.is_available() else "-", "| cpu", specdec_ext.available_backends("cpu"))
EOF
' "$ROOT" "$PY"

# 2. The C++ CPU op, only on request: the CUDA stages do not use it, and it costs minutes.
if [ "${BUILD_CPP:-0}" = 1 ]; then
  run_stage build_cpp "$(stage_limit 150)" "$TESTS_LOG" env MAX_JOBS="$(nproc)" "$PY" setup.py build_ext --inplace
else
  skip_stage build_cpp "skipped (BUILD_CPP=1 to build)"
fi

# 3. The GPU model's calls (bench/gpu_rows.py: its goal rows, blocks and trees), each captured in a
# CUDA graph: one replay on an idle device, 20 replays back to back, and each kernel's device time,
# written to rows.json for `python -m bench.gpu_rows --compare`. The first launches JIT-compile
# every kernel variant (seconds each). tests/conftest.py only *defaults* TRITON_INTERPRET to 1, so
# exporting 0 makes Triton compile; a dry run interprets it on small shapes.
export TRITON_INTERPRET=0
if [ "$DRY" = 1 ]; then
  run_stage gpu_rows "$(stage_limit 200)" "$BENCH_LOG" "$PY" -m bench.gpu_rows --dry-run --out "$WORK/rows"
else
  run_stage gpu_rows "$(stage_limit 200)" "$BENCH_LOG" "$PY" -m bench.gpu_rows --out "$WORK/rows"
fi

# 4. Correctness of the compiled kernels: every test marked gpu (identity with eager for chains,
# blocks and trees, stream v2, graph capture and replay, allocations, the ops), in parallel
# processes where pytest-xdist is installed (compiling dominates), each outcome listed (-rA) and
# the slowest shown; on the time limit pytest gets SIGINT and still prints what it has.
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n "$(($(nproc) < 8 ? $(nproc) : 8))")
run_stage tests_gpu "$(stage_limit 200)" "$TESTS_LOG" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests bench/test_bench_verify.py -rA --durations=8 \
  ${XDIST[@]+"${XDIST[@]}"}

# 5. The microbenchmark grid. Its own time budget ends before the stage limit, so it writes its
# JSON and plot itself; SIGTERM from timeout also makes it write what it has.
limit=$(stage_limit 200)
read -r -a micro_extra <<<"${MICRO_ARGS:-}"
run_stage micro "$limit" "$BENCH_LOG" "$PY" -m bench --device "$DEVICE" $MICRO_SIZE --out "$WORK/micro" --tag suite --time-budget $((limit > 60 ? limit - 45 : limit / 2)) ${micro_extra[@]+"${micro_extra[@]}"}

# 6. End to end at realistic shapes, when bench/e2e.py exists (E2E_LIMIT_S, default 60 s).
if [ -f bench/e2e.py ]; then
  mkdir -p "$WORK/e2e"
  if [ -n "${E2E_ARGS:-}" ]; then
    read -r -a e2e_args <<<"$E2E_ARGS"
  else
    e2e_args=(--device "$DEVICE" --out "$WORK/e2e")
    [ "$DRY" = 1 ] && e2e_args+=(--quick)
  fi
  run_stage e2e "$(stage_limit "${E2E_LIMIT_S:-60}")" "$BENCH_LOG" "$PY" -m bench.e2e "${e2e_args[@]}"
else
  skip_stage e2e "skipped (no bench/e2e.py)"
fi

# 7. The CPU test suite (Triton interpreted, as in CI), only when enough time is left: it needs
# minutes, and CI runs it anyway. A dry run takes one short file.
export TRITON_INTERPRET=1
if [ "$DRY" = 1 ]; then
  run_stage tests_cpu "$(stage_limit 120)" "$TESTS_LOG" "$PY" -m pytest -q -p no:cacheprovider tests/exactness/test_philox.py
elif (($(stage_limit 600) >= 120)); then
  run_stage tests_cpu "$(stage_limit 600)" "$TESTS_LOG" "$PY" -m pytest -q -p no:cacheprovider -m "not slow and not gpu" tests
else
  skip_stage tests_cpu "skipped: under 120 s left (CI covers it)"
fi
