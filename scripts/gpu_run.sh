#!/usr/bin/env bash
# One GPU call: install carried wheels, check the GPU, then run the named stages, each under a time limit.
#
#   bash scripts/gpu_run.sh STAGE [STAGE ...]     stages: tests decoding models oomptimizer ddp allocator
#
# Keep one call under 10 minutes: `tests decoding models`, then `oomptimizer ddp`, then `allocator`.
#
# On the device machine (no network): carry `.whl` (make gpu-bundle fills it). Results land in
# $OUT/results.tar.gz (benchmarks/results/*.json, re-packed after every stage, so a call stopped at its limit
# still returns what finished) and logs in $OUT/*.log; elsewhere OUT defaults to ./gpu_out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
RESULTS=${RESULTS:-/tmp/workbench_results}
mkdir -p "$OUT" "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export WORKBENCH_GIT_COMMIT=${WORKBENCH_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat .gpu_commit 2>/dev/null || echo unknown)}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 - <<'PY' || exit 1
import torch, lhotse
assert torch.cuda.is_available(), "no CUDA GPU"
print(f"torch {torch.__version__} cuda {torch.version.cuda} lhotse {lhotse.__version__} gpus "
      f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PY
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

status=0
run_stage() {  # name, time limit in seconds, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s) ==="
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 ))s ==="
  [ $rc -eq 0 ] || status=1
  tar -czf "$OUT/results.tar.gz" -C "$RESULTS" . && ls "$RESULTS"
}

for stage in "$@"; do
  case $stage in
    tests)       run_stage tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests ;;
    decoding)    run_stage decoding 210 python3 -m workbench.bench.decoding --budget-s 170 --out "$RESULTS" ;;
    models)      run_stage models 160 python3 -m workbench.bench.models --out "$RESULTS" ;;
    oomptimizer) run_stage oomptimizer 360 python3 -m workbench.bench.oomptimizer --out "$RESULTS" ;;
    ddp)         run_stage ddp 160 python3 -m workbench.bench.oomptimizer --nproc 2 --out "$RESULTS" ;;
    allocator)   run_stage allocator 420 python3 -m workbench.bench.allocator --out "$RESULTS" ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
done
exit $status
