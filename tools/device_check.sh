#!/usr/bin/env bash
# Re-run a sample of committed cells on an offline GPU host and check that they measure the same
# memory (tools/compare_results.py): training cells of both stacks, every backend, an OOM cell,
# op-level heads, and a two-probe ceiling search — all through `harness sweep` / `harness ceiling`,
# so the launcher, the notebooks, the cell runners and the result schema are exercised as in a real
# sweep. Needs the wheelhouse for the host image (README: offline hosts):
#
#   python tools/envs.py wheelhouse pylate colpali --host h200-cuda-image --dest wheelhouse   # connected machine
#   OUT=/tmp/check tools/device_check.sh                                                        # GPU host
set -uo pipefail
. "$(dirname "$0")/device_envs.sh"
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stage() { echo "== $(date +%T) $*"; }

stage "environments (offline, from ./wheelhouse)"
device_envs "$OUT" || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader

stage "committed cells, run again"
H=.venvs/pylate/bin/harness
$H sweep grids/published.yaml --gpus 0 --cells-per-gpu 2 --results-dir "$OUT/results" --notebooks-dir "$OUT/cells" \
  --match 'pylate-grad-checkpoint-b512-*' --match 'pylate-plain-b256-lik-*' \
  --match 'colpali-plain-b16-*' --match 'colpali-plain-b128-vanilla-*' 2>&1 | tee "$OUT/sweep.log" | grep -v '^  start'
$H sweep grids/ours.yaml --gpus 0 --results-dir "$OUT/results" --notebooks-dir "$OUT/cells" \
  --match 'pylate-grad-checkpoint-b512-flash-h100-80gb' 2>&1 | tee -a "$OUT/sweep.log" | tail -3
$H sweep grids/op.yaml --gpus 0 --cells-per-gpu 2 --results-dir "$OUT/results" --notebooks-dir "$OUT/cells" \
  --match 'op-pylate-inbatch-b256-*' --match 'op-colpali-negative-ce-b128-n8-*' 2>&1 | tee -a "$OUT/sweep.log" | tail -8

stage "a ceiling search of two probes (24 GB, lik): 352 fits, 384 does not, as committed"
cat > "$OUT/ceiling-check.yaml" <<'GRID'
name: ceilings
defaults: {steps: 8, seeds: [42], preset: full, device: cuda, allocator: default}
searches:
  - {stack: pylate, regime: grad-checkpoint, variant: lik, card: rtx4090-24gb, start: 352, step: 32, limit: 384, resolution: 32}
GRID
$H ceiling "$OUT/ceiling-check.yaml" --gpus 0 --results-dir "$OUT/results" --notebooks-dir "$OUT/cells" 2>&1 | tee "$OUT/ceiling.log" | tail -4

stage "memory against the committed results"
.venvs/pylate/bin/python tools/compare_results.py results "$OUT/results" --tolerance-mib 1 | tee "$OUT/compare.txt"
.venvs/pylate/bin/harness results "$OUT/results" | head -3
(cd "$OUT" && tar czf results.tar.gz results cells && rm -rf results cells)
stage "done"
