"""The models bench's kernel table (--kernels): the profiler rows it keeps and how the record reads them."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.profiling import TOP_KERNELS
from workbench.records import models as record

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def _event(key, device_type, self_device_us=0.0, self_cpu_us=0.0, count=1):
    return SimpleNamespace(key=key, device_type=device_type, self_device_time_total=self_device_us,
                           self_cpu_time_total=self_cpu_us, count=count)


def test_top_kernels_keeps_cuda_kernels_by_self_device_time_and_their_share():
    from benchmarks.profiling import top_kernels

    events = [_event("aten::mm", CPU, self_cpu_us=900.0), _event("sm90_gemm", CUDA, 600.0, count=4),
              _event("fmha_fwd", CUDA, 300.0, count=2), _event("elementwise", CUDA, 100.0, count=9),
              _event("idle", CUDA, 0.0)]
    got = top_kernels(events, "cuda", top=2)
    assert got == {"total_s": 1e-3, "top": [{"name": "sm90_gemm", "self_s": 6e-4, "share": 0.6, "calls": 4},
                                            {"name": "fmha_fwd", "self_s": 3e-4, "share": 0.3, "calls": 2}]}
    on_cpu = top_kernels(events, "cpu", top=5)
    assert on_cpu["top"] == [{"name": "aten::mm", "self_s": 9e-4, "share": 1.0, "calls": 1}]


def test_kernel_line_and_table_name_the_top_kernel_and_its_share():
    profile = {"dtype": "bf16", "batch_size": 16, "duration_s": 15.0, "num_tokens": 120, "device": "cuda",
               "total_s": 0.25, "top": [{"name": "k" * 70, "self_s": 0.1, "share": 0.4, "calls": 34},
                                        {"name": "fmha", "self_s": 0.05, "share": 0.2, "calls": 17}]}
    line = record.kernel_line("large-rnnt", profile)
    assert line == f"large-rnnt top kernel (bf16 B=16 15 s on cuda): {'k' * 57}... 40.0% of 250 ms"
    table = record.kernel_table_lines({"large-rnnt": profile}, rows=2)
    assert table[0] == line and len(table) == 3 and table[2].split() == ["20.0%", "50.000", "ms", "17x", "fmha"]
    assert record.kernel_line("xl-aed", {**profile, "top": [], "oom": True}).endswith(": OOM")


def test_models_bench_smoke_with_kernels_writes_the_table(tmp_path, capsys, cpu_settings_kept):
    from benchmarks.models import run as models

    assert models.main(["--smoke", "--kernels", "--models", "tiny-rnnt", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "models.json").read_text())
    profile = result["figures"]["kernels"]["tiny-rnnt"]
    assert result["params"]["kernel_shape"] == list(models.SMOKE_KERNEL_SHAPE)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert profile["device"] == device and profile["total_s"] > 0 and 0 < len(profile["top"]) <= TOP_KERNELS
    shares = [k["share"] for k in profile["top"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    summary = record.summary_lines(result["figures"])
    assert [line for line in summary if "top kernel" in line] == [f"- {record.kernel_line('tiny-rnnt', profile)}"]
    assert record.kernel_line("tiny-rnnt", profile) in capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_models_bench_kernels_lists_cuda_kernels(tmp_path, capsys, cpu_settings_kept):
    test_models_bench_smoke_with_kernels_writes_the_table(tmp_path, capsys, cpu_settings_kept)
    profile = json.loads((tmp_path / "models.json").read_text())["figures"]["kernels"]["tiny-rnnt"]
    assert profile["device"] == "cuda" and not any(k["name"].startswith("aten::") for k in profile["top"])


def test_models_bench_compile_smoke_records_it_under_its_name(tmp_path, cpu_settings_kept, monkeypatch):
    from benchmarks.models import run as models
    from benchmarks.models import rows

    compiled = []
    monkeypatch.setattr(rows, "compile_encoder_layers", lambda model: compiled.append(model) or model)
    args = ["--smoke", "--compile", "--name", "models_compile", "--models", "tiny-aed", "--out", str(tmp_path)]
    assert models.main(args) == 0
    result = json.loads((tmp_path / "models_compile.json").read_text())
    assert result["params"]["compile"] is True and "compiled with torch.compile" in result["what"]
    assert [m.config.name for m in compiled] == ["tiny-aed"] and not (tmp_path / "models.json").exists()


KERNEL_SMOKE = """
import sys
sys.path.insert(0, "tests")
import triton_interpreter  # noqa: F401 - the CPU interpreter (when there is no CUDA), before triton loads
import importlib
from benchmarks.models import run

module_name, function_name, *options = sys.argv[2:]
module = importlib.import_module("workbench.models." + module_name)
function = getattr(module, function_name)
run.SMOKE_SHAPES, run.SMOKE_REPEAT, run.SMOKE_WARMUP = [(1, 0.5, 4)], 1, 1  # the interpreter is slow
calls = []
setattr(module, function_name, lambda *args: calls.append(1) or function(*args))
code = run.main(["--smoke", *options, "--models", "tiny-rnnt", "--out", sys.argv[1]])
print("kernel calls", len(calls))
sys.exit(code)
"""


def kernel_smoke(out, kernels: str, options: list[str]) -> tuple[dict, int]:
    """A models-bench smoke run with ``options`` in its own process (the CPU interpreter without CUDA),
    counting the calls of ``kernels`` ("module:function", a custom op its entry point calls): (the record named
    by --name, calls)."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", KERNEL_SMOKE, str(out), *kernels.split(":"), *options], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = options[options.index("--name") + 1]
    return json.loads((out / f"{name}.json").read_text()), int(proc.stdout.split("kernel calls ")[-1])


def test_models_bench_depthwise_triton_smoke_runs_the_kernels_and_records_it(tmp_path):
    """A smoke run with --depthwise triton: the steps run the Triton depthwise convolutions, and the record says
    so under its own name."""
    result, calls = kernel_smoke(tmp_path, "depthwise_triton:depthwise_conv3x3_s2_op",
                                 ["--depthwise", "triton", "--name", "models_depthwise"])
    steps = result["figures"]["steps"]
    assert steps and all("step_s" in r and r["flops"] > 0 for r in steps)
    assert len(steps) == 2 and calls >= 2 * 2 * len(steps)  # two stages in each warm-up and timed step
    assert result["params"]["depthwise"] == "triton" and "depthwise convolutions by Triton kernels" in result["what"]
    assert not (tmp_path / "models.json").exists()


def test_models_bench_time_depthwise_triton_smoke_runs_the_kernels_and_records_it(tmp_path):
    """--time-depthwise triton: every conformer block's depthwise convolution runs the Triton kernels in the
    timed steps, and the record's params and description say so."""
    result, calls = kernel_smoke(tmp_path, "time_conv_triton:time_depthwise_conv_op",
                                 ["--depthwise", "torch", "--time-depthwise", "triton", "--name",
                                  "models_time_depthwise"])
    steps = result["figures"]["steps"]
    assert len(steps) == 2 and all("step_s" in r and r["flops"] > 0 for r in steps)
    assert calls >= 2 * 2 * len(steps)  # tiny models have 2 blocks: each warm-up and timed step runs both
    assert result["params"]["time_depthwise"] == "triton" and result["params"]["depthwise"] == "torch"
    assert "convolution modules' depthwise convolutions by Triton kernels" in result["what"]


def test_models_bench_records_the_default_time_depthwise_it_ran(tmp_path, monkeypatch):
    """Without --time-depthwise the record names what build_model's default ran on this device."""
    from benchmarks.models import run as models
    from benchmarks.harness import bench_device
    from workbench.models.config import DEFAULT_TIME_DEPTHWISE
    from workbench.models.encoder import depthwise_backend

    monkeypatch.setattr(models, "SMOKE_SHAPES", [(1, 0.5, 4)])
    assert models.main(["--smoke", "--models", "tiny-ctc", "--out", str(tmp_path), "--depthwise", "torch"]) == 0
    params = json.loads((tmp_path / "models.json").read_text())["params"]
    assert params["time_depthwise"] == depthwise_backend(DEFAULT_TIME_DEPTHWISE, bench_device(), which="time")
    assert params["time_depthwise"] in ("torch", "triton")  # what ran, never "auto"


def test_models_bench_counts_the_flops_of_a_triton_depthwise_model_on_torch_convolutions():
    """The count runs the torch convolutions (no kernel, so no interpreter, needed on the CPU), equals the
    default model's, and leaves the option as it was."""
    from benchmarks.models import rows as models
    from workbench.models import build_model

    torch.manual_seed(0)
    default = build_model("tiny-ctc")
    with_triton = build_model("tiny-ctc", depthwise="triton")
    shape = {"batch_size": 2, "duration_s": 0.5, "num_tokens": 4}
    failures = []
    counts = [models.count_flops(m, "tiny-ctc", shape, failures, device=torch.device("cpu"))
              for m in (default, with_triton)]
    assert failures == [] and counts[0] > 0 and counts[0] == counts[1]
    assert with_triton.encoder.subsampling.depthwise == "triton"


def test_models_bench_refuses_an_unknown_depthwise_option(capsys):
    from benchmarks.models import run as models

    with pytest.raises(SystemExit) as exit_info:
        models.main(["--smoke", "--depthwise", "cudnn", "--out", "/tmp/unused"])
    assert exit_info.value.code == 2
    assert "argument --depthwise: invalid choice: 'cudnn'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the Triton kernels run")
def test_models_bench_depthwise_triton_without_cuda_or_interpreter_stops_at_once(tmp_path):
    """On a CPU without Triton's interpreter, --depthwise triton exits 2 with one line before measuring."""
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(repo)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.models", "--smoke", "--depthwise", "triton",
                           "--out", str(tmp_path)], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("--depthwise triton: ")
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == []


def test_kernel_labels_keep_the_kernel_and_what_it_wraps():
    reduce = ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t"
              "<c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()>, 4, 8> >(x)")
    add = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
           "<c10::BFloat16> >(at::TensorIteratorBase&)::{lambda(int)#1}>(int)")
    norm = "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u>(long)"
    assert record.kernel_label(reduce) == "reduce_kernel: sum"
    assert record.kernel_label(add) == "elementwise_kernel: add"
    assert record.kernel_label(norm) == "GammaBetaBackwardCUDAKernelTemplate"
    assert record.kernel_label("_grad_kernel") == "_grad_kernel"
    assert record.kernel_label("nvjet_" + "x" * 60, width=10) == "nvjet_xxx…"


def _kernels(*shares):
    return {"top": [{"name": name, "self_s": share * 0.02, "share": share, "calls": 3} for name, share in shares],
            "total_s": 0.02}


def test_kernel_table_and_its_meaning():
    figures = {"kernels": {"a": _kernels(("nvjet_sm90_tst_128x256", 0.12), ("_grad_kernel", 0.05)),
                           "b": _kernels(("reduce_kernel", 0.08), ("copy", 0.02), ("extra", 0.01))}}
    html = record.kernel_table(figures, rows=2).to_html()
    assert "share of kernel time (%)" in html and ">12.0<" in html and ">2.40<" in html and "extra" not in html
    assert record.meaning_of_kernels(figures, rows=2) == (
        "No kernel dominates a step: the largest takes at most 12 % of a model's kernel time (a), and each "
        "model's top 2 together 10-17 %; 1 of those 4 are matmuls.")
    figures["kernels"]["b"] = _kernels(("reduce_kernel", 0.6))
    assert record.meaning_of_kernels(figures).startswith("One kernel dominates a step: the largest takes at most 60 %")
    assert record.meaning_of_kernels({}).startswith("The committed models record has no kernel profile")
    assert record.meaning_of_kernels(None).startswith("The committed models record has no kernel profile")
