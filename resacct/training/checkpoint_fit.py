"""Is a checkpoint's content well formed, and does it fit the model, optimizer and generators it
is about to be loaded into? Everything here only reads: :func:`resacct.training.checkpoint.load_checkpoint`
calls it all before it changes anything, so a refusal leaves the model, the optimizer and the
global random generators exactly as they were.

Each refusal is a :class:`CheckpointError` of one line naming the file, the field, the bad value
and what was expected.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from resacct.training.checkpoint_file import CheckpointError

__all__ = [
    "validate_content",
    "validate_rng_states",
    "check_model_fits",
    "check_optimizer_fits",
    "optimizer_class_name",
    "ELEMENTWISE_OPTIMIZER_STATE",
    "MAX_STEP",
]

MAX_STEP = 2**63 - 1
"""The largest step a checkpoint may record (int64, as torch and loggers keep it); 10**30 is refused."""

_AT_LEAST_ZERO = frozenset({"lr", "initial_lr", "max_lr", "min_lr", "weight_decay", "momentum", "dampening", "alpha", "lr_decay",
                            "initial_accumulator_value", "lambd", "t0", "eps"})
_FRACTION_PAIRS = frozenset({"betas"})  # each in [0, 1)
_PAIRS_AT_LEAST_ZERO = frozenset({"etas", "step_sizes"})
"""Hyperparameters of torch's (and resacct's) optimizers whose kind and range are known: a crafted
``lr: "fast"`` or ``lr: nan`` would otherwise load and poison every later step. Any other number in
a param group must still be finite, and of the kind the optimizer it is loaded into holds."""

ELEMENTWISE_OPTIMIZER_STATE = frozenset(
    {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "grad_avg", "acc_delta", "sum", "ax", "prev", "step_size", "exp_inf"}
)
"""State names torch's optimizers keep with the parameter's shape (Adam/AdamW, SGD, RMSprop,
Adadelta, Adagrad, ASGD, Rprop, Adamax); one of another shape would fail at the next step."""

_TORCH_RNG_STATE_BYTES = torch.get_rng_state().numel()


def _shown(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        text = f"a {value.dtype} tensor of shape {tuple(value.shape)}"
        if value.numel() == 1 and not value.is_meta:
            text += f" holding {value.detach().reshape(()).cpu().item()!r}"
    elif isinstance(value, int) and value.bit_length() > 256:  # repr() refuses ints over 4,300 digits
        text = f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(path: Path, field: str, value: Any, expected: str) -> CheckpointError:
    return CheckpointError(f"{path}: checkpoint field {field!r} is {_shown(value)}; expected {expected}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    """A plain number or a one-element real tensor (torch takes ``lr`` as a tensor) as a float; None otherwise."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool:
        return float(value.detach().reshape(()).cpu())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int beyond float range is no hyperparameter
            return math.inf
    return None


def _validate_hyperparameters(path: Path, index: int, group: Mapping[str, Any]) -> None:
    """Each hyperparameter of a saved param group is of its kind, finite and in its range (a
    known one may also be a tuple of them, as Adafactor's ``eps=(None, 1e-3)``)."""
    for name, value in group.items():
        known = name in _AT_LEAST_ZERO or name in _FRACTION_PAIRS or name in _PAIRS_AT_LEAST_ZERO
        if name == "params" or value is None or not known and isinstance(value, (bool, str)):
            continue
        field = f"optimizer.param_groups[{index}].{name}"
        if name in _FRACTION_PAIRS:
            low, high, expected = 0.0, 1.0, "a pair of numbers in [0, 1)"
        elif name in _PAIRS_AT_LEAST_ZERO:
            low, high, expected = 0.0, math.inf, "a pair of finite numbers ≥ 0"
        else:
            low, high, expected = (0.0, math.inf, "a finite number ≥ 0") if known else (-math.inf, math.inf, "a finite number")
        pair_needed = name in _FRACTION_PAIRS or name in _PAIRS_AT_LEAST_ZERO
        if isinstance(value, (tuple, list)):
            if pair_needed and len(value) != 2:
                raise _refuse(path, field, value, expected)
            numbers = [_number(item) for item in value if item is not None]
        elif pair_needed:
            raise _refuse(path, field, value, expected)
        else:
            numbers = [_number(value)]
        if known and any(number is None for number in numbers):
            raise _refuse(path, field, value, expected)
        if any(number is not None and not (math.isfinite(number) and low <= number < high) for number in numbers):
            raise _refuse(path, field, value, expected)


def _validate_state_steps(path: Path, state: Mapping[Any, Any]) -> None:
    """An optimizer's per-parameter ``step`` counts steps: a finite number in 0..MAX_STEP."""
    for key, entry in state.items():
        if "step" in entry:
            step = _number(entry["step"])
            if step is None or not math.isfinite(step) or not 0 <= step <= MAX_STEP:
                raise _refuse(path, f"optimizer.state[{key!r}].step", entry["step"], "the steps this parameter took, a number ≥ 0, at most 2**63 - 1")


def optimizer_class_name(optimizer: torch.optim.Optimizer) -> str:
    return type(optimizer).__qualname__


def _validate_optimizer_state(path: Path, state: Any) -> None:
    if not isinstance(state, Mapping) or not isinstance(state.get("state"), Mapping) or not isinstance(state.get("param_groups"), list):
        raise _refuse(path, "optimizer", state, "None or an optimizer.state_dict(): a dict with 'state' (dict) and 'param_groups' (list)")
    ids: list[int] = []
    for index, group in enumerate(state["param_groups"]):
        params = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(params, list) or not all(_is_int(i) for i in params):
            raise _refuse(path, f"optimizer.param_groups[{index}]", group, "a dict whose 'params' is a list of parameter ids (ints)")
        _validate_hyperparameters(path, index, group)
        ids.extend(params)
    if len(set(ids)) != len(ids):
        raise _refuse(path, "optimizer.param_groups", ids, "each parameter id in one group only")
    for key, value in state["state"].items():
        if key not in ids or not isinstance(value, Mapping):
            raise _refuse(path, f"optimizer.state[{key!r}]", value, f"a dict keyed by one of the parameter ids {sorted(ids)[:8]}")
    _validate_state_steps(path, state["state"])


def validate_content(path: Path, content: dict[str, Any]) -> None:
    """Every field of a resacct checkpoint has the type it must have (the RNG states are
    checked by restoring them into fresh generators)."""
    step = content["step"]
    if not _is_int(step) or not 0 <= step <= MAX_STEP:
        raise _refuse(path, "step", step, "the number of optimizer steps taken, an int ≥ 0, at most 2**63 - 1 (int64)")
    model = content["model"]
    if not isinstance(model, Mapping) or not all(isinstance(key, str) for key in model):
        raise _refuse(path, "model", model, "a model.state_dict(): a dict of names to tensors")
    for key, value in model.items():
        if not key.endswith("_extra_state") and not isinstance(value, torch.Tensor):
            raise _refuse(path, f"model[{key!r}]", value, "a tensor")
    if content["optimizer"] is not None:
        _validate_optimizer_state(path, content["optimizer"])
    optimizer_class = content.get("optimizer_class")
    if optimizer_class is not None and not isinstance(optimizer_class, str):
        raise _refuse(path, "optimizer_class", optimizer_class, "the optimizer's class name (a str)")
    for key in ("data", "grad_scaler"):
        if content.get(key) is not None and not isinstance(content[key], Mapping):
            raise _refuse(path, key, content[key], "None or a state_dict() (a dict)")
    for name, value in (content.get("grad_scaler") or {}).items():  # scale, growth_factor, backoff_factor, growth_interval, _growth_tracker
        number = _number(value)
        if number is not None and (not math.isfinite(number) or number < 0):
            raise _refuse(path, f"grad_scaler.{name}", value, "a finite number ≥ 0")
    if not isinstance(content.get("extra", {}), Mapping):
        raise _refuse(path, "extra", content["extra"], "a dict of plain values")
    validate_rng_states(path, content["rng"])


def _numpy_state_tuple(path: Path, state: Any) -> tuple:
    if not isinstance(state, Mapping) or not {"bit_generator", "keys", "position", "has_gauss", "cached_gaussian"} <= set(state):
        raise _refuse(path, "rng.numpy", state, "a dict with bit_generator, keys, position, has_gauss, cached_gaussian")
    keys = state["keys"]
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or keys.shape != (624,) or bool(((keys < 0) | (keys > 0xFFFFFFFF)).any()):
        raise _refuse(path, "rng.numpy.keys", keys, "624 int64 values in 0..2**32-1 (the Mersenne Twister keys)")
    for name, is_valid, expected in (
        ("position", lambda v: _is_int(v) and 0 <= v <= 624, "an int in 0..624"),
        ("has_gauss", lambda v: _is_int(v) and v in (0, 1), "0 or 1"),
        ("cached_gaussian", lambda v: isinstance(v, float), "a float"),
    ):
        if not is_valid(state[name]):
            raise _refuse(path, f"rng.numpy.{name}", state[name], expected)
    return (state["bit_generator"], keys.numpy().astype(np.uint32), state["position"], state["has_gauss"], state["cached_gaussian"])


def validate_rng_states(path: Path, rng: Any) -> None:
    """Restore every saved generator state into a fresh generator (never the global ones)."""
    if not isinstance(rng, Mapping) or not {"python", "numpy", "torch"} <= set(rng):
        raise _refuse(path, "rng", rng, "a dict with the 'python', 'numpy' and 'torch' generator states")
    python = rng["python"]
    try:
        version, internal, gauss_next = python
        random.Random().setstate((version, tuple(internal), gauss_next))
    except (TypeError, ValueError, OverflowError, IndexError):
        raise _refuse(path, "rng.python", python, "random.getstate(): (version, 625 ints, None or a float)") from None
    try:
        np.random.RandomState().set_state(_numpy_state_tuple(path, rng["numpy"]))
    except (TypeError, ValueError, OverflowError) as error:
        raise _refuse(path, "rng.numpy", rng["numpy"], f"a state numpy accepts ({error})") from None
    torch_state = rng["torch"]
    if not isinstance(torch_state, torch.Tensor) or torch_state.dtype != torch.uint8 or torch_state.shape != (_TORCH_RNG_STATE_BYTES,):
        raise _refuse(path, "rng.torch", torch_state, f"torch.get_rng_state(): a uint8 tensor of {_TORCH_RNG_STATE_BYTES} bytes")
    try:
        torch.Generator().set_state(torch_state)
    except (RuntimeError, TypeError, ValueError) as error:
        raise _refuse(path, "rng.torch", torch_state, f"a state torch accepts ({str(error).splitlines()[0]})") from None
    cuda = rng.get("cuda")
    if cuda is not None and (not isinstance(cuda, (list, tuple)) or not all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8 for s in cuda)):
        raise _refuse(path, "rng.cuda", cuda, "torch.cuda.get_rng_state_all(): a list of uint8 tensors")
    if cuda is not None and torch.cuda.is_available() and len(cuda) > torch.cuda.device_count():
        raise _refuse(path, "rng.cuda", cuda, f"at most {torch.cuda.device_count()} states, one per visible CUDA device")


def _names(keys: list[str]) -> str:
    shown = ", ".join(repr(key) for key in keys[:3])
    return f"{shown} and {len(keys) - 3} more" if len(keys) > 3 else shown


def check_model_fits(path: Path, model: nn.Module, state: Mapping[str, Any]) -> None:
    """The keys and shapes ``model.load_state_dict(state)`` (strict) needs — checked before it
    runs, since torch copies every fitting tensor into the model before it reports a misfit."""
    target = model.state_dict()
    kind = type(model).__name__
    missing = [key for key in target if key not in state]
    unexpected = [key for key in state if key not in target]
    if missing or unexpected:
        parts = ([f"missing {_names(missing)}"] if missing else []) + ([f"unexpected {_names(unexpected)}"] if unexpected else [])
        raise CheckpointError(f"{path}: the model state does not fit this {kind}: {'; '.join(parts)}")
    misfits = [
        key
        for key, value in target.items()
        if isinstance(value, torch.Tensor) and (not isinstance(state[key], torch.Tensor) or tuple(state[key].shape) != tuple(value.shape))
    ]
    if misfits:
        key = misfits[0]
        more = f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else ""
        saved = tuple(state[key].shape) if isinstance(state[key], torch.Tensor) else _shown(state[key])
        raise CheckpointError(f"{path}: the model state does not fit this {kind}: {key!r} is {saved} in the checkpoint, {tuple(target[key].shape)} in the model{more}")


def _hyperparameter_names(group: Mapping[str, Any]) -> set[str]:
    return {str(key) for key in group if key != "params"}


def check_optimizer_fits(path: Path, optimizer: torch.optim.Optimizer, state: Mapping[str, Any], saved_class: str | None) -> None:
    """The saved state came from the same optimizer class (when recorded; otherwise: its
    hyperparameter names do not differ both ways, as AdamW's and SGD's do), has as many param
    groups with as many parameters each, and elementwise state has each parameter's shape."""
    kind = optimizer_class_name(optimizer)
    if saved_class is not None and saved_class != kind:
        raise CheckpointError(f"{path}: the optimizer state was saved from {saved_class}; refusing to load it into {kind} (the classes must match)")
    saved_groups, groups = state["param_groups"], optimizer.param_groups
    if len(saved_groups) != len(groups):
        raise CheckpointError(f"{path}: the optimizer state has {len(saved_groups)} param groups; this {kind} has {len(groups)}")
    parameters: dict[int, torch.Tensor] = {}
    for index, (saved, group) in enumerate(zip(saved_groups, groups)):
        if len(saved["params"]) != len(group["params"]):
            raise CheckpointError(
                f"{path}: the optimizer's param group {index} holds {len(saved['params'])} parameters in the checkpoint, {len(group['params'])} in this {kind}"
            )
        only_saved, only_here = _hyperparameter_names(saved) - _hyperparameter_names(group), _hyperparameter_names(group) - _hyperparameter_names(saved)
        if only_saved and only_here:
            raise CheckpointError(
                f"{path}: the optimizer state is not from a {kind}: its param group {index} has {sorted(only_saved)}, a {kind} has {sorted(only_here)}"
            )
        for name in sorted(_hyperparameter_names(saved) & _hyperparameter_names(group)):
            if _number(group[name]) is not None and saved[name] is not None and _number(saved[name]) is None:
                raise CheckpointError(f"{path}: checkpoint field 'optimizer.param_groups[{index}].{name}' is {_shown(saved[name])}; "
                                      f"expected a number, as this {kind} holds ({_shown(group[name])})")
        parameters.update(zip(saved["params"], group["params"]))
    for parameter_id, entry in state["state"].items():
        parameter = parameters[parameter_id]
        for name, value in entry.items():
            if name in ELEMENTWISE_OPTIMIZER_STATE and isinstance(value, torch.Tensor) and value.shape != parameter.shape:
                raise CheckpointError(
                    f"{path}: the optimizer's {name!r} for parameter {parameter_id} is {tuple(value.shape)}; the parameter is {tuple(parameter.shape)}"
                )
