#!/usr/bin/env bash
# Install attnlab with its test dependencies and run the whole suite (lint + tests). README command 2; CI runs it.
#
# Each step is one `step NAME COMMAND...` line: its wall time is recorded under NAME and every recorded time (and the
# total) is printed when the script ends, whether it passed or failed. Add a check as one more `step` line.
# `start_step NAME COMMAND...` starts a step in the background instead and `join_steps` waits for those started (their
# output is printed when they are joined): single-process steps that do not need each other share the cores.
# pytest runs on every core (pytest-xdist, `-n auto`; ATTNLAB_TEST_WORKERS=N sets the count) with `--dist loadgroup`:
# tests marked `xdist_group` (one lab server and browser, one model) share one worker.
set -euo pipefail
cd "$(dirname "$0")/.."

now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }  # wall clock in ms (bash 5)
seconds_since() { local ms=$(($(now_ms) - $1)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
times=()
started=$(now_ms)

step() {  # step NAME COMMAND...: run COMMAND and record how long it took under NAME
  local name=$1 t0 rc=0
  shift
  t0=$(now_ms)
  "$@" || rc=$?
  times+=("$(printf '%-8s %7s s%s' "$name" "$(seconds_since "$t0")" "$([ "$rc" = 0 ] || echo " (exit $rc)")")")
  return "$rc"
}

report() {  # the recorded times, then the total (also after a failed step, which set -e ends the script on)
  local rc=$? t
  echo
  echo "scripts/test.sh: times ($(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg))"
  for t in "${times[@]}"; do echo "  $t"; done
  printf '  %-8s %7s s%s\n' total "$(seconds_since "$started")" "$([ "$rc" = 0 ] || echo " (failed)")"
}
trap report EXIT

running=()
start_step() {  # start_step NAME COMMAND...: run COMMAND in the background (a step that another step does not wait
  local name=$1 log  # for); its output is held in a file and printed by join_steps, with its time
  shift
  log=$(mktemp)
  (
    t0=$(now_ms) rc=0
    "$@" >"$log" 2>&1 || rc=$?
    echo "$rc $(seconds_since "$t0")" >"$log.done"
  ) &
  running+=("$name $! $log")
}

join_steps() {  # wait for every started step, print its output and record its time; fails if any of them failed
  local entry name pid log rc=0 status secs
  for entry in "${running[@]}"; do
    read -r name pid log <<<"$entry"
    wait "$pid" || true
    cat "$log"
    read -r status secs <"$log.done"
    times+=("$(printf '%-8s %7s s%s' "$name" "$secs" "$([ "$status" = 0 ] || echo " (exit $status)")")")
    [ "$status" = 0 ] || rc=$status
    rm -f "$log" "$log.done"
  done
  running=()
  return "$rc"
}

step install bash scripts/install-test-deps.sh
step lint python -m ruff check .
step format python -m ruff format --check .
# the docs build and mypy are one process each: they run side by side, on two cores, and pytest waits for both
start_step docs bash scripts/build-docs.sh  # the API reference (pdoc, warnings as errors; docs/README.md)
start_step mypy python -m mypy  # the type checker over src/attnlab ([tool.mypy] in pyproject.toml; docs/typing.md)
join_steps
# the API reference tests read the pages the docs step wrote (docs/api) rather than building them again
step pytest env ATTNLAB_TEST_API_DOCS=docs/api python -m pytest -q -n "${ATTNLAB_TEST_WORKERS:-auto}" --dist loadgroup
step import python benchmarks/bench_import.py --runs 7  # import attnlab vs import numpy (prints, asserts nothing)
