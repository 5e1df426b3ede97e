"""Transducer joint + loss that never builds the [B, T, U + 1, outputs] logits.

The RNN-T and TDT lattices read four things of a node (b, t, u)'s joint output z = W relu(enc_t + pred_u) + b:
the log-sum-exp of its token logits, its blank logit, the logit of the next label y_{u+1} and (TDT) its few
duration logits. :class:`_NodeLogits` computes them tile by tile (a tile: some utterances x some frames x
all U + 1 label positions), so at most one tile of logits exists at a time, and keeps O(B x T x U) values.
The loss is then the usual lattice on those (:func:`losses.rnnt_log_likelihood`,
:func:`losses.tdt_log_likelihood`), whose gradient comes back as d/d lse, d/d blank logit, d/d label logit
and d/d duration logits per node. Backward recomputes each tile's logits and forms

    dz = softmax(z_tokens) x g_lse + onehot(blank) x g_blank + onehot(y_{u+1}) x g_label (+ g_durations)

then dh = dz W, d pre-activation = dh where h = relu(enc + pred) > 0 (summed over label positions for enc,
over frames for pred), and dW = dz^T h, db = sum of dz, summed over tiles. The bias is one more column of
the output layer, against a constant 1 in the hidden units, so one GEMM adds it and one gives dW and db.
The result equals the materialized path (the joint's logits, then :func:`losses.rnnt_loss` or ``tdt_loss``)
up to rounding: the logits are rounded to the computation dtype before the fp32 (fp64 for fp64 inputs)
log-sum-exp exactly as the materialized logits are.

On CUDA (``backend="auto"``) Triton kernels (:mod:`fused_joint_triton`) write each tile's hidden units in one
pass, one cuBLAS GEMM makes its logits from them, and kernels read the logits once: forward for the node
statistics, backward to turn them into dz in place; one more kernel reads dh and h once for the gradients
of enc and pred. Elsewhere, and for fp64, PyTorch ops do the same.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from workbench.models.loss_inputs import check_durations, check_inputs, check_num_classes, reduce_losses
from workbench.models.losses import BACKENDS, loss_backend, rnnt_log_likelihood, tdt_log_likelihood

MAX_TILE_ELEMENTS = 1 << 26  # joint outputs per tile (its logits: 128 MiB in bf16, besides [nodes, J] activations)
ALIGNMENT = 16  # output rows padded to a multiple of this: Triton vectorizes a row stride it sees divisible by 16


def fused_joint_loss(joint, enc: torch.Tensor, pred: torch.Tensor, targets: torch.Tensor,
                     logit_lengths: torch.Tensor, target_lengths: torch.Tensor, *, blank: int,
                     durations: Sequence[int] | None = None, sigma: float = 0.0, reduction: str = "mean",
                     check: str = "host", max_tile_elements: int = MAX_TILE_ELEMENTS,
                     backend: str = "auto") -> torch.Tensor:
    """RNN-T (``durations=None``) or TDT loss of ``joint`` on enc [B, T, D] and pred [B, U + 1, H], without the
    logits: the value and gradients of ``rnnt_loss(joint(enc, pred), ...)`` (``tdt_loss``).

    ``joint`` follows the decoding protocol and declares ``activation_and_output() -> ("relu", out)``, its
    output layer ``out`` (an nn.Linear of V + 1 (+ len(durations)) outputs). targets [B, U], lengths [B]; blank,
    sigma, reduction and check as in :func:`losses.rnnt_loss` / ``tdt_loss``. Under autocast the output layer
    runs in the autocast dtype. max_tile_elements: joint outputs per tile (>= one node's). backend: "auto"
    (the Triton kernels on CUDA for fp32 and bf16), "triton" or "torch", as :func:`losses.loss_backend`.
    """
    activation, out = joint.activation_and_output()
    if activation != "relu":
        raise ValueError(f"joint: the fused loss takes out(relu(enc + pred)), got activation {activation!r}")
    return fused_projected_joint_loss(joint.project_encoder(enc), joint.project_predictor(pred), out.weight,
                                      out.bias, targets, logit_lengths, target_lengths, blank=blank,
                                      durations=durations, sigma=sigma, reduction=reduction, check=check,
                                      max_tile_elements=max_tile_elements, backend=backend)


def fused_projected_joint_loss(enc_proj: torch.Tensor, pred_proj: torch.Tensor, weight: torch.Tensor,
                               bias: torch.Tensor | None, targets: torch.Tensor, logit_lengths: torch.Tensor,
                               target_lengths: torch.Tensor, *, blank: int, durations: Sequence[int] | None = None,
                               sigma: float = 0.0, reduction: str = "mean", check: str = "host",
                               max_tile_elements: int = MAX_TILE_ELEMENTS, backend: str = "auto") -> torch.Tensor:
    """:func:`fused_joint_loss` on the projections: enc_proj [B, T, J], pred_proj [B, U + 1, J], the output
    layer weight [outputs, J] and bias [outputs] (or None); the logits would be
    ``F.linear(relu(enc_proj[:, :, None] + pred_proj[:, None]), weight, bias)``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    _check_projection_shapes(enc_proj, pred_proj, weight, bias)
    batch, num_frames, _ = enc_proj.shape
    num_cols = pred_proj.shape[1]
    num_outputs = weight.shape[0]
    shape_only = torch.empty(batch, num_frames, num_cols, num_outputs, device="meta")  # what the checks read
    if durations is None:
        num_tokens = check_num_classes(shape_only, None)
    else:
        durations, num_tokens = check_durations(shape_only, durations)
    blank = check_inputs(shape_only, targets, logit_lengths, target_lengths, blank, num_tokens, check)
    if max_tile_elements < 1:
        raise ValueError(f"max_tile_elements: need >= 1, got {max_tile_elements}")
    dtype = _joint_dtype(enc_proj)
    enc_proj, pred_proj, weight = enc_proj.to(dtype), pred_proj.to(dtype), weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    targets = targets.to(enc_proj.device, torch.int64).clamp(0, num_tokens - 1)  # padding: any column will do
    use_triton = dtype != torch.float64 and loss_backend(
        enc_proj, backend, kernels_module="workbench.models.fused_joint_triton")[0] == "triton"
    lse, blank_logit, label_logit, duration_logits = _NodeLogits.apply(
        enc_proj, pred_proj, weight, bias, targets, blank, num_tokens, max_tile_elements, use_triton)
    blank_logp = blank_logit - lse - sigma
    label_logp = label_logit - lse[:, :, :-1] - sigma
    if durations is None:
        log_likelihood = rnnt_log_likelihood(blank_logp, label_logp, logit_lengths, target_lengths, kernel=True)
    else:
        log_likelihood = tdt_log_likelihood(blank_logp, label_logp, duration_logits.log_softmax(-1), durations,
                                            logit_lengths, target_lengths, kernel=True)
    return reduce_losses(-log_likelihood, reduction)


def _check_projection_shapes(enc_proj, pred_proj, weight, bias) -> None:
    """A ValueError naming the input whose shape disagrees with enc_proj [B, T, J]."""
    if enc_proj.dim() != 3 or pred_proj.dim() != 3 or weight.dim() != 2:
        raise ValueError(f"enc_proj [B, T, J], pred_proj [B, U + 1, J], weight [outputs, J]: got "
                         f"{list(enc_proj.shape)}, {list(pred_proj.shape)}, {list(weight.shape)}")
    batch, _, width = enc_proj.shape
    if pred_proj.shape[0] != batch:
        raise ValueError(f"pred_proj: batch {pred_proj.shape[0]}, enc_proj's is {batch}")
    for name, got in (("pred_proj", pred_proj.shape[-1]), ("weight", weight.shape[-1])):
        if got != width:
            raise ValueError(f"{name}: last dim {got}, enc_proj's J is {width}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias: shape {list(bias.shape)}, expected [{weight.shape[0]}] (weight's outputs)")


def _joint_dtype(enc_proj: torch.Tensor) -> torch.dtype:
    """The output layer's dtype: the autocast dtype where autocast is on, else the projections'."""
    device_type = enc_proj.device.type
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return enc_proj.dtype


def tile_shape(batch: int, num_frames: int, num_cols: int, width: int, max_elements: int) -> tuple[int, int]:
    """(utterances, frames) per tile so that a tile's [b, t, U + 1, width] outputs stay within max_elements
    (all frames of several utterances, else some frames of one; at least one frame)."""
    per_frame = num_cols * width
    per_utterance = num_frames * per_frame
    if per_utterance <= max_elements:
        return max(1, min(batch, max_elements // per_utterance)), num_frames
    return 1, max(1, min(num_frames, max_elements // per_frame))


class _NodeLogits(torch.autograd.Function):
    """(enc_proj [B, T, J], pred_proj [B, U + 1, J], weight [C, J], bias [C] | None, targets [B, U] in range)
    -> lse [B, T, U + 1] of the first ``num_tokens`` logits, blank logit [B, T, U + 1], next-label logit
    [B, T, U] and the logits after the tokens [B, T, U + 1, C - num_tokens], in fp32 (fp64 for fp64 inputs)."""

    @staticmethod
    def forward(ctx, enc_proj, pred_proj, weight, bias, targets, blank, num_tokens, max_tile_elements, use_triton):
        ctx.sizes = (blank, num_tokens, max_tile_elements, use_triton)
        stats = _node_stats(enc_proj, pred_proj, weight, bias, targets, blank, num_tokens, max_tile_elements,
                            use_triton)
        ctx.save_for_backward(enc_proj, pred_proj, weight, bias, targets, stats[0])
        return stats

    @staticmethod
    def backward(ctx, g_lse, g_blank, g_label, g_rest):
        enc_proj, pred_proj, weight, bias, targets, lse = ctx.saved_tensors
        blank, num_tokens, max_tile_elements, use_triton = ctx.sizes
        batch, num_frames, _ = enc_proj.shape
        num_cols = pred_proj.shape[1]
        num_outputs = weight.shape[0]
        stat_dtype = lse.dtype
        node_shape = tuple(lse.shape)
        g_lse, g_blank, g_label, g_rest = (
            torch.zeros(shape, device=lse.device, dtype=stat_dtype) if g is None else g.to(stat_dtype)
            for g, shape in ((g_lse, node_shape), (g_blank, node_shape), (g_label, node_shape[:2] + (num_cols - 1,)),
                             (g_rest, node_shape + (num_outputs - num_tokens,))))
        layer = _augmented_output_layer(weight, bias)
        grad_enc = torch.zeros(enc_proj.shape, device=enc_proj.device, dtype=stat_dtype)
        grad_pred = torch.zeros(pred_proj.shape, device=pred_proj.device, dtype=stat_dtype)
        grad_layer = torch.zeros(layer.shape, device=weight.device, dtype=stat_dtype)
        tiles = _tiles(batch, num_frames, num_cols, layer.shape[0], max_tile_elements)
        grads = (lse, g_lse, g_blank, g_label, g_rest)
        if use_triton:
            targets, grads = targets.contiguous(), _contiguous(*grads)
        has_bias = bias is not None
        with _no_autocast(enc_proj):
            for rows, frames in tiles:
                # the tile's hidden units and logits, once more
                h_rows, z_rows = _tile_logits(enc_proj[rows, frames], pred_proj[rows], layer, has_bias, use_triton)
                if use_triton:
                    dz_rows = _triton_tile_logits_grad(z_rows, targets, grads, blank, num_tokens, rows, frames,
                                                       num_frames, num_cols)
                else:
                    z_shape = (*grad_enc[rows, frames].shape[:2], num_cols, -1)
                    dz_rows = _tile_logits_grad(z_rows.view(z_shape), targets[rows], grads, rows, frames, blank,
                                                num_tokens, num_outputs).view(z_rows.shape)
                del z_rows
                grad_layer += (dz_rows.T @ h_rows).to(stat_dtype)  # the weights' and (column J) the bias's
                dh_rows = dz_rows @ layer
                del dz_rows
                _tile_hidden_grad(dh_rows, h_rows, grad_enc, grad_pred, rows, frames, use_triton)
                del dh_rows, h_rows
        width = weight.shape[1]
        grad_weight = grad_layer[:num_outputs, :width].to(weight.dtype)
        grad_bias = None if bias is None else grad_layer[:num_outputs, width].to(bias.dtype)
        return (grad_enc.to(enc_proj.dtype), grad_pred.to(pred_proj.dtype), grad_weight, grad_bias, None, None, None,
                None, None)


def _node_stats(enc_proj, pred_proj, weight, bias, targets, blank, num_tokens, max_tile_elements, use_triton):
    """:class:`_NodeLogits`'s outputs, tile by tile: each tile's logits, then the Triton kernel or PyTorch ops
    on them."""
    batch, num_frames, _ = enc_proj.shape
    num_cols = pred_proj.shape[1]
    stat_dtype = torch.float64 if enc_proj.dtype == torch.float64 else torch.float32
    layer = _augmented_output_layer(weight, bias)
    small = dict(device=enc_proj.device, dtype=stat_dtype)
    lse = torch.empty(batch, num_frames, num_cols, **small)
    blank_logit = torch.empty(batch, num_frames, num_cols, **small)
    label_logit = torch.empty(batch, num_frames, num_cols - 1, **small)
    rest = torch.empty(batch, num_frames, num_cols, weight.shape[0] - num_tokens, **small)
    tiles = _tiles(batch, num_frames, num_cols, layer.shape[0], max_tile_elements)
    if use_triton:
        from workbench.models.fused_joint_triton import fused_joint_logits_stats
        targets = targets.contiguous()
    with _no_autocast(enc_proj):
        for rows, frames in tiles:
            enc_tile = enc_proj[rows, frames]
            _, z_rows = _tile_logits(enc_tile, pred_proj[rows], layer, bias is not None, use_triton)
            if use_triton:
                fused_joint_logits_stats(z_rows, targets, lse, blank_logit, label_logit, rest, blank, num_tokens,
                                         _first_node(rows, frames, num_frames, num_cols))
                continue
            z = z_rows.view(*enc_tile.shape[:2], num_cols, -1)[..., :weight.shape[0]].to(stat_dtype)
            lse[rows, frames] = z[..., :num_tokens].logsumexp(-1)
            blank_logit[rows, frames] = z[..., blank]
            label_logit[rows, frames] = _gather_labels(z, targets[rows])
            rest[rows, frames] = z[..., num_tokens:]
    return lse, blank_logit, label_logit, rest


def _contiguous(*tensors):
    return tuple(None if x is None else x.contiguous() for x in tensors)


def _tile_logits_grad(z, targets, grads, rows, frames, blank, num_tokens, num_outputs) -> torch.Tensor:
    """d loss / d logits [b, t, U + 1, C_pad] of one tile, in the logits' (the joint's) dtype, from its logits."""
    lse, g_lse, g_blank, g_label, g_rest = (g[rows, frames] for g in grads)
    dz = torch.zeros(z.shape, device=z.device, dtype=lse.dtype)
    dz[..., :num_tokens] = torch.exp(z[..., :num_tokens].to(lse.dtype) - lse[..., None]) * g_lse[..., None]
    dz[..., blank] += g_blank
    num_labels = z.shape[2] - 1
    index = targets[:, None, :, None].expand(*dz.shape[:2], num_labels, 1)
    dz[:, :, :num_labels].scatter_add_(-1, index, g_label[..., None])
    dz[..., num_tokens:num_outputs] = g_rest
    return dz.to(z.dtype)  # the materialized logits' gradient has their dtype


def _triton_tile_logits_grad(z_rows, targets, grads, blank, num_tokens, rows, frames, num_frames, num_cols):
    """:func:`_tile_logits_grad` by the Triton kernel, in place on the tile's logits [nodes, C_pad]."""
    from workbench.models.fused_joint_triton import fused_joint_logits_grad
    fused_joint_logits_grad(z_rows, targets, *grads, blank, num_tokens, _first_node(rows, frames, num_frames, num_cols))
    return z_rows


def _first_node(rows: slice, frames: slice, num_frames: int, num_cols: int) -> int:
    """The flat [B, T, U + 1] index of a tile's first node (a tile's nodes are consecutive: :func:`tile_shape`)."""
    return (rows.start * num_frames + frames.start) * num_cols


def _tiles(batch, num_frames, num_cols, width, max_elements) -> list[tuple[slice, slice]]:
    """(utterance slice, frame slice) of each tile, in order (:func:`tile_shape`)."""
    rows, frames = tile_shape(batch, num_frames, num_cols, width, max_elements)
    return [(slice(b, b + rows), slice(t, t + frames)) for b in range(0, batch, rows)
            for t in range(0, num_frames, frames)]


def _augmented_output_layer(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The output layer as one matrix [C_pad, width]: weight [C, J] in the first J columns, the bias [C] (if
    any) in column J, where the hidden units hold a constant 1 (so one GEMM adds it, and one GEMM gives the
    gradients of both), zero rows and columns up to multiples of ALIGNMENT (the outputs after C are never
    read)."""
    num_outputs, hidden_units = weight.shape
    width = hidden_units + (bias is not None)
    rows, width = num_outputs + -num_outputs % ALIGNMENT, width + -width % ALIGNMENT
    if (rows, width) == tuple(weight.shape):
        return weight.contiguous()
    layer = weight.new_zeros(rows, width)
    layer[:num_outputs, :hidden_units] = weight
    if bias is not None:
        layer[:num_outputs, hidden_units] = bias
    return layer


def _tile_logits(enc_tile: torch.Tensor, pred_rows: torch.Tensor, layer: torch.Tensor, has_bias: bool,
                 use_triton: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """enc_tile [b, t, J], pred_rows [b, U + 1, J] -> (hidden units [b x t x (U + 1), width] (relu(enc + pred),
    then 1 in column J when ``has_bias``, then 0), logits [b x t x (U + 1), C_pad]) in the inputs' dtype: one
    GEMM on rows, the same calls in forward and backward, so both round the logits alike."""
    num_nodes = enc_tile.shape[0] * enc_tile.shape[1] * pred_rows.shape[1]
    h_rows = torch.empty(num_nodes, layer.shape[1], device=enc_tile.device, dtype=enc_tile.dtype)
    if use_triton:
        from workbench.models.fused_joint_triton import fused_joint_hidden
        fused_joint_hidden(enc_tile, pred_rows, h_rows, has_bias)
    else:
        hidden_units = enc_tile.shape[-1]
        h = h_rows.view(*enc_tile.shape[:2], pred_rows.shape[1], -1)
        torch.add(enc_tile[:, :, None, :], pred_rows[:, None, :, :], out=h[..., :hidden_units])
        h[..., :hidden_units].relu_()
        h[..., hidden_units:] = 0
        if has_bias:
            h[..., hidden_units] = 1
    return h_rows, F.linear(h_rows, layer)


def _tile_hidden_grad(dh_rows, h_rows, grad_enc, grad_pred, rows: slice, frames: slice, use_triton: bool) -> None:
    """Add one tile's gradients of enc_proj and pred_proj to grad_enc [B, T, J] and grad_pred [B, U + 1, J]
    (fp32, fp64 for fp64 inputs) from the gradient of its hidden units dh_rows and the units h_rows (both
    [nodes, width]): d pre-activation = dh where h > 0, summed over label positions and over frames."""
    tile_frames = grad_enc[rows, frames].shape[1]
    if use_triton:
        from workbench.models.fused_joint_triton import fused_joint_hidden_grad
        fused_joint_hidden_grad(dh_rows, h_rows, grad_enc, grad_pred, rows.start, frames.start, tile_frames)
        return
    hidden_units = grad_enc.shape[-1]
    shape = (-1, tile_frames, grad_pred.shape[1], h_rows.shape[1])
    dpre = dh_rows.view(shape)[..., :hidden_units].masked_fill(h_rows.view(shape)[..., :hidden_units] == 0, 0)
    grad_enc[rows, frames] += dpre.sum(2, dtype=grad_enc.dtype)
    grad_pred[rows] += dpre.sum(1, dtype=grad_pred.dtype)


def _gather_labels(z: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """z[b, t, u, targets[b, u]] for u < U -> [b, t, U]."""
    num_labels = targets.shape[1]
    index = targets[:, None, :, None].expand(z.shape[0], z.shape[1], num_labels, 1)
    return z[:, :, :num_labels].gather(-1, index).squeeze(-1)


def _no_autocast(x: torch.Tensor):
    """Autocast off on x's device (the dtypes are chosen before the tiles run)."""
    device_type = x.device.type if x.device.type in ("cpu", "cuda") else "cpu"
    return torch.autocast(device_type, enabled=False)
