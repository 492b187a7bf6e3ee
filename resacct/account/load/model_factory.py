"""Loading a ``--model module:factory`` model: ``module:factory`` imported, called with the
``--model-arg key=value`` pairs (:func:`parse_model_arg`), and its result checked
(:func:`load_model`); what the factory raises is one line (:mod:`resacct.account.load.user_code`). The step
that accounts the model: :mod:`resacct.account.answers.generic`."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Iterator, Mapping
from typing import Any, no_type_check

import torch
from torch import nn

from resacct.errors import ResacctError
from resacct.account.load.model_io import StepInputs
from resacct.account.load.user_code import calling_user_code, running_phase, system_exit_error, user_frame

__all__ = ["parse_model_arg", "load_model", "load_model_on", "module_cycle", "module_depth", "max_module_depth", "check_module_tree", "predict_named_model_peak"]


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


def load_model_on(device: str, spec: str, model_args: Mapping[str, Any] | None = None) -> tuple[nn.Module, StepInputs | None]:
    """:func:`load_model` with the factory run under ``torch.device(device)`` (what it builds without a device lands
    there). ``torch._dynamo`` is imported first: a factory importing transformers' models lazily under that mode made
    torch 2.6 and 2.8 import it there, which fails (2.8: a circular import; 2.6: its import runs an op, ``.item()`` on
    meta — a fresh ``resacct account --model <a Mixtral factory>`` on torch 2.6 said "Could not import module
    'MixtralForCausalLM'"). Every account imports it anyway."""
    from resacct.account.load.hf_models import import_before_device_modes

    import_before_device_modes()
    with torch.device(device):
        return load_model(spec, model_args)


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
        with running_phase(f"loading the model (importing {module_name!r})"):
            target: Any = importlib.import_module(module_name)
    except SystemExit as exit_:  # sys.exit() at the module's top level
        raise system_exit_error(f"importing {module_name!r} for --model {spec!r}", exit_, user_frame(sys.exc_info()[2])) from None
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # ImportError, or whatever the module raises while importing (a BaseException of its own too)
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
    check_module_tree(built, f"the model from factory {spec!r}")
    return built, example


def module_cycle(model: nn.Module) -> str | None:
    """The attribute path of the first submodule that contains a module holding it (``m.child = m``,
    or two modules holding each other), e.g. ``'model.block.parent' is 'model'``; None for a tree.
    A module shared under two names (tied weights) is no cycle. Iterative: a deep tree is fine.

    >>> model = nn.Sequential(nn.Linear(2, 2))
    >>> module_cycle(model) is None
    True
    >>> model.again = model
    >>> module_cycle(model)
    "'model.again' is 'model'"
    """
    names, path, on_path, finished = ["model"], [model], {id(model): 0}, set[int]()
    pending = [_module_children(model)]
    while pending:
        step = next(pending[-1], None)
        if step is None:  # every child of the innermost module seen: it leaves the path
            pending.pop()
            done = path.pop()
            names.pop()
            del on_path[id(done)]
            finished.add(id(done))
            continue
        name, child = step
        if id(child) in on_path:
            return f"{'.'.join([*names, name])!r} is {'.'.join(names[: on_path[id(child)] + 1])!r}"
        if id(child) in finished:
            continue
        on_path[id(child)] = len(path)
        path.append(child)
        names.append(name)
        pending.append(_module_children(child))
    return None


@no_type_check  # per module (21,868 checks): module_cycle's checked model, or a child its isinstance kept (docs/suite_time.md, session 7)
def _module_children(module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``module``'s child modules by name, for :func:`module_cycle` (a module-level function, not a def in it: decorated once)."""
    return iter([(name, child) for name, child in vars(module).get("_modules", {}).items() if isinstance(child, nn.Module)])


def module_depth(model: nn.Module) -> int:
    """How many modules deep the tree nests (a lone module: 1), walked without recursion; a tree
    without cycles (:func:`module_cycle`) is assumed.

    >>> module_depth(nn.Linear(2, 2)), module_depth(nn.Sequential(nn.Sequential(nn.Linear(2, 2))))
    (1, 3)
    """
    deepest, pending, seen = 0, [(model, 1)], set[int]()
    while pending:
        module, depth = pending.pop()
        deepest = max(deepest, depth)
        for child in vars(module).get("_modules", {}).values():
            if isinstance(child, nn.Module) and id(child) not in seen:
                seen.add(id(child))
                pending.append((child, depth + 1))
    return deepest


def max_module_depth() -> int:
    """The deepest module tree taken: ``copy.deepcopy`` (one copy per measured dtype) spends about
    six Python calls a level, torch's ``.modules()``, ``.to()`` and ``state_dict()`` one or two,
    so a tree deeper than this reaches Python's recursion limit (100 levels at its default 1000;
    real models nest fewer than 10)."""
    return max(1, (sys.getrecursionlimit() - 200) // 8)


def check_module_tree(model: nn.Module, what: str) -> None:
    """Refuse a model whose module tree has a cycle (torch's ``.train()``, ``.modules()`` and
    ``.to()`` would recurse until RecursionError) with one line naming the attribute path, or
    nests deeper than :func:`max_module_depth`."""
    cycle = module_cycle(model)
    if cycle is not None:
        raise ResacctError(f"{what} contains itself: {cycle}, a cycle in its module tree; "
                           "expected a tree of submodules (keep a back-reference out of the tree, e.g. in a list or a weakref)")
    depth, limit = module_depth(model), max_module_depth()
    if depth > limit:
        raise ResacctError(f"{what} nests modules {depth:,} deep; expected at most {limit} (copying and walking the tree recurses once or "
                           f"more a level, and Python stops at {sys.getrecursionlimit()} nested calls: sys.setrecursionlimit raises it)")


def predict_named_model_peak(spec: str, model_args: Mapping[str, Any] | None = None, *, batch: int, seq: int | None,
                             input_shape: tuple[int, ...] | None, input_dtype: str, loss: str, recipe: Any, optimizer: str) -> tuple[int | None, str]:
    """The peak bytes of one training step of ``spec`` (forward, backward, optimizer step, zero_grad:
    parameters, gradients, state, activations and temporaries) predicted before anything runs for
    real — the model built on the meta device, the step run on fake tensors
    (:func:`resacct.account.peak.step_peak.account_model_step_peak`) — and how; (None, why) when fake tensors
    cannot run the step. ``resacct account --max-memory`` refuses a step above its limit with it."""
    from resacct.account.load.model_io import check_inputs, default_inputs, inputs_on
    from resacct.account.peak.step_peak import account_model_step_peak
    from resacct.measurement.memory import get_state_recipe

    model, example = load_model_on("meta", spec, model_args)
    if not list(model.parameters()):
        raise ResacctError(f"the model {type(model).__name__} from {spec!r} has no parameters; expected a model with something to train")
    model.train()
    name = type(model).__name__
    if example is None:
        with calling_user_code(f"making the input of {name}"):
            example = default_inputs(model, batch=batch, seq=seq, input_shape=input_shape, input_dtype=input_dtype, device="meta")
    else:
        example = inputs_on(check_inputs(example), "meta")
    with calling_user_code(f"the step of {name} (forward, loss or backward)", phase=f"predicting the step's peak of {name} on fake tensors"):
        peak = account_model_step_peak(model, example, loss=loss, recipe=get_state_recipe(recipe), optimizer=optimizer, measure=False)
    if peak.predicted is None:
        return None, peak.gap or "no prediction"
    return peak.predicted.peak_bytes, "the step's peak traced on fake tensors, the model never allocated"
