"""Loading a ``--model module:factory`` model: ``module:factory`` imported, called with the
``--model-arg key=value`` pairs (:func:`parse_model_arg`), and its result checked
(:func:`load_model`); what the factory raises is one line (:mod:`resacct.account.user_code`). The step
that accounts the model: :mod:`resacct.account.generic`."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from resacct.errors import ResacctError
from resacct.account.model_io import StepInputs
from resacct.account.user_code import calling_user_code

__all__ = ["parse_model_arg", "load_model"]


def parse_model_arg(text: str) -> tuple[str, Any]:
    """``key=value`` → (key, value): whole numbers, then decimals, ``true``/``false``/``none``, else text.

    >>> parse_model_arg("dim=64"), parse_model_arg("scale=0.5"), parse_model_arg("bias=false"), parse_model_arg("act=gelu")
    (('dim', 64), ('scale', 0.5), ('bias', False), ('act', 'gelu'))
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise ResacctError(f"model argument {text!r}: expected key=value, e.g. dim=64")
    words = {"true": True, "false": False, "none": None}
    if raw.lower() in words:
        return key.strip(), words[raw.lower()]
    for kind in (int, float):
        try:
            return key.strip(), kind(raw)
        except ValueError:
            pass
    return key.strip(), raw


def load_model(spec: str, model_args: Mapping[str, Any] | None = None) -> tuple[nn.Module, StepInputs | None]:
    """Import ``module:factory`` (the factory may be dotted: ``pkg.mod:Class.build``), call it
    with ``model_args`` and return (model, example input or None).

    >>> model, example = load_model("resacct.training.models:Cruncher", {"dim": 4, "num_layers": 1})
    >>> type(model).__name__, example
    ('Cruncher', None)
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ResacctError(f"model {spec!r}: expected module:factory (e.g. my_pkg.models:build) or a resacct.training.gpt config name")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or whatever the module raises while importing
        raise ResacctError(f"cannot import {module_name!r} for --model {spec!r}: {type(error).__name__}: {error}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ResacctError(f"module {module_name!r} has no attribute {attribute!r}; expected module:factory, a callable returning an nn.Module")
        target = getattr(target, part)
    if not callable(target):
        raise ResacctError(f"{spec!r} is a {type(target).__name__}, not callable; expected a factory returning an nn.Module")
    arguments = dict(model_args or {})
    try:
        inspect.signature(target).bind(**arguments)
    except TypeError as error:
        raise ResacctError(f"factory {spec!r} refused the model arguments {arguments!r}: {error}") from None
    except ValueError:
        pass  # no signature to read (a builtin): let the call say
    with calling_user_code(f"factory {spec!r}"):
        built = target(**arguments)
    example = None
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[1], (torch.Tensor, Mapping)):
        built, example = built
    if not isinstance(built, nn.Module):
        raise ResacctError(f"factory {spec!r} returned a {type(built).__name__}; expected an nn.Module or (nn.Module, example input tensor)")
    return built, example
