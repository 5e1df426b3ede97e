"""CUDA-graph machinery for the decoders: support checks, the NVRTC condition kernels, conditional WHILE
nodes inserted during ``torch.cuda.graph`` capture, and the ``partial`` / ``full`` runners.

Import-safe everywhere: cuda-python (``cuda.bindings``) is imported only when a full graph is built.
``full`` needs a CUDA driver >= 12.6 (conditional nodes are buggy before), cuda-python and NVRTC.
The full graph is assembled with the driver's graph API from the four stage graphs that ``partial``
replays (cloned in as child graph nodes), so all its memory lives in their torch graph pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
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
    except Exception as e:
        return f"torch {torch.__version__} cannot hand out captured graphs (keep_graph/raw_cuda_graph): {e}"
    try:
        driver, _, _ = _cuda_python()
    except Exception as e:  # ImportError, or a broken install
        return f"cuda-python (cuda.bindings) is not usable: {e}"
    try:
        version = _check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    except Exception as e:
        return f"cannot read the CUDA driver version: {e}"
    if version < MIN_DRIVER_VERSION:
        return (f"CUDA driver {version // 1000}.{version % 1000 // 10} is older than 12.6 "
                "(conditional graph nodes are unreliable before it)")
    try:
        condition_kernels(torch.cuda.current_device() if device is None or device.index is None else device.index)
    except Exception as e:
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


def _launch_condition(kernel, args: KernelArgs, stream: int) -> None:
    driver, _, _ = _cuda_python()
    _check(driver.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, stream, args.pointers.ctypes.data, 0),
           "cuLaunchKernel(condition)")


def create_conditional_handle(stream: torch.cuda.Stream) -> tuple[Any, int]:
    """A conditional handle for the graph being captured on ``stream``: (handle object, its value)."""
    _, runtime, _ = _cuda_python()
    info = _check(runtime.cudaStreamGetCaptureInfo(stream.cuda_stream), "cudaStreamGetCaptureInfo")
    if info[0] != runtime.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive:
        raise RuntimeError("create_conditional_handle() needs a stream that is capturing")
    handle = _check(runtime.cudaGraphConditionalHandleCreate(info[2], 0, 0), "cudaGraphConditionalHandleCreate")
    return handle, _handle_value(handle)


@contextlib.contextmanager
def conditional_while(kernel, args: KernelArgs, handle, device: torch.device):
    """Inside a capture: add a WHILE node whose body is captured from the ``with`` block.

    The condition kernel runs once before the node (whether to enter) and again at the end of the body
    (whether to repeat). The block runs with a fresh capture stream made current.
    """
    driver, runtime, _ = _cuda_python()
    stream = torch.cuda.current_stream(device)
    _launch_condition(kernel, args, stream.cuda_stream)
    info = _check(runtime.cudaStreamGetCaptureInfo(stream.cuda_stream), "cudaStreamGetCaptureInfo")
    status, graph, dependencies = info[0], info[2], list(info[3] or [])
    if status != runtime.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive:
        raise RuntimeError("conditional_while() needs a stream that is capturing")
    params = driver.CUgraphNodeParams()
    params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle = handle
    params.conditional.type = driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
    params.conditional.size = 1
    params.conditional.ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    new_api = _bindings_major() >= 13  # CUDA 13 added edge data to these two calls
    if new_api:
        node = _check(driver.cuGraphAddNode(graph, dependencies, None, len(dependencies), params), "cuGraphAddNode")
        _check(runtime.cudaStreamUpdateCaptureDependencies(
            stream.cuda_stream, [node], None, 1,
            runtime.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies),
            "cudaStreamUpdateCaptureDependencies")
    else:
        node = _check(driver.cuGraphAddNode(graph, dependencies, len(dependencies), params), "cuGraphAddNode")
        _check(runtime.cudaStreamUpdateCaptureDependencies(
            stream.cuda_stream, [node], 1,
            runtime.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies),
            "cudaStreamUpdateCaptureDependencies")
    body_graph = params.conditional.phGraph_out[0]
    body_stream = torch.cuda.Stream(device)
    _check(runtime.cudaStreamBeginCaptureToGraph(body_stream.cuda_stream, body_graph, None, None, 0,
                                                 runtime.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
           "cudaStreamBeginCaptureToGraph")
    capturing = True
    try:
        torch.cuda.set_stream(body_stream)
        yield body_stream
        _launch_condition(kernel, args, body_stream.cuda_stream)
        capturing = False
        _check(runtime.cudaStreamEndCapture(body_stream.cuda_stream), "cudaStreamEndCapture(body)")
    finally:
        if capturing:
            with contextlib.suppress(Exception):
                runtime.cudaStreamEndCapture(body_stream.cuda_stream)
        torch.cuda.set_stream(stream)


class FullGraph:
    """One executable CUDA graph: start; while outer { first; while inner { again }; emit }.

    Built with the driver's graph API from the stage graphs (each cloned in as a child graph node), so
    every allocation stays in the stage graphs' torch memory pool, which the stage graphs keep alive.
    """

    def __init__(self, stages: dict[str, Any], outer_flag: torch.Tensor, inner_flag: torch.Tensor,
                 device: torch.device):
        driver, _, _ = _cuda_python()
        index = device.index if device.index is not None else torch.cuda.current_device()
        kernel = condition_kernels(index)["while_flag"]
        self._keep = [stages, outer_flag, inner_flag]
        self._graph = _check(driver.cuGraphCreate(0), "cuGraphCreate")
        self._exec = None
        ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        outer = _check(driver.cuGraphConditionalHandleCreate(self._graph, ctx, 0, 0), "cuGraphConditionalHandleCreate")
        inner = _check(driver.cuGraphConditionalHandleCreate(self._graph, ctx, 0, 0), "cuGraphConditionalHandleCreate")
        outer_args = KernelArgs(np.array([_handle_value(outer), outer_flag.data_ptr()], dtype=np.uint64))
        inner_args = KernelArgs(np.array([_handle_value(inner), inner_flag.data_ptr()], dtype=np.uint64))
        self._keep += [outer, inner, outer_args, inner_args]

        def child(graph, deps, name):
            raw = driver.CUgraph(stages[name].raw_cuda_graph())
            return _check(driver.cuGraphAddChildGraphNode(graph, deps, len(deps), raw), f"cuGraphAddChildGraphNode({name})")

        def condition(graph, deps, args):
            params = driver.CUDA_KERNEL_NODE_PARAMS()
            params.func = kernel
            params.gridDimX = params.gridDimY = params.gridDimZ = 1
            params.blockDimX = params.blockDimY = params.blockDimZ = 1
            params.sharedMemBytes = 0
            params.kernelParams = int(args.pointers.ctypes.data)
            return _check(driver.cuGraphAddKernelNode(graph, deps, len(deps), params), "cuGraphAddKernelNode")

        def while_node(graph, deps, handle):
            params = driver.CUgraphNodeParams()
            params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            params.conditional.handle = handle
            params.conditional.type = driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
            params.conditional.size = 1
            params.conditional.ctx = ctx
            if _bindings_major() >= 13:
                node = _check(driver.cuGraphAddNode(graph, deps, None, len(deps), params), "cuGraphAddNode")
            else:
                node = _check(driver.cuGraphAddNode(graph, deps, len(deps), params), "cuGraphAddNode")
            return node, params.conditional.phGraph_out[0]

        g = self._graph
        node = child(g, [], "start")
        node = condition(g, [node], outer_args)
        _, outer_body = while_node(g, [node], outer)
        node = child(outer_body, [], "find_label_first")
        node = condition(outer_body, [node], inner_args)
        inner_node, inner_body = while_node(outer_body, [node], inner)
        node = child(inner_body, [], "find_label_again")
        condition(inner_body, [node], inner_args)
        node = child(outer_body, [inner_node], "emit_labels")
        condition(outer_body, [node], outer_args)
        self._exec = _check(driver.cuGraphInstantiate(g, 0), "cuGraphInstantiate")

    def replay(self) -> None:
        driver, _, _ = _cuda_python()
        _check(driver.cuGraphLaunch(self._exec, torch.cuda.current_stream().cuda_stream), "cuGraphLaunch")

    def __del__(self):
        try:
            driver, _, _ = _cuda_python()
            if self._exec is not None:
                driver.cuGraphExecDestroy(self._exec)
            driver.cuGraphDestroy(self._graph)
        except Exception:
            pass


def _handle_value(handle) -> int:
    return ctypes.c_uint64.from_address(int(handle.getPtr())).value


def capture_partial_graphs(stages: dict[str, Callable[[], None]], device: torch.device) -> dict[str, Any]:
    """One plain CUDA graph per stage, sharing one memory pool, captured in the order given."""
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[str, Any] = {}
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    for name, fn in stages.items():
        graphs[name] = torch.cuda.CUDAGraph(keep_graph=True)  # the full graph clones these
        with torch.cuda.graph(graphs[name], pool=pool, stream=side, capture_error_mode="thread_local"):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    return graphs


def empty_while_iteration_seconds(iterations: int = 2000, repeat: int = 10,
                                  device: torch.device | None = None) -> dict[str, float]:
    """Measured cost of one iteration of a conditional WHILE node whose body is only its condition kernel.

    Returns seconds per iteration (median over ``repeat`` replays) and the fixed cost of a replay.
    """
    device = device or torch.device("cuda", torch.cuda.current_device())
    kernels = condition_kernels(device.index if device.index is not None else torch.cuda.current_device())
    remaining = torch.zeros((), dtype=torch.int32, device=device)
    count = torch.zeros((), dtype=torch.int32, device=device)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        remaining.copy_(count)
        handle, value = create_conditional_handle(torch.cuda.current_stream(device))
        args = KernelArgs(np.array([value, remaining.data_ptr()], dtype=np.uint64))
        with conditional_while(kernels["while_count_down"], args, handle, device):
            pass
    torch.cuda.current_stream(device).wait_stream(side)

    def timed(n: int) -> float:
        count.fill_(n)
        samples = []
        for _ in range(repeat + 2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1000.0)
        if int(remaining) != 0:
            raise RuntimeError(f"count-down loop did not run to 0 (left {int(remaining)})")
        return float(np.median(samples[2:]))

    zero, many = timed(0), timed(iterations)
    return {"seconds_per_iteration": (many - zero) / iterations, "replay_seconds_zero_iterations": zero,
            "iterations": iterations}
