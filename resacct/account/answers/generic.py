"""Account one training step of **any** ``nn.Module``: ``resacct account --model module:factory``.

The contract of a factory (``--model my_pkg.models:build --model-arg width=128``):

- ``factory(**model_args)`` returns an ``nn.Module``, or ``(module, example_input)``;
- the input of the step is, in this order: the returned ``example_input`` (a tensor, or a dict
  of keyword tensors); a random tensor of ``input_shape`` and ``input_dtype`` (floats ~ N(0, 1),
  integers 0: a valid index for any embedding); ``input_ids`` (and ``labels``) of (batch, seq)
  for a model whose forward takes ``input_ids`` (``transformers`` causal LMs);
  ``module.example_input(batch)``; ``(batch, in_features)`` (or ``(batch, seq, in_features)``)
  floats when the first module run is a Linear — :func:`resacct.account.load.model_io.default_inputs`,
  made where the model is (nothing allocated on meta). Otherwise resacct asks for ``--input-shape``;
- the output is a tensor, an object with ``.loss`` / ``.logits`` (``transformers``' outputs), a
  mapping with those keys, or a tuple (its first tensor); the loss is the model's own ``.loss``
  when there is one (``auto``, the default), else ``mean`` of the output, ``sum``, ``mse``
  against zeros, or ``cross-entropy`` against class 0 (the last axis is the classes);
- whatever the factory or the model raises comes out as one line naming the user's frame.

For every module resacct measures: FlopCounterMode's FLOPs forward and backward, per module
(exclusive), and the ops it does not count; the training state of the real ``torch.optim``
optimizer after a step, by storage; the bytes autograd saves for backward per module
(``saved_tensors_hooks``, by storage); on a measured CPU run the allocator's forward + backward
peak and the optimizer step's scratch. Predictions come where resacct has a formula: the state
always (:func:`resacct.measurement.memory.training_state_bytes`); FLOPs and saved bytes for stacks of
Linear layers and activation functions (:mod:`resacct.formulas.account_formulas`: Cruncher, MLPs); a
``transformers`` causal LM of gpt2, llama, mistral or mixtral as ``--hf-config`` predicts it; the
AdamW step's scratch. Which formula predicts a model is the provider registry's answer, asked once
(:mod:`resacct.account.answers.providers`). Elsewhere the table shows "—" and a note says why.

>>> account = account_named_model("resacct.account.answers.generic:mlp", model_args={"dim": 8, "hidden": 16}, batch=3)
>>> account.saved.activation_bytes == account.predicted.saved_bytes == 4 * 3 * (8 + 2 * 16)
True
>>> account.state.at_step_bytes == account.state.predicted_at_step_bytes
True
>>> account.to_dict()["model"]
'resacct.account.answers.generic:mlp'
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from resacct.account.trace.step_measurements import (
    AUTO_MEASURE_MAX_STEP_FLOPS,
    StepFlopTrace,
    TrainingStateMeasurement,
    recipe_autocast,
    measure_step_once,
    measure_training_state,
    predict_optimizer_step_transient_bytes,
    trace_step_flops,
)
from resacct.account.peak.step_peak import StepPeakAccount, account_model_step_peak
from resacct.account.peak import one_pass
from resacct.account.load.optimizers import build_optimizer, memory_optimizer_name, optimizer_display_name
from resacct.measurement.activations import SavedActivations, record_saved_activations, trace_allocations
from resacct.facts.dtypes import parse_dtype
from resacct.errors import ResacctError
from resacct.facts.recipes import Recipe
from resacct.measurement.memory import distinct_storage_bytes, get_state_recipe
from resacct.account.load.model_io import (
    LOSS_CHOICES,
    StepInputs,
    call_model,
    cast_inputs,
    check_inputs,
    default_inputs,
    inputs_on,
    loss_of_output,
    main_input,
    resolve_loss,
)
from resacct.account.render.model_account import ModelAccount
from resacct.account.load.model_factory import load_model, load_model_on, parse_model_arg
from resacct.account.answers.providers import MeasuredStep, predict_step, untraced_note
from resacct.account.trace.untraced import UnmeasuredState, UnrecordedActivations, UntracedFlops, unmeasured_state
from resacct.training.models import Cruncher
from resacct.account.load.user_code import calling_user_code, code_location

__all__ = ["cruncher", "mlp", "parse_model_arg", "load_model", "ModelAccount", "account_module", "account_named_model"]  # the factory loading: resacct.account.load.model_factory

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "silu": nn.SiLU}


def cruncher(dim: int = 64, layers: int = 4) -> nn.Module:
    """The lecture's deep linear model (:class:`resacct.training.models.Cruncher`) as a factory.

    >>> cruncher(dim=4, layers=2).parameter_count()
    45
    """
    return Cruncher(dim=dim, num_layers=layers)


def mlp(dim: int = 64, hidden: int = 256, depth: int = 1, outputs: int | None = None, activation: str = "gelu", bias: bool = True) -> nn.Module:
    """Linear(dim → hidden) → act → (Linear(hidden → hidden) → act) × (depth − 1) → Linear(hidden → outputs).

    >>> mlp(dim=8, hidden=16, depth=2, activation="relu")
    Sequential(
      (0): Linear(in_features=8, out_features=16, bias=True)
      (1): ReLU()
      (2): Linear(in_features=16, out_features=16, bias=True)
      (3): ReLU()
      (4): Linear(in_features=16, out_features=8, bias=True)
    )
    """
    if activation not in _ACTIVATIONS:
        raise ResacctError(f"activation {activation!r}: expected one of {', '.join(_ACTIVATIONS)}")
    for name, value in (("dim", dim), ("hidden", hidden), ("depth", depth), ("outputs", dim if outputs is None else outputs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResacctError(f"{name} {value!r}: expected a whole number ≥ 1")
    widths = [dim] + [hidden] * depth
    modules: list[nn.Module] = []
    for width_in, width_out in zip(widths[:-1], widths[1:]):
        modules += [nn.Linear(width_in, width_out, bias=bias), _ACTIVATIONS[activation]()]
    return nn.Sequential(*modules, nn.Linear(hidden, dim if outputs is None else outputs, bias=bias))


def account_module(
    model: nn.Module, example_input: Any, *, name: str | None = None, loss: str = "auto", recipe: str | Recipe = "fp32",
    optimizer: str = "adamw", measure_peaks: bool = True,
) -> ModelAccount:
    """Account one step of ``model`` on ``example_input`` (a tensor, a tuple of tensors for a
    forward with several arguments, or keyword tensors such as ``{"input_ids": …, "labels": …}``)
    where both already are (CPU or meta). Whatever the model's
    code raises (forward, loss, backward) is one line naming the user's frame
    (:class:`resacct.account.load.user_code.UserCodeError`) — but on meta, where the model's provider
    (:func:`resacct.account.answers.providers.untraced_note`) knows the kernel that raised cannot run
    there, the account keeps the predictions (measured "—") and a note names the kernel and what to do.

    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> account = account_module(model, torch.randn(5, 4), optimizer="sgd", measure_peaks=False)
    >>> account.flops.forward_flops, account.state.at_step_bytes, account.saved.activation_bytes   # 2·5·(32+16); 8·58; 4·5·(4+8)
    (480, 464, 240)
    """
    example_input = check_inputs(example_input)
    chosen = get_state_recipe(recipe)
    memory_optimizer_name(optimizer)
    parameters = list(model.parameters())
    if not parameters:
        raise ResacctError(f"the model {type(model).__name__} has no parameters; expected a model with something to train")
    where = parameters[0].device.type
    resolved: list[str] = []

    def loss_of(module: nn.Module) -> torch.Tensor:
        output = call_model(module, cast_inputs(example_input, next(module.parameters()).dtype))
        if not resolved:
            resolved.append(resolve_loss(output, loss))
        return loss_of_output(output, loss)

    user_step = functools.partial(calling_user_code, f"the step of {type(model).__name__} (forward, loss or backward)",
                                  hint=f"; input {_describe_inputs(example_input)}", fallback=code_location(type(model).forward))
    untraced = None
    copy_runs_as_model = _copy_runs_as_the_model(parameters, chosen, where)
    once = one_pass.trace_once(model, example_input, loss, chosen, optimizer, parameters, where, user_step) if copy_runs_as_model else None
    with user_step():
        try:
            flops: StepFlopTrace | UntracedFlops
            state: TrainingStateMeasurement | UnmeasuredState
            saved: SavedActivations | UnrecordedActivations
            if once is not None and once[0] is not None:  # measured on the step peak's fake pass: no meta pass
                recorder = once[0]
                flops, state, saved, activation_model = recorder.flops, recorder.state, recorder.saved, model
                resolved.append(recorder.resolved_loss)
            elif copy_runs_as_model:  # FLOPs, state and saved tensors in one forward and backward
                measured = measure_step_once(model, loss_of, chosen, optimizer)
                flops, state, saved, activation_model = measured.flops, measured.state, measured.saved, measured.model
            else:
                flops = trace_step_flops(model, lambda: loss_of(model))
                state = measure_training_state(model, loss_of, chosen, optimizer)
                activation_model = copy.deepcopy(model).to(parse_dtype(chosen.parameter_dtype))
                with record_saved_activations(activation_model) as recorded, recipe_autocast(chosen, where):
                    output = loss_of(activation_model)
                saved = recorded
                del output
        except ResacctError:
            raise
        except Exception as error:  # a kernel the meta device cannot run, where the model's provider knows it: predictions only
            untraced = untraced_note(model, error) if where == "meta" else None
            if untraced is None:
                raise
            flops, state, saved = UntracedFlops(), unmeasured_state(model, chosen, optimizer), UnrecordedActivations()
            activation_model = copy.deepcopy(model).to(parse_dtype(chosen.parameter_dtype))
        weights_bytes = distinct_storage_bytes(list(activation_model.state_dict().values()))
        del activation_model
    first = main_input(example_input)
    if resolved:
        resolved_loss = resolved[0]
    else:  # the forward never returned (untraced): a transformers causal LM given labels scores itself
        resolved_loss = "model" if loss == "auto" and isinstance(example_input, Mapping) and "labels" in example_input else resolve_loss(None, loss)
    count = sum(p.numel() for p in parameters)
    prediction = predict_step(MeasuredStep(model=model, inputs=example_input, name=name or type(model).__name__, loss=resolved_loss, recipe=chosen,
                                           optimizer=optimizer, parameters=count, flops=flops, state=state, saved=saved,
                                           checkpoint_weights_bytes=weights_bytes))
    notes = [note for note in (prediction.note, untraced) if note]
    account = ModelAccount(
        model=name or type(model).__name__, model_class=type(model).__name__, input_shape=tuple(first.shape),
        input_dtype=str(first.dtype).removeprefix("torch."), loss=resolved_loss, device=where, recipe=chosen, optimizer=optimizer,
        parameters=count, flops=flops, state=state, saved=saved, predicted=prediction.stack, notes=notes, hf=prediction.hf,
    )
    if untraced is not None:
        account.step_peak = StepPeakAccount(predicted=None, gap="the step could not be traced on the meta device: see the note")
        return account
    if once is not None:
        account.step_peak = once[1]
    else:
        with user_step():
            account.step_peak = account_model_step_peak(model, example_input, loss=resolved_loss, recipe=chosen, optimizer=optimizer,
                                                        measure=measure_peaks and where == "cpu")
    if measure_peaks and where == "cpu":
        with user_step():
            _measure_peaks(account, model, loss_of, optimizer, parameters)
    elif where == "meta":
        account.notes.append("built on the meta device: sizes measured, no arithmetic, no allocator peaks")
    return account


def _copy_runs_as_the_model(parameters: list[nn.Parameter], recipe: Recipe, where: str) -> bool:
    """Whether the recipe's copy of the model runs the step the model itself runs — parameters
    already in the recipe's dtype, no autocast (none on meta) — so that
    :func:`~resacct.account.trace.step_measurements.measure_step_once` traces the FLOPs on it, the same
    counts as on the model (``tests/test_account_trace_once.py`` checks both ways agree)."""
    dtype = parse_dtype(recipe.parameter_dtype)
    return all(p.dtype == dtype for p in parameters) and (recipe.compute_dtype is None or where == "meta")


def _describe_inputs(inputs: StepInputs) -> str:
    if isinstance(inputs, Mapping):
        return ", ".join(f"{name} {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}" for name, value in inputs.items())
    if isinstance(inputs, tuple):
        return ", ".join(f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}" for value in inputs)
    return f"{tuple(inputs.shape)} {str(inputs.dtype).removeprefix('torch.')}"


def _measure_peaks(account: ModelAccount, model: nn.Module, loss_of: Any, optimizer: str, parameters: list[nn.Parameter]) -> None:
    """The allocator's forward + backward peak and the optimizer step's scratch (a CPU run)."""
    model.zero_grad(set_to_none=True)
    with trace_allocations() as trace:
        loss_of(model).backward()
    model.zero_grad(set_to_none=True)
    account.step_peak_bytes = trace.peak_bytes
    work = copy.deepcopy(model)
    step = build_optimizer(optimizer, work.parameters(), foreach=True)
    try:
        for _ in range(2):
            loss_of(work).backward()
            with trace_allocations() as transient:
                step.step()
        account.optimizer_transient = transient
    except ResacctError:  # the profiler saw no allocation at all (plain SGD updates in place)
        account.notes.append(f"the {optimizer_display_name(optimizer)} step allocated nothing the CPU allocator recorded: no scratch")
    if optimizer == "adamw":
        account.predicted_optimizer_transient_bytes = predict_optimizer_step_transient_bytes([p.numel() for p in parameters], foreach=True)


def account_named_model(
    spec: str, *, model_args: Mapping[str, Any] | None = None, batch: int = 4, seq: int | None = None, input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float32", loss: str = "auto", recipe: str | Recipe = "fp32", optimizer: str = "adamw", measure: bool | None = None,
) -> ModelAccount:
    """Build ``spec`` (``module:factory``) with ``model_args`` and account one step of it on the
    inputs of :func:`resacct.account.load.model_io.default_inputs` (``seq``: tokens per sequence of a token
    model — a ``transformers`` causal LM gets ``input_ids`` and ``labels`` — or the middle axis
    of a Linear's input).

    ``measure=False`` builds it on the meta device (the factory runs under ``torch.device("meta")``,
    and the inputs are made there: no memory); ``True`` on the CPU; ``None``: the CPU when a step
    is at most :data:`resacct.account.trace.step_measurements.AUTO_MEASURE_MAX_STEP_FLOPS` (traced on meta first), else meta
    (also where meta cannot trace the step, in a kernel the model's provider knows: predicted only, one note says so).
    """
    for label, value in (("batch", batch), ("seq", 1 if seq is None else seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResacctError(f"{label} {value!r}: expected a whole number ≥ 1")
    if input_shape is not None and (not input_shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in input_shape)):
        raise ResacctError(f"input shape {input_shape!r}: expected whole numbers ≥ 1, e.g. 8,64")
    parse_dtype(input_dtype)
    if loss not in LOSS_CHOICES:
        raise ResacctError(f"loss {loss!r}: expected one of {', '.join(LOSS_CHOICES)}")

    def build(device: str) -> tuple[nn.Module, StepInputs]:
        model, example = load_model_on(device, spec, model_args)
        if not list(model.parameters()):
            raise ResacctError(f"the model {type(model).__name__} from {spec!r} has no parameters; expected a model with something to train")
        model.train()
        if example is None:
            with calling_user_code(f"making the input of {type(model).__name__}"):
                example = default_inputs(model, batch=batch, seq=seq, input_shape=input_shape, input_dtype=input_dtype, device=device)
        else:
            example = inputs_on(check_inputs(example), device)
        return model, example

    if measure is None:
        model, example = build("meta")
        traced: StepFlopTrace | None = None
        with calling_user_code(f"the step of {type(model).__name__} (forward, loss or backward)", hint=f"; input {_describe_inputs(example)}",
                               fallback=code_location(type(model).forward)):
            try:
                traced = trace_step_flops(model, lambda: loss_of_output(call_model(model, example), loss))
            except ResacctError:
                raise
            except Exception as error:  # a kernel meta cannot run that the model's provider knows: stays on meta, predicted only
                if untraced_note(model, error) is None:
                    raise
        if traced is None or traced.step_flops > AUTO_MEASURE_MAX_STEP_FLOPS:
            return account_module(model, example, name=spec, loss=loss, recipe=recipe, optimizer=optimizer)
        measure = True
    model, example = build("cpu" if measure else "meta")
    return account_module(model, example, name=spec, loss=loss, recipe=recipe, optimizer=optimizer)
