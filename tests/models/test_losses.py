"""RNN-T and TDT losses equal brute-force enumeration of alignments; gradients are finite."""

import math

import pytest
import torch

from workbench.models.losses import label_smoothed_cross_entropy, rnnt_loss, tdt_loss


def _rnnt_alignments(num_frames, labels):
    """Every RNN-T alignment as a list of (t, u, symbol) steps; symbol None is blank."""
    out = []

    def walk(t, u, path):
        if u < len(labels):
            walk(t, u + 1, path + [(t, u, labels[u])])
        if t + 1 < num_frames:
            walk(t + 1, u, path + [(t, u, None)])
        elif u == len(labels):  # final blank at the last frame
            out.append(path + [(t, u, None)])

    walk(0, 0, [])
    return out


def _tdt_alignments(num_frames, labels, durations):
    """Every TDT alignment as (t, u, symbol, duration index) steps, ending with a blank landing on T."""
    out = []

    def walk(t, u, path):
        for k, d in enumerate(durations):
            if u < len(labels) and t + d < num_frames:
                walk(t + d, u + 1, path + [(t, u, labels[u], k)])
            if d > 0 and t + d < num_frames:
                walk(t + d, u, path + [(t, u, None, k)])
            if d > 0 and t + d == num_frames and u == len(labels):
                out.append(path + [(t, u, None, k)])

    walk(0, 0, [])
    return out


def _brute_rnnt(logits, labels, blank):
    logp = logits.double().log_softmax(-1)
    total = [sum(logp[t, u, blank if s is None else s].item() for t, u, s in path)
             for path in _rnnt_alignments(logits.shape[0], labels)]
    return -math.log(sum(math.exp(x) for x in total)), len(total)


def _brute_tdt(logits, labels, blank, durations):
    num_tokens = logits.shape[-1] - len(durations)
    tok = logits[..., :num_tokens].double().log_softmax(-1)
    dur = logits[..., num_tokens:].double().log_softmax(-1)
    total = [sum(tok[t, u, blank if s is None else s].item() + dur[t, u, k].item() for t, u, s, k in path)
             for path in _tdt_alignments(logits.shape[0], labels, durations)]
    return -math.log(sum(math.exp(x) for x in total)), len(total)


def _padded_batch(cases, num_classes, seed):
    """Random logits for (T, labels) cases padded to one batch, with garbage in the padding."""
    gen = torch.Generator().manual_seed(seed)
    max_t = max(t for t, _ in cases)
    max_u = max(len(lab) for _, lab in cases)
    logits = torch.randn(len(cases), max_t, max_u + 1, num_classes, generator=gen) * 2
    targets = torch.full((len(cases), max_u), 1, dtype=torch.long)
    for b, (_, lab) in enumerate(cases):
        targets[b, :len(lab)] = torch.tensor(lab, dtype=torch.long)
    logit_lengths = torch.tensor([t for t, _ in cases])
    target_lengths = torch.tensor([len(lab) for _, lab in cases])
    return logits, targets, logit_lengths, target_lengths


RNNT_CASES = [(1, []), (1, [2]), (3, [1, 2]), (4, [2, 2, 1]), (2, [1, 1, 1]), (5, [0])]


def test_rnnt_equals_brute_force_per_utterance_in_a_padded_batch():
    vocab, blank = 3, 3
    logits, targets, logit_lengths, target_lengths = _padded_batch(RNNT_CASES, vocab + 1, seed=0)
    losses = rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=blank, reduction="none")
    for b, (num_frames, labels) in enumerate(RNNT_CASES):
        expected, count = _brute_rnnt(logits[b, :num_frames, :len(labels) + 1], labels, blank)
        assert count == math.comb(num_frames - 1 + len(labels), len(labels))
        assert losses[b].item() == pytest.approx(expected, rel=1e-5, abs=1e-5), (num_frames, labels)


def test_rnnt_blank_first_and_negative_blank_index_agree():
    # Blank at index 0 with labels shifted up equals blank at the last index (-1) on permuted logits.
    logits, targets, logit_lengths, target_lengths = _padded_batch([(3, [0, 1]), (4, [2])], 4, seed=1)
    last = rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=-1, reduction="none")
    moved = torch.cat([logits[..., 3:], logits[..., :3]], dim=-1)
    first = rnnt_loss(moved, targets + 1, logit_lengths, target_lengths, blank=0, reduction="none")
    torch.testing.assert_close(first, last)


TDT_CASES = [(1, []), (2, [1]), (3, [1, 2]), (5, [2, 0, 1]), (6, [1]), (4, [1, 1, 1, 1])]


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (0, 1, 2), (1, 2)])
def test_tdt_equals_brute_force_per_utterance_in_a_padded_batch(durations):
    vocab, blank = 3, 3
    cases = [c for c in TDT_CASES if 0 in durations or c[0] >= len(c[1]) + 1]
    logits, targets, logit_lengths, target_lengths = _padded_batch(cases, vocab + 1 + len(durations), seed=2)
    losses = tdt_loss(logits, targets, logit_lengths, target_lengths, blank=blank, durations=durations,
                      reduction="none")
    for b, (num_frames, labels) in enumerate(cases):
        expected, count = _brute_tdt(logits[b, :num_frames, :len(labels) + 1], labels, blank, durations)
        assert count > 0
        assert losses[b].item() == pytest.approx(expected, rel=1e-5, abs=1e-5), (num_frames, labels)


def test_tdt_sigma_lowers_likelihood_by_sigma_per_step():
    # Every alignment of (T=1, no labels) is one blank: loss grows by exactly sigma.
    logits = torch.randn(1, 1, 1, 4 + 5)
    args = (logits, torch.zeros(1, 0, dtype=torch.long), torch.tensor([1]), torch.tensor([0]))
    base = tdt_loss(*args, blank=3, reduction="sum")
    shifted = tdt_loss(*args, blank=3, sigma=0.05, reduction="sum")
    assert shifted.item() == pytest.approx(base.item() + 0.05, abs=1e-5)


@pytest.mark.parametrize("which", ["rnnt", "tdt"])
def test_gradients_are_finite_and_match_finite_differences(which):
    torch.manual_seed(0)
    extra = 5 if which == "tdt" else 0
    logits, targets, logit_lengths, target_lengths = _padded_batch([(4, [1, 2]), (2, [0])], 4 + extra, seed=3)
    logits = logits.requires_grad_()  # the loss works in fp32 whatever comes in

    def loss_fn(x):
        if which == "rnnt":
            return rnnt_loss(x, targets, logit_lengths, target_lengths, blank=3, reduction="sum")
        return tdt_loss(x, targets, logit_lengths, target_lengths, blank=3, reduction="sum")

    loss = loss_fn(logits)
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.isfinite(grad).all()
    # padding (item 1 beyond T=2 / U=1) gets no gradient
    assert grad[1, 2:].abs().max() == 0 and grad[1, :, 2:].abs().max() == 0
    # the gradient of a token logit matches a central difference
    idx = (0, 1, 1, 2)
    eps = 1e-2
    plus, minus = logits.detach().clone(), logits.detach().clone()
    plus[idx] += eps
    minus[idx] -= eps
    numeric = (loss_fn(plus) - loss_fn(minus)).item() / (2 * eps)
    assert grad[idx].item() == pytest.approx(numeric, rel=1e-2, abs=1e-3)


def test_bf16_logits_give_fp32_loss_close_to_fp32():
    logits, targets, logit_lengths, target_lengths = _padded_batch([(6, [1, 2, 0]), (5, [2])], 4, seed=4)
    ref = rnnt_loss(logits.bfloat16().float(), targets, logit_lengths, target_lengths, reduction="none")
    got = rnnt_loss(logits.bfloat16(), targets, logit_lengths, target_lengths, reduction="none")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref)


def test_bad_inputs_name_the_field_and_count():
    logits, targets, logit_lengths, target_lengths = _padded_batch([(3, [1]), (2, [0])], 4, seed=5)
    with pytest.raises(ValueError, match="logit_lengths: 1 of 2"):
        rnnt_loss(logits, targets, torch.tensor([3, 4]), target_lengths)
    with pytest.raises(ValueError, match="target_lengths: 2 of 2"):
        rnnt_loss(logits, targets, logit_lengths, torch.tensor([2, 3]))
    with pytest.raises(ValueError, match="targets: 1 labels are blank"):
        rnnt_loss(logits, torch.tensor([[3], [0]]), logit_lengths, target_lengths, blank=3)
    with pytest.raises(ValueError, match="durations"):
        tdt_loss(torch.randn(2, 3, 2, 5), targets, logit_lengths, target_lengths, blank=0, durations=(0,))


def test_label_smoothed_cross_entropy_ignores_padding_and_smooths():
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, 2, -100], [4, -100, -100]])
    plain = label_smoothed_cross_entropy(logits, targets, smoothing=0.0)
    manual = -torch.stack([logits[0, 0].log_softmax(-1)[1], logits[0, 1].log_softmax(-1)[2],
                           logits[1, 0].log_softmax(-1)[4]]).mean()
    torch.testing.assert_close(plain, manual)
    smoothed = label_smoothed_cross_entropy(logits, targets, smoothing=0.1)
    uniform = -torch.stack([logits[0, 0].log_softmax(-1).mean(), logits[0, 1].log_softmax(-1).mean(),
                            logits[1, 0].log_softmax(-1).mean()]).mean()
    torch.testing.assert_close(smoothed, 0.9 * manual + 0.1 * uniform)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_label_smoothed_cross_entropy_equals_torch_in_value_and_gradient(smoothing):
    torch.manual_seed(0)
    logits = torch.randn(4, 7, 11, requires_grad=True)
    targets = torch.randint(0, 11, (4, 7))
    targets[1, 3:] = -100
    targets[3, 1:] = -100
    ours = label_smoothed_cross_entropy(logits, targets, smoothing=smoothing)
    theirs = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), label_smoothing=smoothing)
    torch.testing.assert_close(ours, theirs)
    ours_grad, = torch.autograd.grad(ours, logits)
    theirs_grad, = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(ours_grad, theirs_grad)


@pytest.mark.gpu
def test_rnnt_matches_torchaudio_on_gpu():
    torchaudio_functional = pytest.importorskip("torchaudio.functional")
    if not hasattr(torchaudio_functional, "rnnt_loss"):
        pytest.skip("this torchaudio has no rnnt_loss")
    gen = torch.Generator().manual_seed(0)
    batch, frames, labels, vocab = 4, 40, 12, 30
    logits = (torch.randn(batch, frames, labels + 1, vocab + 1, generator=gen) * 3).cuda().requires_grad_()
    targets = torch.randint(0, vocab, (batch, labels), generator=gen).int().cuda()
    logit_lengths = torch.tensor([40, 33, 20, 7], dtype=torch.int32).cuda()
    target_lengths = torch.tensor([12, 9, 12, 3], dtype=torch.int32).cuda()
    ours = rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=vocab, reduction="none")
    (our_grad,) = torch.autograd.grad(ours.sum(), logits)
    theirs = torchaudio_functional.rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=vocab,
                                             reduction="none")
    (their_grad,) = torch.autograd.grad(theirs.sum(), logits)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-3)
    # Gradients are probability differences in [-1, 1]; fp32 posteriors exp(alpha + beta - L) at a
    # log-likelihood L of a few hundred carry about L * 2**-23 relative error, so 1e-3 absolute.
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("blank_durations, label_durations", [([1], [0]), ([1, 2, 4], [0, 1, 2, 4]), ([2, 3], [1])])
def test_analytic_gradient_equals_autograd_through_the_recursion(blank_durations, label_durations):
    from workbench.models.losses import LOG_ZERO, _Lattice, lattice_log_likelihood

    torch.manual_seed(1)
    batch, frames, cols = 3, 9, 5
    blank_weight = torch.randn(len(blank_durations), batch, frames, cols).log_softmax(-1).requires_grad_()
    label = torch.randn(len(label_durations), batch, frames, cols).log_softmax(-1)
    label[..., -1] = LOG_ZERO  # nothing to emit once u == U
    label_weight = label.requires_grad_()
    logit_lengths, target_lengths = torch.tensor([9, 6, 7]), torch.tensor([4, 2, 0])
    upstream = torch.tensor([1.0, -0.5, 2.0])  # a weighted sum, so each item's scale is checked

    ours = lattice_log_likelihood(blank_weight, label_weight, blank_durations=blank_durations,
                                  label_durations=label_durations, logit_lengths=logit_lengths,
                                  target_lengths=target_lengths)
    grads = torch.autograd.grad((ours * upstream).sum(), (blank_weight, label_weight))
    lattice = _Lattice(blank_weight, label_weight, tuple(blank_durations), tuple(label_durations), logit_lengths,
                       target_lengths)
    reference = lattice.finals(lattice.alphas())  # the same recursion, differentiated by autograd
    expected = torch.autograd.grad((reference * upstream).sum(), (blank_weight, label_weight))
    assert torch.allclose(ours, reference)
    assert torch.isfinite(ours).all() and (ours > LOG_ZERO / 2).all()
    for got, want in zip(grads, expected):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert grads[0].abs().sum() > 0 and grads[1].abs().sum() > 0


def test_no_gradient_work_without_a_gradient(monkeypatch):
    from workbench.models.losses import _Lattice

    logits, targets, logit_lengths, target_lengths = _padded_batch([(6, [1, 2, 0]), (5, [2])], 4, seed=4)
    calls = []
    original = _Lattice.betas
    monkeypatch.setattr(_Lattice, "betas", lambda self, *args: calls.append(1) or original(self, *args))
    with torch.no_grad():
        rnnt_loss(logits, targets, logit_lengths, target_lengths)
    rnnt_loss(logits, targets, logit_lengths, target_lengths)  # logits need no gradient either
    assert calls == []
    rnnt_loss(logits.requires_grad_(), targets, logit_lengths, target_lengths).backward()
    assert calls == [1]


def test_second_derivatives_are_refused_with_a_reason():
    logits, targets, logit_lengths, target_lengths = _padded_batch([(5, [1, 2]), (4, [0])], 4, seed=5)
    x = logits.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="second derivatives"):  # no Hessian silently missing the lattice term
        torch.autograd.grad(rnnt_loss(x, targets, logit_lengths, target_lengths), x, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivatives"):  # torch.func differentiates with a graph too
        torch.func.grad(lambda y: rnnt_loss(y, targets, logit_lengths, target_lengths))(logits)
    (grad,) = torch.autograd.grad(rnnt_loss(x, targets, logit_lengths, target_lengths), x)  # first order: fine
    assert torch.isfinite(grad).all() and grad.abs().max() > 0


def test_an_utterance_with_no_alignment_gets_zero_gradient():
    from workbench.models.losses import LOG_ZERO

    # TDT durations (0, 2): a blank moves 2 frames, so 3 frames cannot be covered; the other item can
    logits, targets, logit_lengths, target_lengths = _padded_batch([(3, [1]), (4, [1])], 4 + 2, seed=6)
    x = logits.clone().requires_grad_()
    losses = tdt_loss(x, targets, logit_lengths, target_lengths, blank=3, durations=(0, 2), reduction="none")
    assert losses[0].item() > -LOG_ZERO / 2 and losses[1].item() < 1e3
    losses.sum().backward()
    assert x.grad[0].abs().max() == 0 and x.grad[1].abs().max() > 0


def test_float64_logits_give_a_float64_reference_that_fp32_matches():
    # the losses bench measures the fp32 kernels against this float64 reference
    from workbench.models.losses import rnnt_loss_reference, tdt_loss_reference

    torch.manual_seed(3)
    targets = torch.randint(0, 7, (3, 4))
    t_len, u_len = torch.tensor([7, 5, 6]), torch.tensor([4, 2, 3])
    cases = [(rnnt_loss_reference, 9, dict(blank=8)),                      # 8 classes: 7 labels + blank
             (tdt_loss_reference, 11, dict(blank=7, durations=[0, 1, 2]))]  # 7 labels + blank + 3 durations
    for loss_fn, outputs, kw in cases:
        logits = torch.randn(3, 7, 5, outputs, dtype=torch.float64, requires_grad=True)
        loss64 = loss_fn(logits, targets, t_len, u_len, reduction="none", **kw)
        grad64, = torch.autograd.grad(loss64.sum(), logits)
        logits32 = logits.detach().float().requires_grad_()
        loss32 = loss_fn(logits32, targets, t_len, u_len, reduction="none", **kw)
        grad32, = torch.autograd.grad(loss32.sum(), logits32)
        assert loss64.dtype == grad64.dtype == torch.float64
        torch.testing.assert_close(loss32.double(), loss64, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad32.double(), grad64, rtol=1e-4, atol=1e-5)
        assert not torch.equal(loss32.double(), loss64)  # computed in float64, not cast back from fp32
