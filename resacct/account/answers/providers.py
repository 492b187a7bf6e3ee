"""Which formula predicts a step of a raw model (``resacct account --model module:factory``,
:mod:`resacct.account.answers.generic`): ONE ordered registry, :data:`PROVIDERS`, asked once per step.
Adding a model family touches this file: a :class:`Provider` put before the fallback.

The order (:data:`PROVIDER_ORDER`); the first provider whose ``applies(model)`` is true answers:

1. ``linear-stack`` — resacct's own Linear/activation stacks (Cruncher, MLPs:
   :func:`resacct.formulas.account_formulas.predict_stack_step`), for a float tensor input, one
   dtype and a loss resacct names (``mean``, ``sum``, ``mse``, ``cross-entropy``);
2. ``transformers-causal-lm`` — a ``transformers`` causal LM whose ``config`` maps to an
   architecture resacct models (GPT-2, Llama, Mistral, Mixtral:
   :func:`resacct.formulas.hf_formulas.architecture_of`), predicted exactly as ``--hf-config``
   predicts it: :func:`hf_raw_account` wraps the raw path's own measurements (FLOPs, training state,
   saved tensors: nothing is measured twice) in an :class:`~resacct.account.answers.hf.HfAccount`, whose rows
   are ``--hf-config``'s. Where the step leaves the formula's ground (another loss, other inputs,
   autocast, activation checkpointing, experts other than ``batched_mm``), the activations say
   "measured only" and why; the refusals of :mod:`resacct.formulas.hf_activation_formulas` (CUDA,
   the CPU flash kernel past a sliding window) come out with their own messages. Its experts
   kernels other than ``batched_mm`` cannot run on the meta device: :meth:`Provider.untraced` says
   so in one line, and the account keeps the predictions (:mod:`resacct.account.trace.untraced`);
3. ``none`` — every other model: its FLOPs and activations measured only, one line says why
   (:func:`no_formula_note`).

>>> [provider.name for provider in PROVIDERS] == list(PROVIDER_ORDER)
True
>>> no_formula_note(torch.nn.Conv1d(2, 2, 3))
'predicted: — (Conv1d: no FLOP or activation formula; resacct has them for Linear/activation stacks and transformers causal LMs of gpt2, llama, mistral, mixtral)'
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from resacct.account.answers.hf import HfAccount
from resacct.account.load.trainable import parameter_split
from resacct.account.load.model_io import StepInputs, main_input
from resacct.account.trace.step_measurements import StepFlopTrace, TrainingStateMeasurement
from resacct.account.trace.untraced import UnmeasuredState, UnrecordedActivations, UntracedFlops
from resacct.errors import ResacctError
from resacct.facts.dtypes import parse_dtype
from resacct.facts.recipes import Recipe
from resacct.formulas.account_formulas import StackPrediction, is_stack, predict_stack_step
from resacct.formulas.hf_formulas import FAMILIES, architecture_of
from resacct.measurement.activations import SavedActivations

__all__ = ["MODELLED_HF_TYPES", "PROVIDER_ORDER", "PROVIDERS", "MeasuredStep", "Prediction", "Provider", "register_provider", "predict_step",
           "untraced_note", "transformers_class", "hf_raw_account", "no_formula_note"]

#: the transformers ``model_type`` values resacct has formulas for
MODELLED_HF_TYPES = ", ".join(FAMILIES)


@dataclass(frozen=True)
class MeasuredStep:
    """What the raw path measured for one step, handed to the provider that answers (nothing is
    measured twice). ``loss`` is the resolved loss (``model``, ``mean`` …); a step that could not
    run where the model is has :mod:`resacct.account.trace.untraced`'s stand-ins (measured None)."""

    model: nn.Module
    inputs: StepInputs
    name: str
    loss: str
    recipe: Recipe
    optimizer: str
    parameters: int
    flops: StepFlopTrace | UntracedFlops
    state: TrainingStateMeasurement | UnmeasuredState
    saved: SavedActivations | UnrecordedActivations
    checkpoint_weights_bytes: int


@dataclass(frozen=True)
class Prediction:
    """A provider's answer: resacct's prediction (``stack`` for a Linear/activation stack, ``hf`` for
    a transformers causal LM; None: none), and the note the account shows (why not, or which formula)."""

    provider: str
    stack: StackPrediction | None = None
    hf: HfAccount | None = None
    note: str | None = None


def _never_untraced(model: nn.Module, error: BaseException) -> str | None:
    return None


@dataclass(frozen=True)
class Provider:
    """One model family: ``applies(model)`` (is the model of this family?), ``predict(step)``
    (the prediction, or a note why not) and ``untraced(model, error)`` (the one line for a step
    that raised on the meta device in a kernel this family knows cannot run there, with what to
    do; None: the error stands)."""

    name: str
    applies: Callable[[nn.Module], bool]
    predict: Callable[[MeasuredStep], Prediction]
    untraced: Callable[[nn.Module, BaseException], str | None] = _never_untraced


def provider_for(model: nn.Module) -> Provider:
    """The first provider of :data:`PROVIDERS` that applies to ``model`` (the fallback always does)."""
    return next(provider for provider in PROVIDERS if provider.applies(model))


def predict_step(step: MeasuredStep) -> Prediction:
    """The registry's answer for one measured step: the first provider that applies predicts it."""
    return provider_for(step.model).predict(step)


def untraced_note(model: nn.Module, error: BaseException) -> str | None:
    """The one line for a step that raised on the meta device, where the model's provider knows
    the kernel cannot run there; None where it does not (the error is the user's to see)."""
    return provider_for(model).untraced(model, error)


# ───────────────────────────── resacct's Linear/activation stacks ─────────────────────────────


def _predict_stack(step: MeasuredStep) -> Prediction:
    first = main_input(step.inputs)
    predictable = (step.recipe.compute_dtype is None and isinstance(step.inputs, torch.Tensor) and first.is_floating_point()
                   and step.loss != "model")
    element = parse_dtype(step.recipe.parameter_dtype).itemsize
    predicted = predict_stack_step(step.model, tuple(first.shape), element_bytes=element, loss=step.loss) if predictable else None
    return Prediction("linear-stack", stack=predicted) if predicted is not None else Prediction("linear-stack", note=no_formula_note(step.model))


# ───────────────────────────── transformers causal LMs ─────────────────────────────


def transformers_class(model: nn.Module) -> str | None:
    """The class name of a ``transformers.PreTrainedModel`` (a subclass of one included), else None.
    Imports nothing: a model from transformers has already imported it."""
    if not any(cls.__module__.startswith("transformers.") for cls in type(model).__mro__):
        return None
    transformers = sys.modules.get("transformers")
    base = getattr(transformers, "PreTrainedModel", None)
    return type(model).__name__ if base is not None and isinstance(model, base) else None


def _causal_lm_class(model_type: str) -> str | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    return name if isinstance(name, str) else None


def _step_gap(model: nn.Module, inputs: StepInputs, loss: str, recipe: Recipe, experts: int) -> str | None:
    """Why this step is outside the activation formula (derived for input_ids and labels, the
    model's own loss, one dtype, no checkpointing, ``batched_mm`` experts); None when it is not."""
    names = sorted(inputs) if isinstance(inputs, Mapping) else ["a tuple of tensors" if isinstance(inputs, tuple) else "a tensor"]
    if names != ["input_ids", "labels"] or tuple(inputs["labels"].shape) != tuple(inputs["input_ids"].shape):  # type: ignore[index]
        return f"inputs {', '.join(names)}: resacct's activation formula is for input_ids and labels of (batch, seq)"
    if loss != "model":
        return f"loss {loss!r}: resacct's activation formula is for the model's own next-token loss (labels given, --loss auto)"
    compute = recipe.compute_dtype
    if compute is not None:
        return f"recipe {recipe.name!r} runs under autocast ({compute}): resacct's activation formula is for one dtype"
    if getattr(model, "is_activation_checkpointing", False):
        return "activation checkpointing is on: resacct's activation formula is for a step without it"
    implementation = getattr(model.config, "_experts_implementation", None)
    if experts and implementation != "batched_mm":
        return (f"experts implementation {implementation!r}: resacct's Mixtral activation formula is for 'batched_mm' "
                "(build with experts_implementation='batched_mm')")
    return None


def hf_raw_account(
    model: nn.Module, inputs: StepInputs, *, name: str, loss: str, recipe: Recipe, optimizer: str, parameters: int,
    flops: StepFlopTrace | UntracedFlops, state: TrainingStateMeasurement | UnmeasuredState, saved: SavedActivations | UnrecordedActivations,
    checkpoint_weights_bytes: int,
) -> tuple[HfAccount | None, str | None]:
    """(account, note) for a raw model's step, from the measurements the raw path took.

    A transformers causal LM resacct models: its :class:`HfAccount` (``--hf-config``'s rows,
    predicted beside these measurements) and a note naming the formula. Another transformers
    model: (None, the one line saying why nothing is predicted). Not a transformers model: (None, None).
    """
    class_name = transformers_class(model)
    if class_name is None:
        return None, None
    model_type = str(getattr(model.config, "model_type", ""))
    architecture = architecture_of(model.config)
    if architecture is None:
        return None, (f"predicted: — (transformers {class_name}: architecture {model_type!r} not modelled; "
                      f"resacct models the causal LMs of {MODELLED_HF_TYPES})")
    expected = _causal_lm_class(model_type)
    if not any(cls.__name__ == expected and cls.__module__.startswith("transformers.") for cls in type(model).__mro__):
        return None, f"predicted: — (transformers {class_name}: resacct models {model_type} as {expected}, with its own next-token loss)"
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else (inputs[0] if isinstance(inputs, tuple) else inputs)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        return None, f"predicted: — (transformers {class_name}: resacct predicts from input_ids of (batch, seq); this step's input has none)"
    batch, seq = (int(size) for size in ids.shape)
    device = next(model.parameters()).device.type
    account = HfAccount(
        name=name, source=f"--model {name}", model_type=model_type, model_class=class_name, architecture=architecture, batch=batch, seq=seq,
        recipe=recipe, optimizer=optimizer, parameters=parameters, parameter_tensors=len(list(model.parameters())), flops=flops, state=state,
        saved=saved, checkpoint_weights_bytes=checkpoint_weights_bytes, device=device,
        attention=str(getattr(model.config, "_attn_implementation", None) or "eager"),
        step_gap=_step_gap(model, inputs, loss, recipe, architecture.experts),
        frozen=parameter_split(model) if any(not p.requires_grad for p in model.parameters()) else None,
    )
    return account, (f"predicted by resacct's {architecture.family} formulas from {class_name}'s config (model_type {model_type}), "
                     "as --hf-config predicts it (resacct.formulas.hf_formulas, resacct.formulas.hf_activation_formulas)")


def _predict_hf(step: MeasuredStep) -> Prediction:
    hf, note = hf_raw_account(step.model, step.inputs, name=step.name, loss=step.loss, recipe=step.recipe, optimizer=step.optimizer,
                              parameters=step.parameters, flops=step.flops, state=step.state, saved=step.saved,
                              checkpoint_weights_bytes=step.checkpoint_weights_bytes)
    return Prediction("transformers-causal-lm", hf=hf, note=note)


def _raised_in(error: BaseException, modules: list[nn.Module]) -> bool:
    """Whether ``error`` was raised inside the forward of a module of the class of one of ``modules``
    (a frame whose ``self`` is of that class): the step runs on the recipe's **copy** of the model
    (:func:`~resacct.account.trace.step_measurements.measure_step_once`), whose modules are not ``modules``."""
    classes, trace = {type(module) for module in modules}, error.__traceback__
    while trace is not None:
        if type(trace.tb_frame.f_locals.get("self")) in classes:
            return True
        trace = trace.tb_next
    return False


def _experts_untraced(model: nn.Module, error: BaseException) -> str | None:
    """A transformers mixture of experts whose experts kernel is not ``batched_mm`` raised inside
    its experts on meta (``grouped_mm`` refuses float32 there; ``eager`` needs ``nonzero``'s
    data-dependent shape): the one line naming the kernel and what to do."""
    architecture = architecture_of(model.config)
    implementation = getattr(model.config, "_experts_implementation", None)
    if architecture is None or not architecture.experts or implementation == "batched_mm":
        return None
    experts = [module for module in model.modules() if type(module).__name__.endswith("Experts")]
    if not _raised_in(error, experts):
        return None
    return (f"predicted only: {type(model).__name__}'s experts kernel {implementation!r} cannot be traced on the meta device "
            f"({type(error).__name__} in {type(experts[0]).__name__}); measure it with --measure (on the CPU), "
            "or build the model with experts_implementation='batched_mm' (traceable on meta)")


# ───────────────────────────── the fallback ─────────────────────────────


def no_formula_note(model: nn.Module) -> str:
    """The line for a model no formula predicts (its FLOPs and activations measured only)."""
    return (f"predicted: — ({type(model).__name__}: no FLOP or activation formula; resacct has them for Linear/activation stacks "
            f"and transformers causal LMs of {MODELLED_HF_TYPES})")


#: The registry, asked in this order; ``none`` (always applies) stays last.
PROVIDERS: list[Provider] = [
    Provider("linear-stack", applies=is_stack, predict=_predict_stack),
    Provider("transformers-causal-lm", applies=lambda model: transformers_class(model) is not None, predict=_predict_hf, untraced=_experts_untraced),
    Provider("none", applies=lambda model: True, predict=lambda step: Prediction("none", note=no_formula_note(step.model))),
]

#: The documented order of the shipped providers.
PROVIDER_ORDER = ("linear-stack", "transformers-causal-lm", "none")


def register_provider(provider: Provider) -> Callable[[], None]:
    """Add ``provider`` to :data:`PROVIDERS` before the ``none`` fallback (a family the shipped
    ones do not claim); returns the function that takes it out again.

    >>> remove = register_provider(Provider("conv", applies=lambda m: isinstance(m, nn.Conv1d), predict=lambda s: Prediction("conv")))
    >>> [provider.name for provider in PROVIDERS][-2:]
    ['conv', 'none']
    >>> remove(); [provider.name for provider in PROVIDERS] == list(PROVIDER_ORDER)
    True
    """
    if any(existing.name == provider.name for existing in PROVIDERS):
        raise ResacctError(f"provider {provider.name!r} is registered already; expected a new name")
    PROVIDERS.insert(len(PROVIDERS) - 1, provider)
    return lambda: PROVIDERS.remove(provider)
