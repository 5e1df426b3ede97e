"""The decoders' CUDA-only paths on CPU with the device facts faked: the support checks' every answer, the
driver-call helpers, the graph-mode choice for a CUDA device, and the capture / reuse / replay plumbing
with stand-in graphs that run each stage eagerly. Plus a few GPU-only checks the other GPU tests miss."""

import ctypes
import logging
import types

import numpy as np
import pytest
import torch

from workbench.decoding import GreedyTransducerDecoder, cuda_graphs, label_looping, make_toy_transducer
from workbench.decoding import greedy as greedy_module


class GraphWithRawHandle:
    """A torch.cuda.CUDAGraph that can hand out its raw graph (what full graphs need)."""

    def __init__(self, keep_graph=False):
        self.keep_graph = keep_graph

    def raw_cuda_graph(self):
        return 0


def fake_driver(version_result):
    return types.SimpleNamespace(cuDriverGetVersion=lambda: version_result)


@pytest.fixture
def cuda_machine(monkeypatch):
    """torch says a CUDA device is there; torch is a CUDA build whose graphs hand out raw handles."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", GraphWithRawHandle)
    return monkeypatch


def test_full_graph_reason_for_each_missing_piece(cuda_machine):
    mp = cuda_machine
    compiled = []
    mp.setattr(cuda_graphs, "condition_kernels", lambda index: compiled.append(index) or {})
    mp.setattr(cuda_graphs, "_cuda_python", lambda: (fake_driver((0, 12060)), None, None))
    assert cuda_graphs.full_graph_unsupported_reason() is None and compiled == [0]
    assert cuda_graphs.full_graph_unsupported_reason(torch.device("cuda", 3)) is None and compiled[-1] == 3
    assert cuda_graphs.full_graph_unsupported_reason(torch.device("cuda")) is None and compiled[-1] == 0

    mp.setattr(cuda_graphs, "_cuda_python", lambda: (fake_driver((0, 12020)), None, None))
    assert cuda_graphs.full_graph_unsupported_reason() == \
        "CUDA driver 12.2 is older than 12.6 (conditional graph nodes are unreliable before it)"
    mp.setattr(cuda_graphs, "_cuda_python", lambda: (fake_driver((999, 0)), None, None))
    assert cuda_graphs.full_graph_unsupported_reason() == \
        "cannot read the CUDA driver version: cuDriverGetVersion failed: 999"

    def no_bindings():
        raise ImportError("No module named 'cuda'")

    mp.setattr(cuda_graphs, "_cuda_python", no_bindings)
    assert cuda_graphs.full_graph_unsupported_reason() == \
        "cuda-python (cuda.bindings) is not usable: No module named 'cuda'"

    def nvrtc_fails(index):
        raise RuntimeError("NVRTC: NVRTC_ERROR_INVALID_OPTION: bad architecture")

    mp.setattr(cuda_graphs, "_cuda_python", lambda: (fake_driver((0, 13000)), None, None))
    mp.setattr(cuda_graphs, "condition_kernels", nvrtc_fails)
    assert cuda_graphs.full_graph_unsupported_reason() == \
        "compiling the condition kernel with NVRTC failed: NVRTC: NVRTC_ERROR_INVALID_OPTION: bad architecture"


def test_full_graph_reason_for_torch_builds_that_cannot(cuda_machine):
    mp = cuda_machine
    mp.setattr(cuda_graphs, "_cuda_python", lambda: pytest.fail("the torch check comes first"))

    class GraphWithoutRaw:
        def __init__(self, keep_graph=False):
            pass

    class GraphWithoutKeep:  # a torch before keep_graph
        def __init__(self):
            pass

    for graph_class, words in ((GraphWithoutRaw, "no raw_cuda_graph()"), (GraphWithoutKeep, "keep_graph")):
        mp.setattr(torch.cuda, "CUDAGraph", graph_class)
        reason = cuda_graphs.full_graph_unsupported_reason()
        assert reason.startswith(f"torch {torch.__version__} cannot hand out captured graphs") and words in reason
    mp.setattr(torch.version, "hip", "6.2.0")
    assert cuda_graphs.full_graph_unsupported_reason() == "torch is built for ROCm/HIP; conditional nodes need CUDA"


def test_partial_graph_reason(cuda_machine):
    assert cuda_graphs.partial_graph_unsupported_reason() is None
    cuda_machine.delattr(torch.cuda, "CUDAGraph")
    assert cuda_graphs.partial_graph_unsupported_reason() == f"torch {torch.__version__} has no CUDA graphs"
    cuda_machine.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_graphs.partial_graph_unsupported_reason() == "no CUDA device"


def test_check_unwraps_driver_results_and_names_the_failing_call():
    assert cuda_graphs._check((0, 7), "cuX") == 7
    assert cuda_graphs._check((0, 1, 2), "cuX") == (1, 2)
    assert cuda_graphs._check(0, "cuX") == ()  # calls that return only an error code
    with pytest.raises(RuntimeError, match="^cuGraphLaunch failed: 700$"):
        cuda_graphs._check((700,), "cuGraphLaunch")


def test_kernel_args_point_at_their_values():
    args = cuda_graphs.KernelArgs(np.array([11, 2**40 + 5, 3], dtype=np.uint64))
    assert [int(p) for p in args.pointers] == [args.values.ctypes.data + 8 * i for i in range(3)]
    assert [ctypes.c_uint64.from_address(int(p)).value for p in args.pointers] == [11, 2**40 + 5, 3]


def test_handle_value_reads_the_handle_through_its_pointer():
    cell = ctypes.c_uint64(2**63 + 9)
    handle = types.SimpleNamespace(getPtr=lambda: ctypes.addressof(cell))
    assert cuda_graphs._handle_value(handle) == 2**63 + 9


def test_bindings_major_picks_the_call_signatures(monkeypatch):
    bindings = pytest.importorskip("cuda.bindings")
    for version, major in (("12.9.0", 12), ("13.0.1", 13)):
        monkeypatch.setattr(bindings, "__version__", version)
        assert cuda_graphs._bindings_major() == major


def toy(durations=None):
    return make_toy_transducer(vocab_size=12, enc_dim=6, pred_dim=10, joint_dim=10, durations=durations,
                               blank_bias=2.0, logit_scale=4.0, seed=2, dtype=torch.float64)


def test_mode_for_a_cuda_device_asks_the_support_checks_once_and_remembers_failures(monkeypatch, caplog):
    asked = []
    monkeypatch.setattr(cuda_graphs, "full_graph_unsupported_reason",
                        lambda device=None: asked.append(("full", device)) or "driver 12.2 < 12.6")
    monkeypatch.setattr(cuda_graphs, "partial_graph_unsupported_reason",
                        lambda device=None: asked.append(("partial", device)) or None)
    p, j = toy()
    gpu = torch.device("cuda", 0)
    dec = GreedyTransducerDecoder(p, j, blank_id=12)
    greedy_module._already_logged.clear()
    with caplog.at_level(logging.INFO, logger="workbench.decoding"):
        assert dec._choose_mode(gpu) == "partial" and dec._choose_mode(gpu) == "partial"
    assert asked == [("full", gpu), ("partial", gpu)]  # once per device
    (note,) = [r for r in caplog.records if "driver 12.2" in r.message]
    assert note.levelno == logging.WARNING  # a GPU without full graphs is worth a warning
    dec._failed_modes.add("partial")  # a partial capture failed at run time
    with caplog.at_level(logging.INFO, logger="workbench.decoding"):
        assert dec._choose_mode(gpu) == "off" and dec.mode_used == "off"
    assert any("an earlier partial capture failed" in r.message for r in caplog.records)
    asked.clear()
    for kw in (dict(cuda_graphs="off"), dict(algorithm="frame_looping")):
        assert GreedyTransducerDecoder(p, j, blank_id=12, **kw)._choose_mode(gpu) == "off"
    assert asked == []  # no graphs wanted: the device is not examined
    with pytest.raises(RuntimeError, match="cuda_graphs='full' is not supported here: driver 12.2"):
        GreedyTransducerDecoder(p, j, blank_id=12, cuda_graphs="full")._choose_mode(gpu)


class StageReplay:
    """Stands in for one captured stage graph: replay runs the stage on the CPU, on the same buffers."""

    def __init__(self, fn):
        self.fn, self.replays = fn, 0

    def replay(self):
        self.replays += 1
        self.fn()


class LoopedFullGraph:
    """Stands in for FullGraph: the same loop structure (start; while outer {first; while inner {again};
    emit}), driven from Python over the stage graphs."""

    def __init__(self, stages, outer_flag, inner_flag, device):
        self.stages, self.outer, self.inner = stages, outer_flag, inner_flag

    def replay(self):
        s = self.stages
        s["start"].replay()
        while bool(self.outer):
            s["find_label_first"].replay()
            while bool(self.inner):
                s["find_label_again"].replay()
            s["emit_labels"].replay()


@pytest.fixture
def stand_in_graphs(monkeypatch):
    captured = []

    def capture(stages, device):
        assert list(stages) == ["start", "find_label_first", "find_label_again", "emit_labels"]
        captured.append({name: StageReplay(fn) for name, fn in stages.items()})
        return captured[-1]

    monkeypatch.setattr(cuda_graphs, "capture_partial_graphs", capture)
    monkeypatch.setattr(cuda_graphs, "FullGraph", LoopedFullGraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return captured


@pytest.mark.parametrize("mode", ["partial", "full"])
@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3]], ids=["rnnt", "tdt"])
def test_graph_plumbing_reuses_buffers_for_smaller_inputs_and_recaptures_for_larger(stand_in_graphs, mode,
                                                                                    durations):
    p, j = toy(durations)
    off = GreedyTransducerDecoder(p, j, blank_id=12, durations=durations, cuda_graphs="off")
    dec = GreedyTransducerDecoder(p, j, blank_id=12, durations=durations, cuda_graphs=mode)
    gen = torch.Generator().manual_seed(0)
    emitted = 0
    shapes = [(4, 8), (2, 4), (4, 8), (1, 1), (6, 6), (3, 10)]
    for (b, t), captures in zip(shapes, [1, 1, 1, 1, 2, 3]):
        enc = torch.randn(b, t, 6, generator=gen, dtype=torch.float64)
        lengths = torch.randint(0, t + 1, (b,), generator=gen)
        with torch.inference_mode():
            got = dec._decode_with_graphs(mode, enc, lengths)
        want = off(enc, lengths)
        emitted += sum(len(h.tokens) for h in want)
        assert [(h.tokens, h.timestamps) for h in got] == [(h.tokens, h.timestamps) for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-12)
        assert dec.captures == captures == len(stand_in_graphs)
        if mode == "partial":
            assert dec.last_stats == off.last_stats  # the Python loop replays as often as eager loops
    assert emitted > 10  # labels were decoded, not only blanks
    buffers = dec._captured.buffers
    assert (buffers.batch_capacity, buffers.frame_capacity) == (6, 10)  # grown to the largest of both
    assert dec._captured.key == (mode, 6, torch.float64, torch.device("cpu"), 6, 10)
    if mode == "full":
        assert isinstance(dec._captured.graphs, LoopedFullGraph) and dec._captured.keep_alive
    assert stand_in_graphs[0]["start"].replays == 4  # the first capture served four calls


def test_reset_releases_the_graphs_and_waits_for_the_device(stand_in_graphs, monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    p, j = toy()
    dec = GreedyTransducerDecoder(p, j, blank_id=12, cuda_graphs="partial")
    with torch.inference_mode():
        dec._decode_with_graphs("partial", torch.randn(2, 5, 6, dtype=torch.float64), torch.tensor([5, 3]))
    assert dec._captured is not None
    dec.reset()
    assert dec._captured is None and synced[-1] is None


@pytest.mark.gpu
def test_gpu_nvrtc_failure_carries_the_compiler_log(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "CONDITION_KERNELS_SOURCE", 'extern "C" __global__ void k() { undeclared(); }')
    with pytest.raises(RuntimeError, match=r"(?s)^NVRTC: .*undeclared"):
        cuda_graphs.condition_kernels.__wrapped__(torch.cuda.current_device())  # uncached: this source only


@pytest.mark.gpu
def test_gpu_live_speed_table_measures_every_graph_mode_with_equal_hypotheses():
    from workbench.decoding.speed import live_speed_record

    rows = live_speed_record(batches=(2,), frames=8, repeat=1)["figures"]["rows"]
    methods = {(r["model"], r["method"]) for r in rows}
    fused = label_looping.resolve_kernels("auto", device=torch.device("cuda"))[0] != "torch"
    for model in ("rnnt", "tdt"):
        assert {(model, f"label-looping {m}") for m in ("off", "partial", "full")} <= methods
        assert fused == ({(model, f"label-looping fused {m}") for m in ("off", "partial", "full")} <= methods)
        labels = {r["labels_per_frame"] for r in rows if r["model"] == model}
        assert len(labels) == 1  # every method decoded the same labels
    assert all(r["time_s"]["median"] > 0 for r in rows)
