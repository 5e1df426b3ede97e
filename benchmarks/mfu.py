"""Model FLOPs utilization: the GPU's measured matmul rate and the FLOPs of one training step.

MFU = FLOPs of one forward+backward / step seconds / matmul FLOP/s, with the FLOPs from
``torch.utils.flop_counter`` and the rate from a large bf16 matmul timed on the same GPU in the same run.
"""

from __future__ import annotations

from typing import Any


def matmul_flops_per_second(smoke: bool) -> dict[str, Any]:
    """bf16 matmul rate of this GPU (n = 8192, CUDA events), or fp32 on the CPU (n = 256) for smoke runs."""
    import torch

    from benchmarks.harness import bench_device

    device = bench_device() if not smoke else torch.device("cpu")
    n, dtype = (256, torch.float32) if device.type == "cpu" else (8192, torch.bfloat16)
    seconds = gemm_seconds(n, n, n, device, dtype)
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "seconds": seconds,
            "flops_per_s": 2 * n ** 3 / seconds["median"]}


def gemm_seconds(rows: int, inner: int, cols: int, device, dtype) -> dict[str, float]:
    """Timed seconds (median and spread) of one [rows, inner] x [inner, cols] matmul of random ``dtype`` values
    on ``device``; its rate is 2 x rows x inner x cols / the median."""
    import torch

    from workbench.timing import timer_for

    a = torch.randn(rows, inner, device=device, dtype=dtype)
    b = torch.randn(inner, cols, device=device, dtype=dtype)
    return timer_for(device)(lambda: torch.matmul(a, b))


def convolution_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                               _output_padding, _groups, output_mask, out_shape=None, **_) -> int:
    """A convolution's input and weight gradients, each as many FLOPs as its forward (torch's own formula
    counts a grouped convolution's weight gradient once per group: a depthwise one C times over)."""
    from torch.utils.flop_counter import conv_flop_count

    return conv_flop_count(x_shape, w_shape, grad_out_shape, transposed) * (int(output_mask[0]) + int(output_mask[1]))


def step_flops(model, batch_size: int, duration_s: float, num_tokens: int, smoke: bool) -> float:
    """FLOPs of one forward+backward (``torch.utils.flop_counter``: matmuls, convolutions, attention) at
    a worst-case batch of that shape; element-wise work and the transducer loss are not counted. The
    depthwise convolutions (the subsampling's, the convolution modules') are counted on torch's, without
    running a kernel (no interpreter on a CPU), their gradients by :func:`convolution_backward_flops`: the
    count of the Triton custom ops' FLOP formulas. A transducer is counted with its joint's logits built, also when
    its joint and loss are fused: model FLOPs, not the fused backward's recomputed logits."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    device = next(model.parameters()).device
    batch = model.make_batch(batch_size, duration_s, num_tokens, device)
    # while counting, every depthwise convolution as torch's and the joint's logits built (the fused path's
    # recomputed logits are not model FLOPs): (object, attribute, setting while counting)
    options = [(model.encoder.subsampling, "depthwise", "torch")] + [(block.conv, "time_depthwise", "torch")
                                                                     for block in model.encoder.blocks]
    if getattr(model.config, "joint_loss", None) is not None:
        options.append((model.config, "joint_loss", "materialized"))
    saved = [(module, name, getattr(module, name)) for module, name, _ in options]
    for module, name, setting in options:
        setattr(module, name, setting)
    try:
        with FlopCounterMode(display=False, custom_mapping={
                torch.ops.aten.convolution_backward: convolution_backward_flops}) as counter:
            model.training_step(batch, dtype=torch.float32 if smoke else torch.bfloat16)
    finally:
        for module, name, setting in saved:
            setattr(module, name, setting)
        model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def utilization(flops: float, step_seconds: float, flops_per_s: float) -> float:
    """MFU: the share of the matmul rate that ``flops`` done in ``step_seconds`` reach (0.25 is 25 %)."""
    if step_seconds <= 0 or flops_per_s <= 0:
        raise ValueError(f"utilization: step_seconds and flops_per_s must be > 0, got {step_seconds}, {flops_per_s}")
    return flops / step_seconds / flops_per_s


def busy_share(kernel_seconds: float, step_seconds: float) -> float:
    """The share of a step's wall time the GPU spends running kernels: summed kernel seconds / step seconds
    (below 1 when the host keeps the GPU waiting; above 1 only when kernels overlap on several streams)."""
    if step_seconds <= 0:
        raise ValueError(f"busy_share: step_seconds must be > 0, got {step_seconds}")
    return kernel_seconds / step_seconds
