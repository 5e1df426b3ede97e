"""The full graph's node layout, built against a recording stand-in for cuda-python's driver (CPU)."""

import ctypes
import types

import pytest

from workbench.decoding import cuda_graphs


class FakeDriver:
    """Records every graph call; each new graph, node and handle is a fresh integer."""

    def __init__(self):
        self.calls, self.next_id = [], 100

    def _new(self):
        self.next_id += 1
        return self.next_id

    def cuGraphCreate(self, flags):
        return 0, self._new()

    def cuCtxGetCurrent(self):
        return 0, "ctx"

    def cuGraphConditionalHandleCreate(self, graph, ctx, value, flags):
        handle = self._new()
        self.calls.append(("handle", graph, handle))
        return 0, handle

    def CUgraph(self, raw):
        return raw

    def cuGraphAddChildGraphNode(self, parent, deps, n, raw):
        node = self._new()
        self.calls.append(("child", parent, list(deps), raw, node))
        return 0, node

    def CUDA_KERNEL_NODE_PARAMS(self):
        return types.SimpleNamespace()

    def cuGraphAddKernelNode(self, parent, deps, n, params):
        node = self._new()
        slots = [ctypes.c_uint64.from_address(params.kernelParams + 8 * i).value for i in range(2)]
        handle, flag = (ctypes.c_uint64.from_address(a).value for a in slots)  # the kernel's two arguments
        self.calls.append(("condition", parent, list(deps), params.func, node, handle, flag))
        return 0, node

    def CUgraphNodeParams(self):
        return types.SimpleNamespace(conditional=types.SimpleNamespace(phGraph_out=[None]))

    CUgraphNodeType = types.SimpleNamespace(CU_GRAPH_NODE_TYPE_CONDITIONAL="conditional")
    CUgraphConditionalNodeType = types.SimpleNamespace(CU_GRAPH_COND_TYPE_WHILE="while")

    def cuGraphAddNode(self, parent, deps, edges, n, params):
        node, body = self._new(), self._new()
        params.conditional.phGraph_out[0] = body
        self.calls.append(("while", parent, list(deps), params.conditional.handle, node, body))
        return 0, node

    def cuGraphInstantiate(self, graph, flags):
        self.calls.append(("instantiate", graph))
        return 0, "exec"

    def cuGraphExecDestroy(self, exec_):
        return 0

    def cuGraphDestroy(self, graph):
        return 0


class Stage:
    def __init__(self, name):
        self.name = name

    def raw_cuda_graph(self):
        return self.name


class Flag:
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(cuda_graphs, "_cuda_python", lambda: (fake, None, None))
    monkeypatch.setattr(cuda_graphs, "condition_kernels", lambda index: {"while_flag": "K_flag",
                                                                          "while_count_down": "K_count"})
    monkeypatch.setattr(cuda_graphs, "_handle_value", lambda handle: handle)
    monkeypatch.setattr(cuda_graphs, "_bindings_major", lambda: 13)
    return fake


def test_full_graph_nests_the_inner_loop_in_the_outer_one(driver):
    import torch

    stages = {name: Stage(name) for name in ("start", "find_label_first", "find_label_again", "emit_labels")}
    cuda_graphs.FullGraph(stages, Flag(1), Flag(2), torch.device("cuda", 0))
    calls = driver.calls
    (_, root, outer), (_, _, inner) = calls[0], calls[1]
    start = calls[2]
    assert start[:4] == ("child", root, [], "start")
    assert calls[3][:4] == ("condition", root, [start[4]], "K_flag")  # whether to enter the outer loop
    w_outer = calls[4]
    assert w_outer[:4] == ("while", root, [calls[3][4]], outer)
    outer_body = w_outer[5]
    first, cond_inner, w_inner = calls[5], calls[6], calls[7]
    assert first[:4] == ("child", outer_body, [], "find_label_first")
    assert cond_inner[:4] == ("condition", outer_body, [first[4]], "K_flag")
    assert w_inner[:4] == ("while", outer_body, [cond_inner[4]], inner)
    again, again_cond = calls[8], calls[9]
    assert again[:4] == ("child", w_inner[5], [], "find_label_again")
    assert again_cond[:4] == ("condition", w_inner[5], [again[4]], "K_flag")  # repeat the inner loop?
    emit, emit_cond = calls[10], calls[11]
    assert emit[:4] == ("child", outer_body, [w_inner[4]], "emit_labels")  # after the inner loop
    assert emit_cond[:4] == ("condition", outer_body, [emit[4]], "K_flag")  # repeat the outer loop?
    assert calls[12] == ("instantiate", root) and len(calls) == 13
    # each condition sets its own loop's handle from its own flag (outer: Flag(1), inner: Flag(2))
    conditions = [c for c in calls if c[0] == "condition"]
    assert [c[5:] for c in conditions] == [(outer, 1), (inner, 2), (inner, 2), (outer, 1)]


def test_stage_captures_run_with_the_cyclic_collector_paused(monkeypatch):
    """A collection inside a capture could free another CUDA graph (a CUDA call that invalidates the capture),
    so each stage runs with gc paused, and gc is on again afterwards."""
    import contextlib
    import gc

    seen = []

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def graph(cuda_graph, **kwargs):
        seen.append(("capture", kwargs["capture_error_mode"]))
        yield

    monkeypatch.setattr(cuda_graphs.torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(cuda_graphs.torch.cuda, "Stream", Stream)
    monkeypatch.setattr(cuda_graphs.torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(cuda_graphs.torch.cuda, "CUDAGraph", lambda keep_graph: object())
    monkeypatch.setattr(cuda_graphs.torch.cuda, "graph", graph)
    stages = {name: (lambda name=name: seen.append((name, gc.isenabled()))) for name in ("start", "again")}
    assert gc.isenabled()
    graphs = cuda_graphs.capture_partial_graphs(stages, "cuda")
    assert list(graphs) == ["start", "again"]
    assert seen == [("capture", "thread_local"), ("start", False), ("capture", "thread_local"), ("again", False)]
    assert gc.isenabled()
