#!/usr/bin/env bash
# Run grid cells on an offline GPU host within a time budget, resumably, and bring back what finished.
#
#   OUT=/tmp/x tools/device_sweep.sh SECONDS sweep|ceiling GRID [harness sweep/ceiling options...]
#
# SECONDS bounds the whole script, environments included, less 30 s to pack the results.
#
# Creates the environments from ./wheelhouse once per machine (tools/device_check.sh says how to
# build it), then runs `harness sweep` (or `harness ceiling`) into device-results/ and device-cells/
# (kept on the machine between calls while it stays warm, so a second call resumes where the first
# stopped). After SECONDS the driver is stopped; a cell it interrupts runs again on the next call.
# What finished is packed into $OUT/results.tar.gz: unpack it here and copy device-results/ over
# results/ and device-cells/ over book/cells/.
set -uo pipefail
. "$(dirname "$0")/device_envs.sh"
OUT=${OUT:-/tmp/device-sweep}
BUDGET=$1; COMMAND=$2; GRID=$3; shift 3
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stage() { echo "== $(date +%T) $*"; }

stage "environments (offline, from ./wheelhouse)"
device_envs "$OUT" || exit 1
nvidia-smi --query-gpu=index,name,memory.used,clocks.sm,temperature.gpu --format=csv,noheader
nproc

LEFT=$(( BUDGET - SECONDS - 30 ))
stage "harness $COMMAND $GRID $* (for at most ${LEFT}s)"
timeout --signal=TERM --kill-after=10 "$LEFT" .venvs/pylate/bin/harness "$COMMAND" "$GRID" \
  --results-dir device-results --notebooks-dir device-cells "$@" 2>&1 | tee -a "$OUT/sweep.log" | grep -v '^  start'
pkill -f papermill 2>/dev/null; sleep 2
stage "packing what finished"
find device-results -name '*.json' | wc -l
tar czf "$OUT/results.tar.gz" device-results device-cells 2>/dev/null
stage "done"
