"""A reference model that runs out of memory on purpose and records which utterances each optimizer step
trained, for the recipe's out-of-memory tests (CPU, and on a GPU with real out-of-memory errors)."""

import hashlib

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from lhotse import CutSet

from workbench.data.tokenizer import load_tokenizer
from workbench.models import build_model
from workbench.training.collate import collate_cuts


def audio_key(samples: torch.Tensor) -> str:
    """A fingerprint of one utterance's samples (the same in any batch it is collated into)."""
    return hashlib.sha1(samples.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


def ids_by_audio(cuts_path, tokenizer_path) -> dict[str, str]:
    """Fingerprint of each cut's collated audio -> its cut id."""
    tokenizer = load_tokenizer(tokenizer_path)
    keys = {}
    for cut in CutSet.from_file(cuts_path):
        batch = collate_cuts([cut], tokenizer)
        keys[audio_key(batch["audio"][0, :int(batch["audio_lens"][0])])] = cut.id
    assert len(keys) == len(CutSet.from_file(cuts_path)), "two cuts have the same audio"
    return keys


class LimitedMemory:
    """Builds models (``build(name, vocab_size=..., joint_chunk_size=..., joint_loss=...)``, as ``build_model``) whose forward
    pass raises torch.OutOfMemoryError on a batch of more than ``max_utterances`` utterances or holding one of
    ``never_fits`` (cut ids), and records the cut ids that each optimizer step trained in ``steps``.

    An utterance counts as trained by a step when a forward pass took it after the gradients were last
    dropped (a part trained again after an out-of-memory in a backward pass counts once). ``batch_norm``
    False replaces the BatchNorm layers by identities, so a batch trained in parts has the gradient of the
    whole batch."""

    def __init__(self, keys: dict[str, str], max_utterances: int = 10**9, *, never_fits=(), batch_norm=False):
        self.keys, self.max_utterances, self.never_fits = keys, max_utterances, set(never_fits)
        self.batch_norm = batch_norm
        self.steps: list[list[str]] = []  # cut ids trained, per optimizer step
        self.pending: list[str] = []
        self.forward_sizes: list[int] = []  # utterances of each forward pass tried
        self._hook = register_optimizer_step_pre_hook(self._commit)

    def close(self) -> None:
        """Stop recording optimizer steps."""
        self._hook.remove()

    def _commit(self, optimizer, args, kwargs) -> None:
        self.steps.append(self.pending)
        self.pending = []

    @property
    def trained(self) -> list[str]:
        return [cut for step in self.steps for cut in step]

    def build(self, name: str, *, vocab_size: int, joint_chunk_size: int = 0, joint_loss: str = "materialized"):
        model = build_model(name, vocab_size=vocab_size, joint_chunk_size=joint_chunk_size, joint_loss=joint_loss)
        if not self.batch_norm:
            for module in list(model.modules()):
                for child_name, child in list(module.named_children()):
                    if isinstance(child, torch.nn.BatchNorm1d):
                        setattr(module, child_name, torch.nn.Identity())
        first_parameter = next(model.parameters())
        loss = model.loss

        def forward(batch):
            lengths = batch["audio_lens"].tolist()
            ids = [self.keys[audio_key(batch["audio"][i, :n])] for i, n in enumerate(lengths)]
            self.forward_sizes.append(len(ids))
            if len(ids) > self.max_utterances or self.never_fits & set(ids):
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB ({len(ids)} "
                                             "utterances, from the test model)")
            value = loss(batch)
            if first_parameter.grad is None:  # the gradients were dropped since the last forward pass
                self.pending = []
            self.pending.extend(ids)
            return value

        model.forward = forward
        return model
