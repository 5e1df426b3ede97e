"""The model contract: what any model gives the OOMptimizer, how a spec names one, and the check of both.

A model keeps the contract when it is a ``torch.nn.Module`` with two methods (docs/MODEL_CONTRACT.md):

- ``make_batch(batch_size, duration_s, num_tokens, device) -> dict``: the worst case of a bucket, every
  utterance ``duration_s`` seconds long with ``num_tokens`` output tokens, as tensors on ``device`` whose
  first dimension is the batch. Length tensors end in ``_lens`` (e.g. ``audio_lens``, ``token_lens``): the
  soak after a search shortens them per utterance (the first keeps the bound), so the step must honour
  them (mask the padding).
- ``training_step(batch, *, dtype) -> Tensor``: forward, loss and backward in train mode, under bf16
  autocast when ``dtype`` is ``torch.bfloat16``; gradients accumulate into ``.grad`` and the scalar loss
  comes back detached. The caller owns the optimizer.

A spec names a model: a reference name (``large-rnnt``) or ``MODULE:CALLABLE``, where MODULE is an
importable module or a path to a ``.py`` file and CALLABLE, called with no arguments, returns the model.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

CONTRACT_METHODS = ("make_batch", "training_step")


class ModelContractError(ValueError):
    """A model spec or model that breaks the contract: one line naming the spec and what is wrong."""


def is_model_spec(name: str) -> bool:
    """True for ``MODULE:CALLABLE`` (a reference model name has no colon)."""
    return ":" in name


def load_model_factory(spec: str) -> Callable[[], Any]:
    """The callable that ``MODULE:CALLABLE`` names; MODULE may be a dotted module or a ``.py`` path."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ModelContractError(f"{spec}: expected MODULE:CALLABLE (e.g. my_models:build or ./model.py:build)")
    if module_name.endswith(".py") or "/" in module_name:
        module = _import_file(spec, Path(module_name))
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and (e.name == module_name or module_name.startswith(e.name + ".")):
                raise ModelContractError(f"{spec}: no module named {module_name!r} (is it on PYTHONPATH?)") from None
            raise ModelContractError(f"{spec}: importing {module_name} failed: {_first_line(e)}") from None
        except Exception as e:  # noqa: BLE001 - the user's module may raise anything at import
            raise ModelContractError(f"{spec}: importing {module_name} raised {_first_line(e)}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise ModelContractError(f"{spec}: {module_name} has no attribute {attr!r}")
    if not callable(factory):
        raise ModelContractError(f"{spec}: {attr} is a {type(factory).__name__}, not a callable")
    return factory


def _import_file(spec: str, path: Path):
    if not path.is_file():
        raise ModelContractError(f"{spec}: {path}: no such file")
    name = f"workbench_user_model_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:  # imported once per process, like any module
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # the file's imports of its neighbours, at import and when the factory runs
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file may raise anything at import
        del sys.modules[name]
        raise ModelContractError(f"{spec}: importing {path} raised {_first_line(e)}") from None
    return module


def build_model_from_spec(spec: str, device: torch.device | str | None) -> torch.nn.Module:
    """Call the spec's factory, check the contract's methods, move the model to ``device`` (None: leave it
    where the factory built it).

    Raises :class:`ModelContractError` with one line for every way this can fail."""
    factory = load_model_factory(spec)
    try:
        model = factory()
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything
        raise ModelContractError(f"{spec}: calling {factory.__name__}() raised {_first_line(e)}") from None
    check_contract_methods(spec, model)
    if device is None:
        return model
    try:
        model = model.to(device)
    except Exception as e:  # noqa: BLE001 - a meta-device model, a device that is not there
        raise ModelContractError(f"{spec}: moving the model to {device} raised {_first_line(e)}") from None
    return model


def check_contract_methods(spec: str, model: Any) -> None:
    """One line when ``model`` is not an nn.Module with make_batch and training_step."""
    if not isinstance(model, torch.nn.Module):
        raise ModelContractError(f"{spec}: the callable returned a {type(model).__name__}, not a torch.nn.Module")
    for name in CONTRACT_METHODS:
        if not callable(getattr(model, name, None)):
            raise ModelContractError(f"{spec}: {type(model).__name__} has no method {name!r} "
                                     "(see docs/MODEL_CONTRACT.md; workbench.adapters.SchemaModel adds both)")


@dataclass
class CheckReport:
    """What :func:`check_model` ran and saw."""

    spec: str
    device: str
    parameters: int
    trainable: int
    bucket: tuple[float, int]
    batch_size: int
    batch_shapes: dict[str, list[int]]
    loss: float
    seconds: float

    def line(self) -> str:
        shapes = ", ".join(f"{k}{v}" for k, v in self.batch_shapes.items())
        return (f"ok: {self.spec}: {self.parameters / 1e6:.1f}M parameters on {self.device}; one step at batch "
                f"size {self.batch_size} of {self.bucket[0]:g} s / {self.bucket[1]} tokens: loss {self.loss:.4g} "
                f"in {self.seconds:.1f} s; all {self.trainable} trainable tensors got gradients; batch {shapes}")


def check_model(model: torch.nn.Module, *, spec: str = "model", bucket: tuple[float, int] = (3.0, 24),
                batch_size: int = 2, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> CheckReport:
    """Run one contract step at ``batch_size`` utterances of ``bucket`` (seconds, tokens) and check it all:
    the methods, the parameters' device, the batch (a dict of tensors on ``device``, batch first), a scalar
    finite loss, a gradient for every trainable parameter. Raises :class:`ModelContractError` (one line)
    at the first problem; the gradients are zeroed again either way."""
    device = torch.device(device)
    check_contract_methods(spec, model)
    params = list(model.parameters())
    if not params:
        raise ModelContractError(f"{spec}: the model has no parameters")
    wrong = next(((n, p.device) for n, p in model.named_parameters() if not _same_device(p.device, device)), None)
    if wrong is not None:
        raise ModelContractError(f"{spec}: parameter {wrong[0]!r} is on {wrong[1]}, expected {device} "
                                 "(move the model with .to(device))")
    duration, tokens = float(bucket[0]), int(bucket[1])
    call = f"make_batch({batch_size}, {duration:g}, {tokens}, {device})"
    model.zero_grad(set_to_none=True)
    try:
        try:
            batch = model.make_batch(batch_size, duration, tokens, device)
        except Exception as e:  # noqa: BLE001 - the user's code may raise anything
            raise ModelContractError(f"{spec}: {call} raised {_first_line(e)}") from None
        shapes = _check_batch(spec, call, batch, batch_size, device)
        t0 = time.perf_counter()
        batch = _WatchedBatch(batch)
        try:
            loss = model.training_step(batch, dtype=dtype)
            if device.type == "cuda":  # an asynchronous device error (an id past the vocabulary) surfaces here
                torch.cuda.synchronize(device)
            value = _check_loss(spec, loss)
        except ModelContractError:
            raise
        except KeyError as e:
            if e.args and e.args[0] in batch.missing:
                raise ModelContractError(f"{spec}: training_step: the batch has no key {e.args[0]!r} "
                                         f"(make_batch gave {', '.join(batch)})") from None
            raise ModelContractError(f"{spec}: training_step raised {_first_line(e)}") from None
        except Exception as e:  # noqa: BLE001
            hint = " (run with CUDA_LAUNCH_BLOCKING=1 to see where)" if device.type == "cuda" else ""
            raise ModelContractError(f"{spec}: training_step raised {_first_line(e)}{hint}") from None
        seconds = time.perf_counter() - t0
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        missing = [n for n, p in trainable if p.grad is None]
        if missing:
            raise ModelContractError(f"{spec}: {len(missing)} of {len(trainable)} trainable parameters got no "
                                     f"gradient, e.g. {missing[0]!r} (freeze it with requires_grad_(False), or "
                                     "use it in the loss)")
    finally:
        model.zero_grad(set_to_none=True)
    return CheckReport(spec, str(device), sum(p.numel() for p in params), len(trainable), (duration, tokens),
                       batch_size, shapes, value, seconds)


class _WatchedBatch(dict):
    """The batch as training_step gets it, noting the keys it asked for and did not find (so a KeyError from
    elsewhere in the model is not blamed on the batch)."""

    def __init__(self, batch: dict):
        super().__init__(batch)
        self.missing: set = set()

    def __missing__(self, key):
        self.missing.add(key)
        raise KeyError(key)


def _check_batch(spec: str, call: str, batch: Any, batch_size: int, device: torch.device) -> dict[str, list[int]]:
    if not isinstance(batch, dict) or not batch:
        raise ModelContractError(f"{spec}: {call} returned a {type(batch).__name__}, not a dict of tensors")
    shapes = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise ModelContractError(f"{spec}: {call}: batch[{key!r}] is a {type(value).__name__}, not a tensor")
        if not _same_device(value.device, device):
            raise ModelContractError(f"{spec}: {call}: batch[{key!r}] is on {value.device}, expected {device}")
        if value.dim() == 0 or value.shape[0] != batch_size:
            raise ModelContractError(f"{spec}: {call}: batch[{key!r}] has shape {list(value.shape)}; "
                                     f"the first dimension must be the batch ({batch_size})")
        if key.endswith("_lens") and value.is_floating_point():
            raise ModelContractError(f"{spec}: {call}: batch[{key!r}] is {value.dtype}; lengths are integers")
        shapes[key] = list(value.shape)
    return shapes


def _check_loss(spec: str, loss: Any) -> float:
    if not isinstance(loss, torch.Tensor):
        raise ModelContractError(f"{spec}: training_step returned a {type(loss).__name__}, not the loss tensor")
    if loss.numel() != 1:
        raise ModelContractError(f"{spec}: training_step returned a loss of shape {list(loss.shape)}; "
                                 "it must be a scalar (reduce it: sum or mean)")
    value = float(loss.detach().float())
    if not math.isfinite(value):
        raise ModelContractError(f"{spec}: training_step returned a loss of {value}")
    return value


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
