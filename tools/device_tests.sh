#!/usr/bin/env bash
# The CUDA tests (pytest -m gpu) on an offline GPU host, in both stack environments made from a
# wheelhouse (see tools/device_check.sh). One GPU visible: a cell refuses a process that sees more.
set -uo pipefail
. "$(dirname "$0")/device_envs.sh"
OUT=${OUT:-/tmp/device-tests}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
device_envs "$OUT" || exit 1
status=0
.venvs/pylate/bin/python -m pytest tests/test_gpu.py -m "gpu and not colpali" -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest-pylate.log" | tail -15 || status=1
.venvs/colpali/bin/python -m pytest tests/test_gpu.py -m "gpu and colpali" -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest-colpali.log" | tail -15 || status=1
exit $status
