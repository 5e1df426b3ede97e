"""CUDA-graph machinery for the decoders: support checks, the NVRTC condition kernels, graphs with
conditional WHILE nodes built with the driver's graph API, and the ``partial`` / ``full`` runners.

Import-safe everywhere: cuda-python (``cuda.bindings``) is imported only when a full graph is built.
``full`` needs a CUDA driver >= 12.6 (conditional nodes are buggy before), cuda-python and NVRTC.
The full graph is assembled with the driver's graph API from the four stage graphs that ``partial``
replays (cloned in as child graph nodes), so all its memory lives in their torch graph pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

MIN_DRIVER_VERSION = 12060  # CUDA 12.6, as cuDriverGetVersion reports it

CONDITION_KERNELS_SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                     unsigned int value);

// Loop again while *flag is true.
extern "C" __global__ void while_flag(cudaGraphConditionalHandle handle, const bool* flag)
{
    cudaGraphSetConditional(handle, *flag ? 1u : 0u);
}

// Loop while *remaining > 0, taking one off each time (used to time an empty loop iteration).
extern "C" __global__ void while_count_down(cudaGraphConditionalHandle handle, int* remaining)
{
    int left = *remaining;
    if (left > 0) { *remaining = left - 1; }
    cudaGraphSetConditional(handle, left > 0 ? 1u : 0u);
}
"""


def _cuda_python():
    from cuda.bindings import driver, nvrtc, runtime

    return driver, runtime, nvrtc


def _check(result, what: str):
    """cuda-python calls return (error, *values): raise on error, return the values (one value unwrapped)."""
    if not isinstance(result, tuple):
        result = (result,)
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else tuple(values)


def _bindings_major() -> int:
    from cuda import bindings

    return int(str(getattr(bindings, "__version__", "12")).split(".")[0])


def full_graph_unsupported_reason(device: torch.device | None = None) -> str | None:
    """None when full graphs (conditional nodes) can be built on ``device``, else why not (one line)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if getattr(torch.version, "hip", None):
        return "torch is built for ROCm/HIP; conditional nodes need CUDA"
    try:
        if not hasattr(torch.cuda.CUDAGraph(keep_graph=True), "raw_cuda_graph"):
            raise TypeError("no raw_cuda_graph()")
    except Exception as e:  # noqa: BLE001 - any failure is the reason full graphs are off
        return f"torch {torch.__version__} cannot hand out captured graphs (keep_graph/raw_cuda_graph): {e}"
    try:
        driver, _, _ = _cuda_python()
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install
        return f"cuda-python (cuda.bindings) is not usable: {e}"
    try:
        version = _check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    except Exception as e:  # noqa: BLE001 - any failure is the reason full graphs are off
        return f"cannot read the CUDA driver version: {e}"
    if version < MIN_DRIVER_VERSION:
        return (f"CUDA driver {version // 1000}.{version % 1000 // 10} is older than 12.6 "
                "(conditional graph nodes are unreliable before it)")
    try:
        condition_kernels(torch.cuda.current_device() if device is None or device.index is None else device.index)
    except Exception as e:  # noqa: BLE001 - any failure is the reason full graphs are off
        return f"compiling the condition kernel with NVRTC failed: {e}"
    return None


def partial_graph_unsupported_reason(device: torch.device | None = None) -> str | None:
    """None when plain CUDA graphs can be captured, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not hasattr(torch.cuda, "CUDAGraph"):
        return f"torch {torch.__version__} has no CUDA graphs"
    return None


@functools.lru_cache(maxsize=None)
def condition_kernels(device_index: int) -> dict[str, Any]:
    """Compile CONDITION_KERNELS_SOURCE with NVRTC for this device; returns {name: CUfunction}."""
    driver, _, nvrtc = _cuda_python()
    with torch.cuda.device(device_index):
        torch.zeros(1, device="cuda")  # make sure torch's primary context is current
        major, minor = torch.cuda.get_device_capability(device_index)
        program = _check(nvrtc.nvrtcCreateProgram(CONDITION_KERNELS_SOURCE.encode(), b"while_conditions.cu",
                                                  0, [], []), "nvrtcCreateProgram")
        options = [f"--gpu-architecture=compute_{major}{minor}".encode()]
        compiled = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if int(compiled[0]) != 0:
            log_size = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = bytearray(log_size)
            nvrtc.nvrtcGetProgramLog(program, log)
            raise RuntimeError(f"NVRTC: {compiled[0]}: {bytes(log).decode(errors='replace').strip()}")
        ptx_size = _check(nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize")
        ptx = bytearray(ptx_size)
        _check(nvrtc.nvrtcGetPTX(program, ptx), "nvrtcGetPTX")
        image = np.frombuffer(bytes(ptx), dtype=np.uint8).copy()
        module = _check(driver.cuModuleLoadData(image.ctypes.data), "cuModuleLoadData")
        kernels = {name: _check(driver.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
                   for name in ("while_flag", "while_count_down")}
        kernels["_keep_alive"] = (module, image)
        return kernels


@dataclass
class KernelArgs:
    """Argument values and the array of pointers to them that cuLaunchKernel takes (kept alive together)."""

    values: np.ndarray
    pointers: np.ndarray = field(init=False)

    def __post_init__(self):
        base = self.values.ctypes.data
        self.pointers = np.array([base + 8 * i for i in range(len(self.values))], dtype=np.uint64)


class DriverGraph:
    """A CUDA graph built node by node with the driver's graph API, then instantiated and replayed on the
    current stream. It keeps alive every object its nodes point at (child graphs, flags, kernel arguments)."""

    def __init__(self, device: torch.device):
        driver, _, _ = _cuda_python()
        self.kernels = condition_kernels(device.index if device.index is not None else torch.cuda.current_device())
        self.root = _check(driver.cuGraphCreate(0), "cuGraphCreate")
        self.ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self._exec = None
        self._keep: list[Any] = []

    def keep(self, *objects: Any) -> None:
        """Keep ``objects`` alive as long as this graph (e.g. the memory pool's owners)."""
        self._keep += objects

    def conditional_handle(self):
        """A new conditional handle of this graph (its value is set by a condition kernel)."""
        driver, _, _ = _cuda_python()
        handle = _check(driver.cuGraphConditionalHandleCreate(self.root, self.ctx, 0, 0),
                        "cuGraphConditionalHandleCreate")
        self._keep.append(handle)
        return handle

    def child(self, parent, deps: list, stage: torch.cuda.CUDAGraph, name: str):
        """A child graph node in ``parent`` after ``deps``, cloned from a torch graph captured with
        ``keep_graph=True``."""
        driver, _, _ = _cuda_python()
        self._keep.append(stage)
        raw = driver.CUgraph(stage.raw_cuda_graph())
        return _check(driver.cuGraphAddChildGraphNode(parent, deps, len(deps), raw), f"cuGraphAddChildGraphNode({name})")

    def condition(self, parent, deps: list, kernel: str, handle, flag: torch.Tensor):
        """A one-thread launch of the condition kernel ``kernel`` that sets ``handle`` from ``flag``."""
        driver, _, _ = _cuda_python()
        args = KernelArgs(np.array([_handle_value(handle), flag.data_ptr()], dtype=np.uint64))
        self._keep += [args, flag]
        params = driver.CUDA_KERNEL_NODE_PARAMS()
        params.func = self.kernels[kernel]
        params.gridDimX = params.gridDimY = params.gridDimZ = 1
        params.blockDimX = params.blockDimY = params.blockDimZ = 1
        params.sharedMemBytes = 0
        params.kernelParams = int(args.pointers.ctypes.data)
        return _check(driver.cuGraphAddKernelNode(parent, deps, len(deps), params), "cuGraphAddKernelNode")

    def while_loop(self, parent, deps: list, handle):
        """A WHILE node in ``parent`` after ``deps`` (whose last node set ``handle``): (node, its body graph).
        The body must end with the condition kernel of ``handle``."""
        driver, _, _ = _cuda_python()
        params = driver.CUgraphNodeParams()
        params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
        params.conditional.size = 1
        params.conditional.ctx = self.ctx
        if _bindings_major() >= 13:  # CUDA 13 added edge data to cuGraphAddNode
            node = _check(driver.cuGraphAddNode(parent, deps, None, len(deps), params), "cuGraphAddNode")
        else:
            node = _check(driver.cuGraphAddNode(parent, deps, len(deps), params), "cuGraphAddNode")
        return node, params.conditional.phGraph_out[0]

    def instantiate(self) -> None:
        driver, _, _ = _cuda_python()
        self._exec = _check(driver.cuGraphInstantiate(self.root, 0), "cuGraphInstantiate")

    def replay(self) -> None:
        driver, _, _ = _cuda_python()
        _check(driver.cuGraphLaunch(self._exec, torch.cuda.current_stream().cuda_stream), "cuGraphLaunch")

    def __del__(self):
        try:
            driver, _, _ = _cuda_python()
            if self._exec is not None:
                driver.cuGraphExecDestroy(self._exec)
            driver.cuGraphDestroy(self.root)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone
            pass


class FullGraph:
    """One executable CUDA graph: start; while outer { first; while inner { again }; emit }.

    Built from the stage graphs (each cloned in as a child graph node), so every allocation stays in the
    stage graphs' torch memory pool, which the stage graphs keep alive.
    """

    def __init__(self, stages: dict[str, Any], outer_flag: torch.Tensor, inner_flag: torch.Tensor,
                 device: torch.device):
        g = DriverGraph(device)
        g.keep(stages)  # every stage graph, so their shared memory pool lives as long as this graph
        outer, inner = g.conditional_handle(), g.conditional_handle()
        node = g.child(g.root, [], stages["start"], "start")
        node = g.condition(g.root, [node], "while_flag", outer, outer_flag)
        _, outer_body = g.while_loop(g.root, [node], outer)
        node = g.child(outer_body, [], stages["find_label_first"], "find_label_first")
        node = g.condition(outer_body, [node], "while_flag", inner, inner_flag)
        inner_node, inner_body = g.while_loop(outer_body, [node], inner)
        node = g.child(inner_body, [], stages["find_label_again"], "find_label_again")
        g.condition(inner_body, [node], "while_flag", inner, inner_flag)
        node = g.child(outer_body, [inner_node], stages["emit_labels"], "emit_labels")
        g.condition(outer_body, [node], "while_flag", outer, outer_flag)
        g.instantiate()
        self._graph = g

    def replay(self) -> None:
        self._graph.replay()


def _handle_value(handle) -> int:
    return ctypes.c_uint64.from_address(int(handle.getPtr())).value


def graph_node_counts(graph: torch.cuda.CUDAGraph) -> dict[str, int]:
    """Nodes of a captured stage graph (captured with ``keep_graph=True``): all of them, and the kernels among
    them (the rest are memsets, copies and the like)."""
    driver, _, _ = _cuda_python()
    raw = driver.CUgraph(graph.raw_cuda_graph())
    count = _check(driver.cuGraphGetNodes(raw, 0), "cuGraphGetNodes")[-1]
    nodes = _check(driver.cuGraphGetNodes(raw, count), "cuGraphGetNodes")[0] if count else []
    kernel = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    kinds = [_check(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType") for node in nodes]
    return {"nodes": len(nodes), "kernels": sum(kind == kernel for kind in kinds)}


@contextlib.contextmanager
def no_garbage_collection():
    """Python's cyclic collector paused: a collection during a capture can free another CUDA graph, whose
    destructor is a CUDA call that invalidates the capture."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def capture_partial_graphs(stages: dict[str, Callable[[], None]], device: torch.device) -> dict[str, Any]:
    """One plain CUDA graph per stage, sharing one memory pool, captured in the order given."""
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[str, Any] = {}
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    for name, fn in stages.items():
        graphs[name] = torch.cuda.CUDAGraph(keep_graph=True)  # the full graph clones these
        with no_garbage_collection(), \
                torch.cuda.graph(graphs[name], pool=pool, stream=side, capture_error_mode="thread_local"):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    return graphs
