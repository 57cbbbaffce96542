#!/usr/bin/env bash
# On the GPU machine after staging: kernels vs MLX at the largest shapes, then a collect-throughput probe.
set -uo pipefail
source /tmp/devpack/env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MLX_PTX_CACHE_DIR=/tmp/zp-ptx
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .ptxcache.tar ] && mkdir -p /tmp/zp-ptx && tar -C /tmp/zp-ptx -xf .ptxcache.tar && echo "ptx cache: $(ls /tmp/zp-ptx | wc -l) files"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
timeout ${KVM_TIMEOUT:-300} python3 benchmarks/kernels_vs_mlx.py --configs ${CONFIGS:-16} --jobs 16 --json "$OUT/kvm.json" ${KVM_ARGS:-} > "$OUT/kvm.txt" 2>&1
echo "kvm rc=$?"; tail -30 "$OUT/kvm.txt"
if [ -n "${COLLECT_BUDGET:-}" ]; then
  python3 -m zmlx_pipeline collect --db /tmp/zp.duckdb --preset smoke --budget "$COLLECT_BUDGET" -j 16 ${COLLECT_ARGS:-} 2>&1 | grep -v '^collect ' > "$OUT/collect.txt"
  tail -15 "$OUT/collect.txt"
fi
tar -C /tmp/zp-ptx -cf "$OUT/ptxcache.tar" . 2>/dev/null; ls -la "$OUT"
