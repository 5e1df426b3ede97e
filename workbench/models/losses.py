"""Transducer losses (RNN-T, TDT) in plain PyTorch: log space, fp32, vectorized over batch and diagonals.

:func:`rnnt_loss` and :func:`tdt_loss` run the Triton kernels of :mod:`losses_triton` on CUDA logits when
triton imports (:func:`loss_backend` says which runs and why); the code here is their reference and the
CPU path (``rnnt_loss_reference``, ``tdt_loss_reference``).

The lattice has a node (t, u) for every frame t in [0, T) and every number of emitted labels u in
[0, U]. alpha(t, u) is the log of the summed probability of all partial alignments that reach it. All
nodes on one anti-diagonal n = t + u depend only on earlier diagonals, so the forward pass walks the
T + U diagonals and computes each in one batched step. The gradient is analytic: beta(t, u), the
log-sum over the rest of an alignment, walks the diagonals backwards, and the gradient of an edge's
log-weight w is its posterior exp(alpha + w + beta(destination) - log P). Only the
blank and target-label log-probabilities are gathered from the joint output, so the recursion works on
[B, T, U + 1] tensors while the joint itself stays B x T x (U + 1) x classes like in real trainers.

- RNN-T: a blank moves from (t, u) to (t + 1, u), label u + 1 moves from (t, u) to (t, u + 1); the
  alignment ends with the blank emitted at (T - 1, U).
- TDT (Xu et al. 2023, "Efficient Sequence Transduction by Jointly Predicting Tokens and Durations"):
  the joint output ends with one logit per duration; token and duration distributions are normalized
  separately and multiply. A label with duration d moves from (t, u) to (t + d, u + 1) (d = 0 allowed);
  a blank with duration d moves to (t + d, u) and needs d > 0 (a blank of duration 0 would be a
  self-loop, so it is not an alignment step). The alignment ends with a blank that lands exactly on
  frame T from (T - d, U); labels must land on a frame < T.

The loss is the negative log of the sum over every valid alignment (per utterance, ``reduction="none"``).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from workbench.models.loss_inputs import LOG_ZERO, check_durations, check_num_classes  # noqa: F401 - public here too
from workbench.models.loss_inputs import check_inputs as _check_inputs
from workbench.models.loss_inputs import reduce_losses as _reduce
from workbench.triton_support import kernel_device_type, triton_unavailable_reason


BACKENDS = ("auto", "triton", "torch")


def loss_backend(logits: torch.Tensor, backend: str = "auto", *,
                 kernels_module: str = "workbench.models.losses_triton") -> tuple[str, str]:
    """Which implementation a transducer loss runs on these logits ("triton" or "torch") and a one-line
    reason, for logs. "auto": Triton for CUDA logits when it imports, else the pure-PyTorch reference (fake CPU
    logits inside ``kernels_as_on_cuda()`` count as CUDA ones: :func:`~workbench.triton_support.kernel_device_type`).
    kernels_module: the module of the kernels that would run (it must import too)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch", "torch: asked for the pure-PyTorch reference"
    if backend == "auto" and kernel_device_type(logits.device) != "cuda":  # decided without importing triton
        return "torch", f"torch: logits on {logits.device.type} (the Triton kernels run on CUDA)"
    problem = triton_unavailable_reason(logits.device, kernels_module=kernels_module)
    if backend == "triton":
        if problem:
            raise ValueError(f"backend='triton': {problem}")
        return "triton", "triton: asked for"
    if problem:
        return "torch", f"torch: {problem}"
    if logits.dtype not in (torch.float32, torch.bfloat16):
        return "torch", f"torch: logits are {logits.dtype} (the Triton kernels take float32 or bfloat16)"
    return "triton", "triton: CUDA logits and triton importable"


def rnnt_loss(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
              target_lengths: torch.Tensor, *, blank: int = -1, reduction: str = "mean",
              backend: str = "auto", check: str = "host", num_classes: int | None = None) -> torch.Tensor:
    """RNN-T negative log-likelihood from joint logits (log-softmax is applied here, in fp32).

    logits [B, T, U + 1, V + 1] (any float dtype), targets [B, U] long (label ids, no blank),
    logit_lengths [B] in [1, T], target_lengths [B] in [0, U]. ``blank`` indexes the classes (negative
    counts from the end, as in torchaudio). reduction: "none" -> [B], "sum", or "mean" (over the batch).
    backend: see :func:`loss_backend` ("auto" picks the Triton kernels for CUDA logits). check: how the
    lengths' and targets' values are checked on CUDA, "host" (a ValueError naming the field; waits for
    the device) or "device" (no host sync; see :func:`loss_inputs.check_inputs`). num_classes: how many
    leading columns of the last dim are classes (default: all); the columns after them are padding (e.g.
    a joint output padded to an aligned width), ignored, with a zero gradient, and never copied away.
    """
    if loss_backend(logits, backend)[0] == "triton":
        from workbench.models.losses_triton import rnnt_loss_triton

        return rnnt_loss_triton(logits, targets, logit_lengths, target_lengths, blank=blank, reduction=reduction,
                                check=check, num_classes=num_classes)
    return rnnt_loss_reference(logits, targets, logit_lengths, target_lengths, blank=blank, reduction=reduction,
                               check=check, num_classes=num_classes)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 for float64 inputs (a reference for the fp32 kernels), else float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def rnnt_loss_reference(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                        target_lengths: torch.Tensor, *, blank: int = -1, reduction: str = "mean",
                        check: str = "host", num_classes: int | None = None) -> torch.Tensor:
    """:func:`rnnt_loss` in plain PyTorch (the reference and the CPU path; padding columns are sliced off)."""
    num_classes = check_num_classes(logits, num_classes)
    blank = _check_inputs(logits, targets, logit_lengths, target_lengths, blank, num_classes, check)
    logits = logits[..., :num_classes]
    dtype = _compute_dtype(logits)
    logit_lse = logits.to(dtype).logsumexp(dim=-1)  # [B, T, U + 1]
    blank_logp = logits[..., blank].to(dtype) - logit_lse
    label_logp = _gather_labels(logits, targets).to(dtype) - logit_lse[:, :, :-1]
    return _reduce(-rnnt_log_likelihood(blank_logp, label_logp, logit_lengths, target_lengths), reduction)


def rnnt_log_likelihood(blank_logp: torch.Tensor, label_logp: torch.Tensor, logit_lengths: torch.Tensor,
                        target_lengths: torch.Tensor, *, kernel: bool = False) -> torch.Tensor:
    """RNN-T log P [B] from each node's blank log-prob [B, T, U + 1] and next-label log-prob [B, T, U]
    (all a loss needs of the joint: :mod:`fused_joint_loss` computes them without the logits); ``kernel``: as
    in :func:`lattice_log_likelihood`."""
    label_weight = F.pad(label_logp, (0, 1), value=LOG_ZERO)  # nothing to emit once u == U
    return lattice_log_likelihood(blank_logp[None], label_weight[None], blank_durations=[1], label_durations=[0],
                                  logit_lengths=logit_lengths, target_lengths=target_lengths, kernel=kernel)


def tdt_loss(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
             target_lengths: torch.Tensor, *, blank: int, durations: Sequence[int] = (0, 1, 2, 3, 4),
             sigma: float = 0.0, reduction: str = "mean", backend: str = "auto",
             check: str = "host", num_classes: int | None = None) -> torch.Tensor:
    """TDT negative log-likelihood from joint logits [B, T, U + 1, V + 1 + len(durations)].

    The first V + 1 logits are tokens (``blank`` indexes them), the last len(durations) of the first
    ``num_classes`` columns (default: all) are durations in frames, in the order given; columns after
    ``num_classes`` are padding, as in :func:`rnnt_loss`. ``sigma`` is the paper's logit
    under-normalization (subtracted from every token log-prob; 0 disables it). Other arguments as in
    :func:`rnnt_loss`.
    """
    if loss_backend(logits, backend)[0] == "triton":
        from workbench.models.losses_triton import tdt_loss_triton

        return tdt_loss_triton(logits, targets, logit_lengths, target_lengths, blank=blank, durations=durations,
                               sigma=sigma, reduction=reduction, check=check, num_classes=num_classes)
    return tdt_loss_reference(logits, targets, logit_lengths, target_lengths, blank=blank, durations=durations,
                              sigma=sigma, reduction=reduction, check=check, num_classes=num_classes)


def tdt_loss_reference(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                       target_lengths: torch.Tensor, *, blank: int, durations: Sequence[int] = (0, 1, 2, 3, 4),
                       sigma: float = 0.0, reduction: str = "mean", check: str = "host",
                       num_classes: int | None = None) -> torch.Tensor:
    """:func:`tdt_loss` in plain PyTorch (the reference and the CPU path; padding columns are sliced off)."""
    durations, num_token_classes = check_durations(logits, durations, num_classes)
    blank = _check_inputs(logits, targets, logit_lengths, target_lengths, blank, num_token_classes, check)
    logits = logits[..., :num_token_classes + len(durations)]
    token_logits = logits[..., :num_token_classes]
    dtype = _compute_dtype(logits)
    token_lse = token_logits.to(dtype).logsumexp(dim=-1)
    duration_logp = logits[..., num_token_classes:].to(dtype).log_softmax(dim=-1)  # [B, T, U + 1, D]
    blank_logp = token_logits[..., blank].to(dtype) - token_lse - sigma
    label_logp = _gather_labels(token_logits, targets).to(dtype) - token_lse[:, :, :-1] - sigma
    log_likelihood = tdt_log_likelihood(blank_logp, label_logp, duration_logp, durations, logit_lengths,
                                        target_lengths)
    return _reduce(-log_likelihood, reduction)


def tdt_log_likelihood(blank_logp: torch.Tensor, label_logp: torch.Tensor, duration_logp: torch.Tensor,
                       durations: Sequence[int], logit_lengths: torch.Tensor,
                       target_lengths: torch.Tensor, *, kernel: bool = False) -> torch.Tensor:
    """TDT log P [B] from each node's blank token log-prob [B, T, U + 1], next-label token log-prob
    [B, T, U] (sigma already taken off both) and duration log-probs [B, T, U + 1, len(durations)]; ``kernel``:
    as in :func:`lattice_log_likelihood`."""
    blank_durations = [d for d in durations if d > 0]
    blank_weight = torch.stack([blank_logp + duration_logp[..., i]
                                for i, d in enumerate(durations) if d > 0])
    label_weight = torch.stack([F.pad(label_logp + duration_logp[:, :, :-1, i], (0, 1), value=LOG_ZERO)
                                for i in range(len(durations))])
    return lattice_log_likelihood(blank_weight, label_weight, blank_durations=blank_durations,
                                  label_durations=durations, logit_lengths=logit_lengths,
                                  target_lengths=target_lengths, kernel=kernel)


def lattice_log_likelihood(blank_weight: torch.Tensor, label_weight: torch.Tensor, *,
                           blank_durations: Sequence[int], label_durations: Sequence[int],
                           logit_lengths: torch.Tensor, target_lengths: torch.Tensor,
                           kernel: bool = False) -> torch.Tensor:
    """log P(targets | audio) [B] summed over every alignment of a transducer lattice.

    blank_weight [len(blank_durations), B, T, U + 1]: log-weight of a blank with that duration at
    (t, u). label_weight [len(label_durations), B, T, U + 1]: log-weight of emitting label u + 1 with
    that duration at (t, u) (column U must be LOG_ZERO). Alignments end with a blank landing exactly on
    frame logit_lengths[b] at u = target_lengths[b]; fp32 (fp64 for fp64 weights). The gradient is analytic (a
    backward recursion over the diagonals when backward runs), not autograd through the loop; first
    derivatives only (``create_graph=True`` and ``torch.func`` transforms raise). Its absolute fp32 error
    grows in proportion to |log P| (alpha + beta - log P cancels large terms). An utterance with no
    alignment (e.g. TDT durations that cannot sum to its length) gets log P near
    LOG_ZERO and a zero gradient. ``kernel``: fp32 weights on CUDA run as the Triton lattice kernel (alpha, beta
    and log P in one launch) where triton imports; else (and by default) the diagonal loop here.
    """
    dtype = _compute_dtype(blank_weight)
    log_likelihood, *_ = _LatticeLogLikelihood.apply(blank_weight.to(dtype), label_weight.to(dtype),
                                                     tuple(blank_durations), tuple(label_durations), logit_lengths,
                                                     target_lengths, kernel)
    return log_likelihood


class _LatticeLogLikelihood(torch.autograd.Function):
    """Forward: alpha over the diagonals. Backward: beta too, and the gradient of each edge weight w from
    (t, u), its posterior exp(alpha(t, u) + w + beta(destination) - log P). First derivatives only."""

    @staticmethod
    def forward(blank_weight, label_weight, blank_durations, label_durations, logit_lengths, target_lengths, kernel):
        lattice = _Lattice(blank_weight, label_weight, blank_durations, label_durations, logit_lengths,
                           target_lengths)
        if kernel and _lattice_kernel_runs(blank_weight):  # beta now too, by the same launch, when backward will run
            want_beta = blank_weight.requires_grad or label_weight.requires_grad
            log_likelihood, alpha, beta = lattice.kernel(want_beta)
            return log_likelihood, alpha, beta if want_beta else alpha[:0]
        alpha = lattice.alphas()
        return lattice.finals(alpha), alpha, alpha[:0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        blank_weight, label_weight, blank_durations, label_durations, logit_lengths, target_lengths, _ = inputs
        log_likelihood, alpha, beta = output
        ctx.durations = (blank_durations, label_durations)
        ctx.mark_non_differentiable(alpha, beta)
        ctx.save_for_backward(blank_weight, label_weight, logit_lengths, target_lengths, alpha, beta, log_likelihood)

    @staticmethod
    def backward(ctx, grad_output, _grad_alpha, _grad_beta):
        if torch.is_grad_enabled():  # create_graph=True: a Hessian would silently miss the lattice's own term
            raise RuntimeError("transducer losses: second derivatives are not supported (the gradient is computed "
                               "analytically); use create_graph=False")
        blank_weight, label_weight, logit_lengths, target_lengths, alpha, beta, log_likelihood = ctx.saved_tensors
        lattice = _Lattice(blank_weight, label_weight, *ctx.durations, logit_lengths, target_lengths)
        final_masks = lattice.final_masks()
        if not beta.numel():
            beta = lattice.betas(final_masks)
        grad_blank, grad_label = lattice.gradients(alpha, beta, log_likelihood, final_masks)
        scale = grad_output[None, :, None, None]
        return grad_blank * scale, grad_label * scale, None, None, None, None, None


class _Lattice:
    """The lattice on anti-diagonals n = t + u: x[..., n, u] = x(t = n - u, u), LOG_ZERO off the lattice."""

    def __init__(self, blank_weight, label_weight, blank_durations, label_durations, logit_lengths, target_lengths):
        _, self.batch, self.num_frames, self.num_cols = blank_weight.shape
        self.device = blank_weight.device
        self.blank_skewed, self.on_lattice = _skew(blank_weight)
        self.label_skewed, _ = _skew(label_weight)
        self.blank_durations, self.label_durations = blank_durations, label_durations
        self.num_diagonals = self.num_frames + self.num_cols - 1
        self.u_end, self.t_end = target_lengths.long().to(self.device), logit_lengths.long().to(self.device)

    def kernel(self, want_beta: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(log P, alpha, beta or None) by the Triton lattice kernel (fp32 weights on CUDA): one slot per
        label duration, the blanks' in the first slots (duration 0: no blank edge)."""
        from workbench.models.losses_triton import lattice_kernel

        num_slots = max(len(self.blank_durations), len(self.label_durations))
        weights = torch.full((self.batch, 2, num_slots, self.num_diagonals, self.num_cols), LOG_ZERO,
                             device=self.device)
        weights[:, 0, :len(self.blank_durations)] = self.blank_skewed.transpose(0, 1)
        weights[:, 1, :len(self.label_durations)] = self.label_skewed.transpose(0, 1)
        pad = [0] * (num_slots - len(self.blank_durations))
        return lattice_kernel(weights, list(self.blank_durations) + pad, list(self.label_durations) + [0] * (
            num_slots - len(self.label_durations)), self.t_end, self.u_end, want_beta)

    def alphas(self) -> torch.Tensor:
        """alpha [B, diagonals, U + 1]: log-sum over partial alignments reaching each node."""
        start = torch.full((self.batch, self.num_cols), LOG_ZERO, device=self.device)
        start[:, 0] = 0.0
        alphas = [start]
        log_zero_column = torch.full((self.batch, 1), LOG_ZERO, device=self.device)
        for n in range(1, self.num_diagonals):
            terms = [alphas[n - d] + self.blank_skewed[i, :, n - d]
                     for i, d in enumerate(self.blank_durations) if n - d >= 0]
            label_terms = [alphas[n - 1 - d] + self.label_skewed[i, :, n - 1 - d]
                           for i, d in enumerate(self.label_durations) if n - 1 - d >= 0]
            if label_terms:
                from_below = _logsumexp_list(label_terms)  # indexed by the source column u - 1
                terms.append(torch.cat([log_zero_column, from_below[:, :-1]], dim=1))
            alphas.append(torch.where(self.on_lattice[n], _logsumexp_list(terms), LOG_ZERO) if terms
                          else torch.full_like(start, LOG_ZERO))  # no edge reaches this diagonal
        return torch.stack(alphas, dim=1)

    def finals(self, alpha: torch.Tensor) -> torch.Tensor:
        """log P [B]: alpha of each final node plus its ending blank (a blank of duration d from frame
        logit_lengths[b] - d at u = target_lengths[b])."""
        rows = torch.arange(self.batch, device=self.device)
        finals = []
        for i, d in enumerate(self.blank_durations):
            t_from = self.t_end - d
            n_from = t_from.clamp(min=0) + self.u_end
            value = alpha[rows, n_from, self.u_end] + self.blank_skewed[i, rows, n_from, self.u_end]
            finals.append(torch.where(t_from >= 0, value, LOG_ZERO))
        return _logsumexp_list(finals)

    def final_masks(self) -> list[torch.Tensor]:
        """Per blank duration d, [B, diagonals, U + 1]: the node whose blank of duration d ends the
        alignment (the nodes :meth:`finals` reads), for the backward pass."""
        n = torch.arange(self.num_diagonals, device=self.device)[None, :, None]
        u = torch.arange(self.num_cols, device=self.device)[None, None, :]
        u_end, t_end = self.u_end[:, None, None], self.t_end[:, None, None]
        return [(u == u_end) & (n == t_end - d + u) & (t_end - d >= 0) for d in self.blank_durations]

    def betas(self, final_masks: list[torch.Tensor]) -> torch.Tensor:
        """beta [B, diagonals, U + 1]: log-sum over the rest of the alignment from each node."""
        betas = [None] * self.num_diagonals
        log_zero = torch.full((self.batch, self.num_cols), LOG_ZERO, device=self.device)
        log_zero_column = torch.full((self.batch, 1), LOG_ZERO, device=self.device)
        ending = _logsumexp_list([torch.where(mask, self.blank_skewed[i], LOG_ZERO)  # the ending blanks (beta
                                  for i, mask in enumerate(final_masks)])          # of the end is 0)
        for n in range(self.num_diagonals - 1, -1, -1):
            terms = [ending[:, n]]
            terms += [betas[n + d] + self.blank_skewed[i, :, n] for i, d in enumerate(self.blank_durations)
                      if n + d < self.num_diagonals]
            terms += [torch.cat([betas[n + 1 + d][:, 1:], log_zero_column], dim=1) + self.label_skewed[i, :, n]
                      for i, d in enumerate(self.label_durations) if n + 1 + d < self.num_diagonals]
            betas[n] = torch.where(self.on_lattice[n], _logsumexp_list(terms), log_zero)
        return torch.stack(betas, dim=1)

    def gradients(self, alpha, beta, log_likelihood, final_masks) -> tuple[torch.Tensor, torch.Tensor]:
        """d log P / d blank_weight and d label_weight, in their [K, B, T, U + 1] layout."""
        base = alpha - torch.where(log_likelihood > LOG_ZERO / 2, log_likelihood, 0.0)[:, None, None]
        log_zero = torch.full_like(beta, LOG_ZERO)

        def shifted(diagonals: int, columns: int) -> torch.Tensor:  # beta[:, n + diagonals, u + columns]
            out = log_zero.clone()
            if diagonals < self.num_diagonals:
                out[:, :self.num_diagonals - diagonals, :self.num_cols - columns] = beta[:, diagonals:, columns:]
            return out

        grad_blank = torch.stack([
            torch.exp(base + self.blank_skewed[i] + torch.where(final_masks[i], 0.0, shifted(d, 0)))
            for i, d in enumerate(self.blank_durations)])
        grad_label = torch.stack([torch.exp(base + self.label_skewed[i] + shifted(d + 1, 1))
                                  for i, d in enumerate(self.label_durations)])
        return _unskew(grad_blank, self.num_frames), _unskew(grad_label, self.num_frames)


def label_smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, smoothing: float = 0.1,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Mean token cross-entropy (fp32) with label smoothing; positions equal to ignore_index are skipped.

    logits [B, L, C], targets [B, L]. The value of F.cross_entropy(..., label_smoothing=smoothing), made
    of elementwise ops and sums only, so a CUDA step never waits on the host for it.
    """
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"targets: shape {tuple(targets.shape)} does not match logits {tuple(logits.shape[:2])}")
    log_probs = logits.float().log_softmax(-1)
    counted = targets != ignore_index
    target_log_prob = log_probs.gather(-1, targets.masked_fill(~counted, 0)[..., None])[..., 0]
    per_token = -(1.0 - smoothing) * target_log_prob - smoothing * log_probs.mean(-1)
    return torch.where(counted, per_token, 0.0).sum() / counted.sum()


def _lattice_kernel_runs(weights: torch.Tensor) -> bool:
    """Whether the lattice of these fp32 edge weights runs as the Triton lattice kernel (real CUDA tensors and
    triton importable), else as the diagonal loop here."""
    if weights.device.type != "cuda" or weights.dtype != torch.float32 or _is_fake(weights):
        return False
    return triton_unavailable_reason(weights.device, kernels_module="workbench.models.losses_triton") is None


def _is_fake(x: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(x)


def _skew(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., T, U + 1] -> [..., T + U, U + 1] with out[..., n, u] = x[..., n - u, u]; LOG_ZERO off-lattice."""
    num_frames, num_cols = x.shape[-2:]
    n = torch.arange(num_frames + num_cols - 1, device=x.device)[:, None]
    u = torch.arange(num_cols, device=x.device)[None, :]
    t = n - u
    on_lattice = (t >= 0) & (t < num_frames)
    skewed = x[..., t.clamp(0, num_frames - 1), u]
    return torch.where(on_lattice, skewed, LOG_ZERO), on_lattice


def _unskew(x: torch.Tensor, num_frames: int) -> torch.Tensor:
    """The inverse of :func:`_skew`: [..., T + U, U + 1] -> [..., T, U + 1]."""
    num_cols = x.shape[-1]
    t = torch.arange(num_frames, device=x.device)[:, None]
    u = torch.arange(num_cols, device=x.device)[None, :]
    return x[..., t + u, u]


def _logsumexp_list(xs: list[torch.Tensor]) -> torch.Tensor:
    return xs[0] if len(xs) == 1 else torch.logsumexp(torch.stack(xs), dim=0)


def _gather_labels(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits[b, t, u, targets[b, u]] for u < U -> [B, T, U]."""
    batch, num_frames, _, _ = logits.shape
    num_labels = targets.shape[1]
    index = targets.long()[:, None, :, None].expand(batch, num_frames, num_labels, 1)
    return logits[:, :, :num_labels, :].gather(-1, index).squeeze(-1)
