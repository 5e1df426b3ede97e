"""train_in_parts: a batch that runs out of memory is trained in parts whose accumulated gradient is the
whole batch's, every row once."""

import pytest
import torch

from workbench.training.split_batch import (PartsTrained, UtteranceOutOfMemoryError, balanced_parts, slice_batch,
                                            train_in_parts)


def _batch(num_rows=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    audio_lens = torch.randint(3, 9, (num_rows,), generator=generator)
    token_lens = torch.randint(0, 4, (num_rows,), generator=generator)
    audio = torch.randn(num_rows, int(audio_lens.max()), generator=generator)
    audio = audio * (torch.arange(audio.shape[1])[None] < audio_lens[:, None])
    tokens = torch.randint(1, 5, (num_rows, max(1, int(token_lens.max()))), generator=generator)
    return {"audio": audio, "audio_lens": audio_lens, "tokens": tokens, "token_lens": token_lens,
            "cut_ids": [f"cut{i}" for i in range(num_rows)], "rows": torch.arange(num_rows)}


class Model(torch.nn.Module):
    """Per-utterance sums of squares over target tokens, reduced like the reference models: summed loss / max(1,
    target tokens). Runs out of memory in forward above ``forward_limit`` rows, in backward (after the head's
    gradient is written) above ``backward_limit`` rows; records the rows each forward pass took."""

    def __init__(self, forward_limit=10**9, backward_limit=10**9, never_fits=()):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Linear(8, 4)
        self.head = torch.nn.Linear(4, 1)
        self.forward_limit, self.backward_limit, self.never_fits = forward_limit, backward_limit, set(never_fits)
        self.rows: list[list[int]] = []

    @staticmethod
    def normalizer(token_lens):
        return token_lens.sum().clamp_min(1)

    def forward(self, batch):
        rows = batch["rows"].tolist()
        if len(rows) > self.forward_limit or self.never_fits & set(rows):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        self.rows.append(rows)
        audio = torch.nn.functional.pad(batch["audio"], (0, 8 - batch["audio"].shape[1]))
        hidden = torch.tanh(self.encoder(audio))
        limit, size = self.backward_limit, len(rows)

        class FailInBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                if size > limit:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
                return grad

        per_row = self.head(FailInBackward.apply(hidden))[:, 0] ** 2
        return (per_row * batch["token_lens"]).sum() / self.normalizer(batch["token_lens"])


def _train(model, batch, **kw):
    model.zero_grad(set_to_none=True)
    parts = train_in_parts(batch, forward=model, to_device=lambda part: part, normalizer=model.normalizer,
                           zero_grad=lambda: model.zero_grad(set_to_none=True), **kw)
    return parts, {name: p.grad.clone() for name, p in model.named_parameters()}


def _assert_same_gradients(got, expected):
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("limit", ["forward_limit", "backward_limit"])
def test_a_batch_out_of_memory_is_trained_in_halves_with_the_whole_batch_gradient(limit):
    batch = _batch(7)
    whole, expected = _train(Model(), batch)
    assert whole.part_sizes == [7] and whole.failed_sizes == [] and whole.safe_size is None
    model = Model(**{limit: 2})
    parts, got = _train(model, batch)
    _assert_same_gradients(got, expected)
    torch.testing.assert_close(parts.loss, whole.loss)
    assert parts.part_sizes == [2, 2, 2, 1]  # 7 -> 4 + 3 -> (2 + 2) + (2 + 1)
    assert parts.failed_sizes == [7, 4, 3] and parts.safe_size == 2
    trained = [row for rows in model.rows for row in rows]
    if limit == "forward_limit":  # nothing trained twice: the forward passes that failed took nothing
        assert trained == list(range(7))
    else:  # a backward pass that fails may have written gradients: the parts done so far are trained again
        assert sorted(set(trained)) == list(range(7))
        assert model.rows[-4:] == [[0, 1], [2, 3], [4, 5], [6]]


def test_max_rows_starts_from_balanced_parts_and_one_utterance_that_does_not_fit_is_named():
    batch = _batch(7)
    _, expected = _train(Model(), batch)
    model = Model()
    parts, got = _train(model, batch, max_rows=3)
    assert parts.part_sizes == [3, 2, 2] and parts.failed_sizes == [] and model.rows == [[0, 1, 2], [3, 4], [5, 6]]
    _assert_same_gradients(got, expected)
    model = Model(forward_limit=2, never_fits={5})
    with pytest.raises(UtteranceOutOfMemoryError, match=r"one utterance \(row 5 of 7\)") as caught:
        _train(model, batch)
    assert caught.value.row == 5
    assert all(p.grad is None for p in model.parameters())  # nothing half-accumulated is left


def test_errors_that_are_not_out_of_memory_pass_through():
    def forward(batch):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        train_in_parts(_batch(3), forward=forward, to_device=lambda p: p, normalizer=Model.normalizer,
                       zero_grad=lambda: None)


def test_a_part_holds_its_rows_with_the_padding_trimmed():
    batch = _batch(5)
    assert slice_batch(batch, 0, 5) is batch
    part = slice_batch(batch, 1, 3)
    assert part["cut_ids"] == ["cut1", "cut2"] and part["rows"].tolist() == [1, 2]
    assert part["audio"].shape == (2, int(batch["audio_lens"][1:3].max()))
    assert part["tokens"].shape == (2, max(1, int(batch["token_lens"][1:3].max())))
    assert torch.equal(part["audio"], batch["audio"][1:3, :part["audio"].shape[1]])


def test_balanced_parts_and_safe_size():
    assert balanced_parts(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert balanced_parts(4, 4) == [(0, 4)] and balanced_parts(1, 9) == [(0, 1)]
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        balanced_parts(3, 0)
    assert PartsTrained(torch.zeros(()), [5, 3, 2], failed_sizes=[10, 5]).safe_size == 3
