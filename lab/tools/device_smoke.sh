#!/usr/bin/env bash
# On the GPU machine (after the .devpack wheels are staged): the GPU tests, then a short collect of
# every kernel and dtype into /tmp/zp.duckdb (kept while the machine is warm), exported to $OUT.
#   bash lab/tools/device_smoke.sh [BUDGET] [EXTRA COLLECT ARGS...]
set -uo pipefail
source /tmp/devpack/env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MLX_PTX_CACHE_DIR=/tmp/zp-ptx
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
budget=${1:-5m}; shift || true
python3 -m zmlx_pipeline devices --json > "$OUT/devices.json" && python3 -c "import json; print('current:', json.load(open('$OUT/devices.json'))['current'])"
python3 -m zmlx_pipeline collect --db /tmp/zp.duckdb --preset smoke --budget "$budget" -j 16 "$@" 2>&1 | grep -v '^collect ' | tee "$OUT/collect.txt"
python3 -m zmlx_pipeline summary --db /tmp/zp.duckdb > "$OUT/summary.txt"
python3 -m zmlx_pipeline export --db /tmp/zp.duckdb "$OUT/shard.parquet"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -25
fi
