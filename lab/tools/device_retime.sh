#!/usr/bin/env bash
# On the GPU machine after staging: time again the row each collect run timed first in each (kernel, dtype)
# block (tools/retime_first.py; harness.measure now throws a process's first timing away), on the full GPU
# and its MPS variants, and export each device's shard to $OUT. matmul is left alone (its blocks start on
# configs of 50 us and more, and some of its data is chain-timed: a case never mixes timers).
# SELECT=small instead times again every case with a kernel input of 8 bytes or fewer (tools/retime_small_inputs.py:
# MLX CUDA's managed small pool, which harness.make_inputs now keeps inputs out of), of KERNEL (default moe_combine).
#   [VARIANTS="100 50 25"] [BUDGET=150s] [SELECT=first|small] [KERNEL=moe_combine] bash lab/tools/device_retime.sh
set -uo pipefail
source /tmp/devpack/env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DB=/tmp/zp.duckdb
[ -f $DB ] || python3 -m zmlx_pipeline ingest --db $DB data/
KERNELS="-k rmsnorm -k add_rmsnorm -k layernorm -k softmax -k swiglu -k topk_gating -k moe_combine"
SELECTOR=(tools/retime_first.py --skip-kernel matmul); TAG=retime
if [ "${SELECT:-first}" = small ]; then
  KERNELS="-k ${KERNEL:-moe_combine}"
  SELECTOR=(tools/retime_small_inputs.py --kernel "${KERNEL:-moe_combine}"); TAG=retime-small
fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
for pct in ${VARIANTS:-100 50 25}; do
  if [ "$pct" != 100 ]; then
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    nvidia-cuda-mps-control -d && echo "MPS daemon started"
    export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct
    preset="thin --max-configs 12"  # as the SM-limited variants were collected
  else
    preset=full
  fi
  dev=$(python3 -m zmlx_pipeline devices --json | python3 -c "import json,sys; print(json.load(sys.stdin)['current']['device_id'])")
  safe=$(echo "$dev" | tr -c 'A-Za-z0-9.\n-' '-')
  echo "== $dev ($pct%)"
  python3 "${SELECTOR[@]}" --db $DB --device "$dev" --delete > "$OUT/$TAG-$safe.txt"
  tail -1 "$OUT/$TAG-$safe.txt"
  python3 -m zmlx_pipeline collect --db $DB --preset $preset $KERNELS --budget "${BUDGET:-150s}" -j 16 2>&1 \
    | tr '\r' '\n' | grep -v '^collect ' | tail -12
  if [ "$pct" != 100 ]; then unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; echo quit | nvidia-cuda-mps-control; fi
  python3 -m zmlx_pipeline export --db $DB --device "$dev" "$OUT/$safe.parquet"
done
exit 0
