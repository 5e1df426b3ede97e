#!/usr/bin/env bash
# One GPU call: install carried wheels, check the GPU, then run the named stages, each under a time limit.
#
#   bash scripts/gpu_run.sh STAGE [STAGE ...]     stages: tests decoding models oomptimizer ddp allocator
#
# Keep one call under 10 minutes: `tests decoding models`, then `oomptimizer ddp`, then `allocator`.
#
# On the device machine (no network): carry `.whl` (make gpu-bundle fills it). Results land in
# $OUT/results.tar.gz (benchmarks/results/*.json) and logs in $OUT/*.log; elsewhere OUT defaults to ./gpu_out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT/results"
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
}

for stage in "$@"; do
  case $stage in
    tests)       run_stage tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests ;;
    decoding)    run_stage decoding 250 python3 -m workbench.bench.decoding --out "$OUT/results" ;;
    models)      run_stage models 180 python3 -m workbench.bench.models --out "$OUT/results" ;;
    oomptimizer) run_stage oomptimizer 400 python3 -m workbench.bench.oomptimizer --out "$OUT/results" ;;
    ddp)         run_stage ddp 170 python3 -m workbench.bench.oomptimizer --nproc 2 --out "$OUT/results" ;;
    allocator)   run_stage allocator 400 python3 -m workbench.bench.allocator --out "$OUT/results" ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
done
tar -czf "$OUT/results.tar.gz" -C "$OUT/results" . && ls "$OUT/results"
exit $status
