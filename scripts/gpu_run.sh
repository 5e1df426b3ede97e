#!/usr/bin/env bash
# One GPU call: install carried wheels, check the GPU, then run the named stages, each under a time limit.
#
#   bash scripts/gpu_run.sh STAGE [STAGE ...]                 one after another on GPU 0
#   bash scripts/gpu_run.sh --parallel "STAGES" "STAGES" ...  each group on its own GPU (0, 1, ...), at once
#
# stages: flow, tests, tests-allocator (below) and the benches' stages of benchmarks/stages.toml (one row
# each: its command, time limit, record and budget; their environment: BYO_ARGS, CALIBRATION_ARGS, THROUGHPUT_ARGS,
# CHUNKED_BUCKETS; SKIP_BEFORE=1 skips a stage's first step, e.g. byo-models' adapter tests, whose output
# goes to $OUT/<stage>_before.log). A stage marked `nemo` (decoding-nemo: ours against NeMo
# 3.0.0's greedy decoders on NeMo's modules, same process) needs NeMo's wheels in .whl-nemo (make gpu-bundle;
# carry it too): they go to /tmp/nemo_site, on the path of that stage only, so NeMo's pins (lightning,
# pydantic, librosa, datasets) never shadow the host's packages in the other stages
# A call must end within 10 minutes: every stage's limit is cut to what is left of DEADLINE_S (560 s from
# the start), and the benches with an internal budget get the rest minus a margin.
#
# On the device machine (no network): carry `.whl`, `.whl-nemo`, `.espeak` (make gpu-bundle fills them) and `.gpu_commit`. Results
# land in $OUT/results.tar.gz (benchmarks/results/*.json, re-packed after every stage, so a call stopped
# at its limit still returns what finished), logs in $OUT/<stage>.log and the card's clocks, power and load
# during each stage (nvidia-smi dmon, once a second) in $OUT/<stage>.dmon.log; elsewhere OUT defaults to ./gpu_out.
set -uo pipefail
cd "$(dirname "$0")/.."
TABLE_STAGES=$(python3 -m benchmarks.stages names) || { echo "benchmarks/stages.toml does not read"; exit 2; }
STAGES="flow tests tests-allocator $TABLE_STAGES"
if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; echo "stages: $STAGES"; exit 2
fi
for group in "$@"; do  # unknown stage names fail now, not after the wheels are installed
  for st in $group; do
    case " --parallel $STAGES " in
      *" $st "*) ;;
      *) echo "unknown stage '$st' (stages: $STAGES)"; exit 2 ;;
    esac
  done
done
START=$(date +%s)
DEADLINE=$(( START + ${DEADLINE_S:-560} ))
OUT=${OUT:-$PWD/gpu_out}
# A fresh folder per call: a warm machine keeps /tmp, and an earlier call's results must not be re-packed.
RESULTS=${RESULTS:-$(mktemp -d /tmp/workbench_results.XXXXXX)}
mkdir -p "$OUT" "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The device copy may carry a stale .git: the commit written before the call (`make gpu-commit`) wins.
HEAD_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
export WORKBENCH_GIT_COMMIT=${WORKBENCH_GIT_COMMIT:-$(cat .gpu_commit 2>/dev/null || echo "$HEAD_COMMIT")}
[ "$WORKBENCH_GIT_COMMIT" = "$HEAD_COMMIT" ] || echo "note: results will say commit $WORKBENCH_GIT_COMMIT" \
  "(.gpu_commit); git here says $HEAD_COMMIT: run 'make gpu-commit' before the call if that is stale"
if [ -d .espeak ] && ls .espeak/*.deb >/dev/null 2>&1; then  # espeak-ng for `corpus tts` (make gpu-bundle)
  mkdir -p /tmp/espeak && for deb in .espeak/*.deb; do dpkg -x "$deb" /tmp/espeak; done
  lib=/tmp/espeak/usr/lib/x86_64-linux-gnu
  export PATH="/tmp/espeak/usr/bin:$PATH" ESPEAK_DATA_PATH=$lib \
    LD_LIBRARY_PATH="$lib:$lib/pulseaudio:/tmp/espeak/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  espeak-ng --version || { echo "note: the carried espeak-ng does not run here:"; ldd "$(command -v espeak-ng)" | grep 'not found'; }
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
NEMO_ENV=()
nemo_site() {  # NeMo's wheels into /tmp/nemo_site, once per call, when a NeMo stage first needs them
  [ -n "${NEMO_INSTALLED:-}" ] && return 0
  if [ -d .whl-nemo ] && ls .whl-nemo/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/nemo_site \
      .whl-nemo/*.whl || echo "note: NeMo's wheels did not install; the stage will say NeMo is missing"
  fi
  NEMO_INSTALLED=1
  NEMO_ENV=(env PYTHONPATH="$PYTHONPATH:/tmp/nemo_site")  # a stage's command prefix with NeMo importable
}
python3 - <<'PY' || exit 1
import torch, lhotse
assert torch.cuda.is_available(), "no CUDA GPU"
print(f"torch {torch.__version__} cuda {torch.version.cuda} lhotse {lhotse.__version__} gpus "
      f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PY
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

left() { echo $(( DEADLINE - $(date +%s) )); }
pack() {  # atomic; two tracks may pack at once, and a bench may be writing a .tmp file meanwhile
  local tmp rc; tmp=$(mktemp "$OUT/.results.XXXXXX")
  tar -czf "$tmp" --exclude='./.*' --warning=no-file-changed --warning=no-file-removed -C "$RESULTS" .
  rc=$?  # 1: a file changed while read; the finished JSON files are whole either way
  if [ $rc -le 1 ]; then mv "$tmp" "$OUT/results.tar.gz"; else rm -f "$tmp"; fi
}

run_stage() {  # name, time limit in seconds, command...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  if [ "$limit" -lt 20 ]; then echo "=== $name: SKIPPED (no time left) ==="; return 1; fi
  echo "=== $name (limit ${limit}s, GPU ${CUDA_VISIBLE_DEVICES:-all}) ==="
  # the card's clocks, power and load once a second meanwhile (nvidia-smi dmon): a slow stretch of steps
  # reads against them (a clock or power drop there is the card, not the code)
  timeout --kill-after=5 $(( limit + 15 )) nvidia-smi dmon ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} \
    -s puc -o DT -d 1 > "$OUT/$name.dmon.log" 2>&1 &
  local dmon=$!
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  kill "$dmon" 2>/dev/null; wait "$dmon" 2>/dev/null
  tail -n 25 "$OUT/$name.log" | sed "s/^/[$name] /"
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 ))s ==="
  pack
  return $rc
}

output_of() {  # the result a stage writes (two parallel groups must not write the same one)
  case $1 in
    flow|tests|tests-allocator) echo "$1" ;;
    *) python3 -m benchmarks.stages writes "$1" ;;
  esac
}

run_before() {  # name, command: a stage's first step, logged to $OUT/<name>_before.log
  "${NEMO_ENV[@]}" bash -c "$2" > "$OUT/$1_before.log" 2>&1
  tail -n 5 "$OUT/$1_before.log" | sed "s/^/[$1 before] /"
}

stage() {  # one stage by name: flow and the gpu tests here, the benches from benchmarks/stages.toml
  local line
  case $1 in
    flow)             run_stage flow 420 env WORKBENCH_FLOW_OUT="$RESULTS" python3 -m pytest -q -s -m gpu \
                        -p no:cacheprovider tests/benchmarks/test_flow.py ;;
    tests)            # GPU_TESTS: the paths to run (default: every gpu test); GPU_TESTS_LIMIT: seconds. NeMo on the
                      # path, so the NeMo-gated gpu tests (ours beside NeMo's decoders) run too; every test's time
                      # comes back in $OUT/test_times.tsv, also when the stage is cut (python3 -m
                      # benchmarks.gpu_test_times sums it by file and packs the files into calls)
                      nemo_site
                      : > "$OUT/test_times.tsv"  # this call's times only (an OUT kept from a run before appends)
                      local -a selection
                      mapfile -t selection < <(python3 -m benchmarks.gpu_test_times --selection)
                      [ ${#selection[@]} -gt 0 ] || { echo "=== tests: FAILED (no gpu test selection:" \
                        "python3 -m benchmarks.gpu_test_times --selection printed nothing) ==="; return 1; }
                      run_stage tests "${GPU_TESTS_LIMIT:-150}" env WORKBENCH_TEST_TIMES="$OUT/test_times.tsv" \
                        "${NEMO_ENV[@]}" python3 -m pytest -q -p no:cacheprovider --durations=5 "${selection[@]}" \
                        ${GPU_TESTS:-tests} ;;
    tests-allocator)  run_stage tests_allocator 120 python3 -m pytest -q -p no:cacheprovider \
                        tests/memory/test_allocator_gpu.py tests/benchmarks/test_bench_smoke.py::test_allocator_bench_smoke ;;
    *)                # NeMo's install and the stage's first step run before its budget is taken from what is left
                      line=$(python3 -m benchmarks.stages prelude "$1") || return 1
                      eval "$line"
                      line=$(python3 -m benchmarks.stages shell "$1" --results "$RESULTS" --left "$(left)") \
                        || { echo "$line"; return 1; }
                      eval "$line" ;;
  esac
}

track() {  # stages one after another; status 1 if any failed
  local rc=0
  for s in "$@"; do stage "$s" || rc=1; done
  return $rc
}

status=0
if [ "${1:-}" = "--parallel" ]; then
  shift
  gpus=$(nvidia-smi -L | wc -l)
  [ $# -le "$gpus" ] || { echo "--parallel: $# groups but $gpus GPUs"; exit 1; }
  case " $* " in *" ddp "*) echo "--parallel: ddp needs every GPU; run it on its own"; exit 1 ;; esac
  outputs=$(for g in "$@"; do for st in $g; do output_of "$st"; done; done | sort | uniq -d)
  [ -z "$outputs" ] || { echo "--parallel: two groups would write the same results ($outputs)"; exit 1; }
  pids=(); gpu=0
  for group in "$@"; do
    # shellcheck disable=SC2086
    ( export CUDA_VISIBLE_DEVICES=$gpu; track $group ) &
    pids+=($!); gpu=$(( gpu + 1 ))
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
else
  track "$@" || status=1
fi
pack; ls "$RESULTS"
exit $status
