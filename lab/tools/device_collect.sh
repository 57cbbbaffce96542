#!/usr/bin/env bash
# On the GPU machine after staging: resume a collect into /tmp/zp.duckdb (seeded from data/), optionally
# under an MPS SM limit, optionally repeat a sample, and export each device's shard to $OUT.
#   [FRESH=1] [MPS=25] [REPEAT=0.03 [REPEAT_K=kernel]] [JOBS=16] bash lab/tools/device_collect.sh BUDGET PRESET [collect args...]
set -uo pipefail
source /tmp/devpack/env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DB=/tmp/zp.duckdb
budget=$1; preset=$2; shift 2
# FRESH=1 starts an empty store (a re-collection); otherwise resume on top of data/
[ -f $DB ] || [ -n "${FRESH:-}" ] || python3 -m zmlx_pipeline ingest --db $DB data/
if [ -n "${MPS:-}" ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS daemon started"
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$MPS
fi
dev=$(python3 -m zmlx_pipeline devices --json | python3 -c "import json,sys; print(json.load(sys.stdin)['current']['device_id'])")
safe=$(echo "$dev" | tr -c 'A-Za-z0-9.\n-' '-')  # file names come back only with plain characters
echo "device: $dev"
if [ "$budget" != "0" ]; then
  python3 -m zmlx_pipeline collect --db $DB --preset "$preset" --budget "$budget" -j ${JOBS:-16} "$@" 2>&1 \
    | tr '\r' '\n' | grep -v '^collect ' > "$OUT/collect-$safe.txt"
  tail -16 "$OUT/collect-$safe.txt"
fi
if [ -n "${REPEAT:-}" ]; then
  python3 -m zmlx_pipeline repeat --db $DB --fraction "$REPEAT" ${REPEAT_K:+-k $REPEAT_K} -j ${JOBS:-16} --budget ${REPEAT_BUDGET:-150s} 2>&1 | tail -3
fi
if [ -n "${MPS:-}" ]; then unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; echo quit | nvidia-cuda-mps-control; fi
python3 -m zmlx_pipeline summary --db $DB --device "$dev" > "$OUT/summary-$safe.txt"
python3 -m zmlx_pipeline export --db $DB --device "$dev" "$OUT/$safe.parquet"
[ -n "${NOISE:-}" ] && python3 -m zmlx_pipeline noise --db $DB > "$OUT/noise.txt" && cat "$OUT/noise.txt"
exit 0
