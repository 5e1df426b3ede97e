#!/usr/bin/env bash
# One GPU call: install carried wheels, check the GPU, then run the named stages, each under a time limit.
#
#   bash scripts/gpu_run.sh STAGE [STAGE ...]                 one after another on GPU 0
#   bash scripts/gpu_run.sh --parallel "STAGES" "STAGES" ...  each group on its own GPU (0, 1, ...), at once
#
# stages: see STAGES below (each is one case of stage()); decoding-nemo (decoding_nemo.json: ours against NeMo
# 3.0.0's greedy decoders on NeMo's modules, same process) needs NeMo's wheels in .whl-nemo (make gpu-bundle;
# carry it too): they go to /tmp/nemo_site, on the path of that stage only, so NeMo's pins (lightning,
# pydantic, librosa, datasets) never shadow the host's packages in the other stages
# A call must end within 10 minutes: every stage's limit is cut to what is left of DEADLINE_S (560 s from
# the start), and the benches with an internal budget get the rest minus a margin.
#
# On the device machine (no network): carry `.whl`, `.whl-nemo`, `.espeak` (make gpu-bundle fills them) and `.gpu_commit`. Results
# land in $OUT/results.tar.gz (benchmarks/results/*.json, re-packed after every stage, so a call stopped
# at its limit still returns what finished) and logs in $OUT/*.log; elsewhere OUT defaults to ./gpu_out.
set -uo pipefail
STAGES="flow tests tests-allocator decoding decoding-quick decoding-nemo decoding-nemo-quick models models-compile models-depthwise models-cudnn-depthwise models-time-torch losses oomptimizer oomptimizer-rnnt oomptimizer-rnnt-chunked oomptimizer-aed ddp allocator allocator-roomy throughput-rnnt-prepare throughput-rnnt-train throughput-aed-prepare throughput-aed-train byo-models plan-calibration"
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
cd "$(dirname "$0")/.."
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
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log" | sed "s/^/[$name] /"
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 ))s ==="
  pack
  return $rc
}

output_of() {  # the result a stage writes (two parallel groups must not write the same one)
  case $1 in
    oomptimizer|oomptimizer-rnnt) echo oomptimizer ;;
    oomptimizer-aed) echo oomptimizer_aed ;;
    allocator-roomy) echo allocator_headroom15 ;;
    throughput-rnnt-*) echo throughput_large_rnnt ;;
    throughput-aed-*) echo throughput_xl_aed ;;
    *) echo "${1//-/_}" ;;
  esac
}

budget() {  # seconds left minus a margin, or nothing (and the stage is skipped) when under the minimum
  local margin=$1 minimum=$2 b; b=$(( $(left) - margin ))
  [ "$b" -ge "$minimum" ] && echo "$b"
}

stage() {  # one stage by name; budgets leave a margin inside the stage's limit
  local b
  case $1 in
    byo-models|plan-calibration|decoding|decoding-quick|decoding-nemo|oomptimizer-rnnt|oomptimizer-rnnt-chunked|oomptimizer-aed|allocator|allocator-roomy)
      b=$(budget 60 60) || { echo "=== $1: SKIPPED (less than a minute of budget left) ==="; return 1; } ;;
  esac
  case $1 in
    flow)             run_stage flow 420 env WORKBENCH_FLOW_OUT="$RESULTS" python3 -m pytest -q -s -m gpu \
                        -p no:cacheprovider tests/benchmarks/test_flow.py ;;
    tests)            # GPU_TESTS: the paths to run (default: every gpu test); GPU_TESTS_LIMIT: seconds. NeMo on the
                      # path, so the NeMo-gated gpu tests (ours beside NeMo's decoders) run too
                      nemo_site
                      run_stage tests "${GPU_TESTS_LIMIT:-150}" "${NEMO_ENV[@]}" \
                        python3 -m pytest -q -m gpu -p no:cacheprovider \
                        --durations=5 --ignore=tests/benchmarks/test_flow.py ${GPU_TESTS:-tests} ;;
    tests-allocator)  run_stage tests_allocator 120 python3 -m pytest -q -p no:cacheprovider \
                        tests/memory/test_allocator_gpu.py tests/benchmarks/test_bench_smoke.py::test_allocator_bench_smoke ;;
    decoding)         run_stage decoding 300 python3 -m benchmarks.decoding \
                        --budget-s $(( b < 250 ? b : 250 )) --out "$RESULTS" ;;
    decoding-quick)   run_stage decoding_quick 150 python3 -m benchmarks.decoding --quick \
                        --budget-s $(( b < 120 ? b : 120 )) --out "$RESULTS" ;;
    decoding-nemo-quick)  # B in {1, 16}, 12 s, fp32; the margin covers NeMo's import and the rows run last
                      nemo_site; b=$(budget 90 30) || { echo "=== $1: SKIPPED (less than two minutes left) ==="; return 1; }
                      run_stage decoding_nemo_quick 180 "${NEMO_ENV[@]}" \
                        python3 -m benchmarks.decoding --nemo --quick \
                        --budget-s $(( b < 80 ? b : 80 )) --out "$RESULTS" ;;
    decoding-nemo)    # the grid's budget; then NeMo's full graph at every size beside ours (up to 70 s), then the
                      # kernel profiles (6 profiled decodes: RNN-T and TDT at B=1, 16, 128, estimated under 15 s):
                      # the margin covers NeMo's import (~20 s) and those tails (they start up to 90 s after the budget).
                      # Alone after the flow (DEADLINE_S=590) it gets about 210 s: the whole grid's first pass
                      # (fp32 and bf16) needs more than the 160 s it had beside the tests stage
                      nemo_site; b=$(budget 130 60) || { echo "=== $1: SKIPPED (less than 190 s left) ==="; return 1; }
                      run_stage decoding_nemo 350 "${NEMO_ENV[@]}" \
                        python3 -m benchmarks.decoding --nemo --kernel-profile \
                        --budget-s $(( b < 220 ? b : 220 )) --out "$RESULTS" ;;
    byo-models)       # the OOMptimizer on torchaudio's, Hugging Face's and NeMo's models beside large-rnnt; the adapter
                      # tests (CPU ones too: torchaudio imports here) first, unless BYO_ADAPTER_TESTS=0
                      nemo_site
                      if [ "${BYO_ADAPTER_TESTS:-1}" != 0 ]; then
                        "${NEMO_ENV[@]}" python3 -m pytest -q -p no:cacheprovider tests/adapters > "$OUT/adapter_tests.log" 2>&1
                        tail -n 5 "$OUT/adapter_tests.log" | sed 's/^/[adapter-tests] /'
                      fi
                      b=$(budget 40 60) || { echo "=== $1: SKIPPED (less than 100 s left) ==="; return 1; }
                      # BYO_ARGS: e.g. "--models hf-whisper --name byo_models_whisper"
                      run_stage byo_models 400 "${NEMO_ENV[@]}" python3 -m benchmarks.byo_models \
                        --budget-s $(( b < 340 ? b : 340 )) --out "$RESULTS" ${BYO_ARGS:-} ;;
    plan-calibration) # the plan (traced on this host's CPU) against the real search, per probe and per bucket
                      nemo_site
                      run_stage plan_calibration 400 "${NEMO_ENV[@]}" python3 -m benchmarks.plan_calibration \
                        --budget-s $(( b < 340 ? b : 340 )) --out "$RESULTS" ${CALIBRATION_ARGS:-} ;;
    models)           run_stage models 330 python3 -m benchmarks.models --kernels --out "$RESULTS" ;;
    models-compile)   # the MFU targets' models at their profile shapes, encoder blocks compiled
                      run_stage models_compile 330 python3 -m benchmarks.models --compile --only-profile-shapes \
                        --models xl-aed large-rnnt large-tdt --name models_compile --out "$RESULTS" ;;
    models-depthwise) # the same profile shapes, the subsampling's depthwise convolutions by the Triton kernels
                      run_stage models_depthwise 330 python3 -m benchmarks.models --depthwise triton \
                        --only-profile-shapes --models large-rnnt large-tdt xl-aed --name models_depthwise \
                        --out "$RESULTS" ;;
    models-cudnn-depthwise)  # the same, the depthwise convolutions by cuDNN (--depthwise torch)
                      run_stage models_cudnn_depthwise 330 python3 -m benchmarks.models --depthwise torch \
                        --only-profile-shapes --models large-rnnt large-tdt xl-aed --name models_cudnn_depthwise \
                        --out "$RESULTS" ;;
    models-time-torch)  # the transducer and xl-aed profile shapes with the convolution modules' depthwise convolutions
                      # by torch (nn.Conv1d), the reference for the Triton kernels that the default (auto) runs on CUDA
                      run_stage models_time_torch 330 python3 -m benchmarks.models --time-depthwise torch \
                        --only-profile-shapes --models large-rnnt xl-aed --name models_time_torch --out "$RESULTS" ;;
    losses)           run_stage losses 240 python3 -m benchmarks.losses --out "$RESULTS" ;;  # with the rows part
    oomptimizer)      run_stage oomptimizer 360 python3 -m benchmarks.oomptimizer --out "$RESULTS" ;;
    oomptimizer-rnnt) run_stage oomptimizer_rnnt 540 python3 -m benchmarks.oomptimizer --part rnnt \
                        --time-limit-s $(( b - 30 )) --out "$RESULTS" ;;
    oomptimizer-rnnt-chunked)  # the two predictive searches only; a bucket under way finishes after the limit.
                      # CHUNKED_BUCKETS=START:STOP: only those buckets (record oomptimizer_rnnt_chunked_START_STOP)
                      run_stage oomptimizer_rnnt_chunked 330 python3 -m benchmarks.oomptimizer \
                        --part rnnt-chunked ${CHUNKED_BUCKETS:+--buckets "$CHUNKED_BUCKETS"} \
                        --time-limit-s $(( b < 280 ? b - 30 : 250 )) --out "$RESULTS" ;;
    oomptimizer-aed)  run_stage oomptimizer_aed 300 python3 -m benchmarks.oomptimizer --part aed \
                        --time-limit-s "$b" --out "$RESULTS" ;;
    ddp)              run_stage ddp 160 python3 -m benchmarks.oomptimizer --nproc 2 --out "$RESULTS" ;;
    allocator)        run_stage allocator 540 python3 -m benchmarks.allocator \
                        --budget-s "$b" --out "$RESULTS" ;;
    allocator-roomy)  run_stage allocator_roomy 540 python3 -m benchmarks.allocator --headroom 0.15 \
                        --name allocator_headroom15 --budget-s "$b" --out "$RESULTS" ;;
    throughput-*)     # a later part reads the record of this call's earlier part, else benchmarks/results
                      local m=large-rnnt steps=30 from=(); [ "${1#throughput-aed}" != "$1" ] && m=xl-aed steps=20
                      [ -f "$RESULTS/$(output_of "$1").json" ] && from=(--from "$RESULTS/$(output_of "$1").json")
                      run_stage "${1//-/_}" 540 python3 -m benchmarks.throughput --model $m \
                        --part "${1##*-}" --steps $steps --seconds 60 "${from[@]}" --out "$RESULTS" ;;
    *) echo "unknown stage $1"; return 1 ;;
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
