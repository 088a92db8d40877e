#!/usr/bin/env bash
# Work a queue of GPU jobs on a leased, offline GPU host in the background, across several device
# calls, and pack what finished after each call.
#
#   [DEADLINE=EPOCH] tools/device_queue.sh start QUEUE
#                                         # seed device-results/ from results/, then environments, then
#                                         # each job of QUEUE, detached (setsid)
#   OUT=/tmp/x tools/device_queue.sh pack [SECONDS]
#                                         # wait up to SECONDS for the queue, then pack into $OUT
#
# DEADLINE (seconds since the epoch) is when the session's device time ends: the caller computes it
# before the first call, from `status`'s budget_left_s (DEADLINE=$(( $(date +%s) + budget_left_s - 60 ))
# on the calling machine; both clocks keep UTC), and writes the number into the command. `start` keeps it
# for the calls after it: a job marked `needs MINUTES` then starts only while that many minutes are left
# (a long run that cannot end within the lease is not begun, and the queue goes on with what can), and
# `pack` never waits past DEADLINE less 40 s, so the call ends, and brings back its files, before the
# budget does.
#
# A device call lasts at most 10 minutes, while a sweep may need more; and a machine stays warm
# only briefly between calls. So the first call starts the queue detached and waits; each later
# call (made at once) waits again; every call packs what has finished so far into
# $OUT/results.tar.gz (device-results/ and device-cells/: copy them over results/ and book/cells/).
# Nothing is lost at a call's end: the queue runs on, and every job resumes from the results it
# already wrote (the sweep and the ceiling search skip cells that have one).
#
# QUEUE holds one job per line (# starts a comment):
#   sweep GRID [harness sweep options]      e.g. sweep grids/parity.yaml --stack pylate
#   ceiling GRID [harness ceiling options]
#   op-parity LIBRARY                       tools/op_parity.py LIBRARY --device cuda
#   & JOB                                   JOB in the background, beside the jobs after it
#   needs MINUTES JOB                       JOB only while MINUTES are left before DEADLINE (always without one)
#   wait                                    until every background job has ended
# Jobs side by side on one GPU must share it through its gate (--share-gpu on both): their bytes
# are measured, their times never published. The queue ends after its background jobs.
# Environments are made from ./wheelhouse (tools/device_check.sh says how to build it).
set -uo pipefail
set -f  # a job's options (--match 'colpali-*') reach the harness as written, never as file names
. "$(dirname "$0")/device_envs.sh"
LOG=device-log
mkdir -p "$LOG" device-results device-cells
stage() { echo "== $(date +%T) $*"; }

# The grids whose jobs resume from committed results (searches, the cross-card check's twins, long runs, and the
# sweeps whose cells take minutes: GradCache's, the multi-GPU cells): `start` copies each into device-results/ where
# it is not there yet, so a fresh machine never runs a cell or probe already measured, and the ceiling search can
# read the cross-card check's verdict. (How a GPU repeats itself, which that verdict also reads, comes from the
# committed results/ the call carries: `harness ceiling` reads it there.)
RESUMED_GRIDS="ceilings cross-card-check shared-gpu-check long-run gradcache multi-gpu"
seed_results() {
  for grid in $RESUMED_GRIDS; do
    if [ -d "results/$grid" ] && [ ! -e "device-results/$grid" ]; then cp -r "results/$grid" device-results/ && echo "seeded device-results/$grid"; fi
  done
}

run_job() {  # one job: KIND TARGET REST
  local kind=$1 target=$2 rest=$3
  case "$kind" in
    sweep|ceiling)
      stage "harness $kind $target $rest"
      # shellcheck disable=SC2086
      .venvs/pylate/bin/harness "$kind" "$target" --results-dir device-results --notebooks-dir device-cells $rest \
        2>&1 | grep --line-buffered -v '^  start' ;;
    op-parity)
      stage "op parity $target (cuda)"
      mkdir -p device-results/op-parity
      ".venvs/$target/bin/python" tools/op_parity.py "$target" --device cuda \
        --output "device-results/op-parity/$target-op-parity-cuda.json" 2>&1 | tail -60 ;;
    *) echo "unknown job: $kind" ;;
  esac
}

seconds_left() {  # until DEADLINE, as kept by `start`; nothing where none was given
  [ -f "$LOG/deadline" ] && echo $(( $(cat "$LOG/deadline") - $(date +%s) ))
}

run_queue() {
  export PYTHONUNBUFFERED=1
  stage "environments (offline, from ./wheelhouse)"
  # a queue whose environments failed stops, and says so to `pack`, which then stops waiting on it
  device_envs "$LOG" || { stage "environments failed: the queue stops (device-log/envs-*.log)"; touch "$LOG/queue.failed"; return 1; }
  nvidia-smi --query-gpu=index,name,memory.used,clocks.sm,temperature.gpu --format=csv,noheader
  while read -r kind target rest; do
    case "$kind" in
      ""|\#*) continue ;;
      wait) stage "waiting for the background jobs"; wait ;;
      "&") read -r kind target rest <<< "$target $rest"
           run_job "$kind" "$target" "$rest" & ;;
      needs) minutes=$target left=$(seconds_left)
             read -r kind target rest <<< "$rest"
             if [ -n "$left" ] && [ "$left" -lt $(( minutes * 60 )) ]; then
               stage "skipped (needs $minutes min, $(( left / 60 )) min left): $kind $target $rest"
             else
               run_job "$kind" "$target" "$rest"
             fi ;;
      *) run_job "$kind" "$target" "$rest" ;;
    esac
  done < "$1"
  wait
  stage "queue done"
  touch "$LOG/queue.done"
}

case "${1:-}" in
  start)
    [ -f "${2:-}" ] || { echo "usage: $0 start QUEUE"; exit 2; }
    case "${DEADLINE:-0}" in
      ''|*[!0-9]*) echo "DEADLINE must be whole seconds since the epoch, not '${DEADLINE}'"; exit 2 ;;
    esac
    if [ -f "$LOG/queue.pid" ] && kill -0 "$(cat "$LOG/queue.pid")" 2>/dev/null; then
      echo "a queue is already running (pid $(cat "$LOG/queue.pid")): not starting another"; exit 0
    fi
    # The environments install offline from ./wheelhouse, which git ignores: a call that did not carry it
    # would build nothing and wait out its lease, so refuse at once.
    set +f; wheels=(wheelhouse/*.whl); set -f
    [ -e "${wheels[0]}" ] || { echo "no wheels under ./wheelhouse: build it (python3 tools/envs.py wheelhouse pylate colpali --host h200-cuda-image --dest wheelhouse) and carry it into the device call (git ignores it)"; exit 2; }
    rm -f "$LOG/queue.done" "$LOG/queue.failed"
    if [ -n "${DEADLINE:-}" ]; then
      echo "$DEADLINE" > "$LOG/deadline"
      echo "device time ends in $(( DEADLINE - $(date +%s) )) s (at $(date -u -d "@$DEADLINE" +%T) UTC)"
    fi
    seed_results
    setsid nohup bash "$0" _run "$2" > "$LOG/queue.log" 2>&1 < /dev/null &
    echo $! > "$LOG/queue.pid"
    echo "queue started (pid $!)" ;;
  _run) run_queue "$2" ;;
  seed) seed_results ;;
  pack)
    OUT=${OUT:?set OUT}
    WAIT=${2:-590}
    left=$(seconds_left)
    if [ -n "$left" ] && [ $(( left - 40 )) -lt "$WAIT" ]; then
      WAIT=$(( left > 40 ? left - 40 : 0 )); echo "waiting $WAIT s: device time ends in $left s"
    fi
    # A machine given back between calls comes back bare: never wait on a queue that is not there.
    [ -f "$LOG/queue.pid" ] || { echo "no queue was started on this machine (a fresh one?): nothing to wait for"; exit 1; }
    # Pack every minute while waiting, not only at the end: a call that runs past its limit (a budget
    # smaller than SECONDS) is killed, and then what was last packed under $OUT is what comes back.
    pack_now() {
      tar czf "$OUT/.results.tar.gz" device-results device-cells 2>/dev/null && mv "$OUT/.results.tar.gz" "$OUT/results.tar.gz"
      set +f; cp "$LOG"/*.log "$OUT/" 2>/dev/null; set -f  # (globbing is off for the jobs' options)
    }
    trap 'pack_now; exit 124' TERM INT
    packed=$SECONDS
    while [ "$SECONDS" -lt "$WAIT" ] && [ ! -f "$LOG/queue.done" ] && [ ! -f "$LOG/queue.failed" ]; do
      sleep 5
      if [ $((SECONDS - packed)) -ge 60 ]; then pack_now; packed=$SECONDS; fi
    done
    find device-results -name '*.json' | wc -l
    pack_now
    tail -40 "$LOG/queue.log"
    if [ -f "$LOG/queue.failed" ]; then echo "QUEUE FAILED (its environments: device-log/envs-*.log)"; exit 1; fi
    if [ -f "$LOG/queue.done" ]; then echo "QUEUE DONE"; else echo "queue still running"; fi ;;
  *) echo "usage: [DEADLINE=EPOCH] $0 start QUEUE | pack [SECONDS]"; exit 2 ;;
esac
