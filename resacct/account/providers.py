"""Which formula predicts a step of a raw model (``resacct account --model module:factory``,
:mod:`resacct.account.generic`), and the one line that says so when none does.

A ``transformers`` causal LM whose ``config`` maps to an architecture resacct models (GPT-2,
Llama, Mistral, Mixtral: :func:`resacct.formulas.hf_formulas.architecture_of`) is predicted exactly as
``--hf-config`` predicts it: :func:`hf_raw_account` wraps the raw path's own measurements (FLOPs,
training state, saved tensors: nothing is measured twice) in an
:class:`~resacct.account.hf.HfAccount`, whose rows are ``--hf-config``'s — parameters, FLOPs,
training state, activations term by term and checkpoint, predicted beside measured. Where the
step leaves the formula's ground (another loss, other inputs, autocast, activation
checkpointing, experts other than ``batched_mm``), the activations say "measured only" and why;
the refusals of :mod:`resacct.formulas.hf_activation_formulas` (CUDA, the CPU flash kernel past a sliding
window) come out with their own messages.

>>> no_formula_note(torch.nn.Conv1d(2, 2, 3))
'predicted: — (Conv1d: no FLOP or activation formula; resacct has them for Linear/activation stacks and transformers causal LMs of gpt2, llama, mistral, mixtral)'
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import torch
from torch import nn

from resacct.measurement.activations import SavedActivations
from resacct.account.hf import HfAccount
from resacct.formulas.hf_formulas import FAMILIES, architecture_of
from resacct.facts.recipes import Recipe
from resacct.account.model_io import StepInputs
from resacct.account.step_measurements import StepFlopTrace, TrainingStateMeasurement

__all__ = ["MODELLED_HF_TYPES", "transformers_class", "hf_raw_account", "no_formula_note"]

#: the transformers ``model_type`` values resacct has formulas for
MODELLED_HF_TYPES = ", ".join(FAMILIES)


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
    model: nn.Module, inputs: StepInputs, *, name: str, loss: str, recipe: Recipe, optimizer: str, parameters: int, flops: StepFlopTrace,
    state: TrainingStateMeasurement, saved: SavedActivations, checkpoint_weights_bytes: int,
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
    )
    return account, (f"predicted by resacct's {architecture.family} formulas from {class_name}'s config (model_type {model_type}), "
                     "as --hf-config predicts it (resacct.formulas.hf_formulas, resacct.formulas.hf_activation_formulas)")


def no_formula_note(model: nn.Module) -> str:
    """The line for a model no formula predicts (its FLOPs and activations measured only)."""
    return (f"predicted: — ({type(model).__name__}: no FLOP or activation formula; resacct has them for Linear/activation stacks "
            f"and transformers causal LMs of {MODELLED_HF_TYPES})")
