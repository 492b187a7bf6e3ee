"""What goes into a model's training step and what comes out: the inputs resacct builds for any
``nn.Module`` (Hugging Face causal LMs included) and the loss it reads from whatever the forward
returns — a tensor, an object with ``.loss`` / ``.logits`` (``transformers``' ``ModelOutput``), a
mapping with those keys, or a tuple (its first tensor).

Inputs, in this order: a tensor of ``input_shape`` (batch first); a token model — its forward
takes ``input_ids`` (every ``transformers`` causal LM) — gets ``input_ids`` of (batch, seq) random
token ids below the vocabulary and, when the forward takes ``labels``, the same ids as labels (the
model shifts them: the next-token loss); ``module.example_input(batch)``; floats of (batch,
in_features) or (batch, seq, in_features) when the first module run is a Linear. Every input is
made **where the model is**: on the meta device nothing is allocated.

>>> model = torch.nn.Sequential(torch.nn.Linear(8, 4))
>>> inputs = default_inputs(model, batch=2, seq=3, device="meta")
>>> inputs.shape, inputs.device
(torch.Size([2, 3, 8]), device(type='meta'))
>>> loss_of_output((torch.ones(2, 3, requires_grad=True), "extra"), "auto")
tensor(1., grad_fn=<MeanBackward0>)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch
from jaxtyping import Float, Shaped
from torch import nn

from resacct.facts.dtypes import parse_dtype
from resacct.errors import ResacctError

__all__ = ["LOSS_CHOICES", "StepInputs", "MAX_TENSOR_ELEMENTS", "forward_parameters", "is_token_model", "context_length", "default_inputs",
           "call_model", "main_input", "cast_inputs", "check_inputs", "inputs_on", "output_tensor", "model_loss", "loss_of_output", "resolve_loss"]

#: ``--loss``: ``auto`` is the model's own loss when its output carries one, else ``mean``
LOSS_CHOICES = ("auto", "model", "mean", "sum", "mse", "cross-entropy")
MAX_TENSOR_ELEMENTS = 2**63 - 1  # torch counts elements in int64

#: One step's input: a tensor (``model(x)``), a tuple of tensors (``model(*xs)``) or a mapping of
#: keyword tensors (``model(**inputs)``, e.g. ``input_ids`` and ``labels``).
StepInputs = Shaped[torch.Tensor, "batch *rest"] | tuple[torch.Tensor, ...] | Mapping[str, torch.Tensor]


def forward_parameters(model: nn.Module) -> tuple[str, ...]:
    """Names the model's ``forward`` takes (``self`` excluded); () when it cannot be read."""
    try:
        return tuple(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return ()


def is_token_model(model: nn.Module) -> bool:
    """A model whose forward takes ``input_ids`` (every ``transformers`` language model), or whose
    first module with weights is an ``nn.Embedding`` (token ids in, whatever the argument's name)."""
    return "input_ids" in forward_parameters(model) or _first_embedding(model) is not None


def _first_embedding(model: nn.Module) -> nn.Embedding | None:
    """The model's first module with weights of its own, when that is an ``nn.Embedding``."""
    first = next((module for module in model.modules() if next(module.parameters(recurse=False), None) is not None), None)
    return first if isinstance(first, nn.Embedding) else None


def _vocabulary(model: nn.Module) -> int:
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0:
        return vocab
    embeddings = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else _first_embedding(model)
    if isinstance(embeddings, nn.Embedding):
        return embeddings.num_embeddings
    raise ResacctError(f"cannot tell the vocabulary of {type(model).__name__}; expected a config.vocab_size or an input embedding")


def context_length(model: nn.Module) -> int | None:
    """The longest sequence a token model's config allows (``max_position_embeddings``, ``n_positions`` …)."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check_elements(shape: tuple[int, ...]) -> None:
    if math.prod(shape) > MAX_TENSOR_ELEMENTS:
        raise ResacctError(f"an input of shape {shape} has {math.prod(shape):.3g} elements, more than a torch tensor can hold (2^63 − 1); "
                           "expected a smaller --batch or --seq")


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device, *, high: int | None = None) -> torch.Tensor:
    """A tensor made on ``device`` directly (meta: no memory): floats N(0, 1), integers below ``high`` (or 0), seeded."""
    _check_elements(shape)
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    generator = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    if high is not None:
        return torch.randint(0, high, shape, generator=generator, dtype=dtype).to(device)
    return torch.zeros(shape, dtype=dtype, device=device)


def default_inputs(model: nn.Module, *, batch: int, seq: int | None = None, input_shape: tuple[int, ...] | None = None,
                   input_dtype: str = "float32", device: str | torch.device | None = None) -> StepInputs:
    """The inputs of one step of ``model`` (see the module's docstring), made on ``device``
    (default: where the model's parameters are)."""
    from resacct.formulas.account_formulas import NoFormula, linear_widths, module_leaves

    where = device if device is not None else next(model.parameters()).device
    if input_shape is not None:
        if seq is not None:
            raise ResacctError(f"seq {seq} and input shape {','.join(map(str, input_shape))} both give the input (--seq and --input-shape "
                               "on the command line); expected one of them")
        return _tensor(tuple(input_shape), parse_dtype(input_dtype), where)
    if is_token_model(model):
        length = seq if seq is not None else context_length(model)
        if length is None:
            raise ResacctError(f"cannot tell the sequence length of {type(model).__name__}; expected seq=N (--seq N on the command line)")
        limit = context_length(model)
        if limit is not None and length > limit:
            raise ResacctError(f"seq {length} is longer than the model's context length {limit}; expected seq ≤ {limit}")
        ids = _tensor((batch, length), torch.long, where, high=_vocabulary(model))
        if "input_ids" not in forward_parameters(model):
            return ids  # an embedding first: the ids go in as the forward's first argument
        return {"input_ids": ids, "labels": ids} if "labels" in forward_parameters(model) else {"input_ids": ids}
    if callable(getattr(model, "example_input", None)):
        with torch.device(where):  # a method that builds its tensor without a device builds it here
            example = model.example_input(batch)
        return example.to(where)
    try:
        first = next(iter(module_leaves(model, "")))[1]
        width = linear_widths(first)[0]
    except (NoFormula, StopIteration, AttributeError, IndexError):
        raise ResacctError(f"cannot tell the input of {type(model).__name__}; expected an input shape (input_shape=(8, 64); --input-shape 8,64), "
                           "an example input, an example_input(batch) method, a forward taking input_ids, or a factory returning "
                           "(model, example_input)") from None
    shape = (batch, width) if seq is None else (batch, seq, width)
    return _tensor(shape, torch.float32, where)


def call_model(model: nn.Module, inputs: StepInputs) -> Any:
    """``model(**inputs)`` for a mapping (``input_ids=…, labels=…``), ``model(*inputs)`` for a
    tuple, else ``model(inputs)``."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def main_input(inputs: StepInputs) -> torch.Tensor:
    """The tensor that names the step's input: the tensor itself, or the mapping's or tuple's first."""
    if isinstance(inputs, Mapping):
        return next(iter(inputs.values()))
    return inputs[0] if isinstance(inputs, tuple) else inputs


def cast_inputs(inputs: StepInputs, dtype: torch.dtype) -> StepInputs:
    """Floating inputs in ``dtype`` (a bf16 model gets bf16 inputs); integer ids unchanged."""
    if isinstance(inputs, Mapping):
        return {name: value.to(dtype) if value.is_floating_point() else value for name, value in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(value.to(dtype) if value.is_floating_point() else value for value in inputs)
    return inputs.to(dtype) if inputs.is_floating_point() else inputs


def inputs_on(inputs: StepInputs, device: str | torch.device) -> StepInputs:
    """The same inputs on ``device``."""
    if isinstance(inputs, Mapping):
        return {name: value.to(device) for name, value in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(value.to(device) for value in inputs)
    return inputs.to(device)


def check_inputs(inputs: Any) -> StepInputs:
    """``inputs`` if it is a step's input (a tensor, a non-empty tuple of tensors, or a mapping of
    names to tensors); else one error saying what was given and what is expected."""
    if isinstance(inputs, torch.Tensor):
        return inputs
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if isinstance(inputs, tuple) and inputs and all(isinstance(value, torch.Tensor) for value in inputs):
        return inputs
    if isinstance(inputs, Mapping) and inputs and all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in inputs.items()):
        return dict(inputs)
    shown = type(inputs).__name__ if not isinstance(inputs, (tuple, Mapping)) else f"a {type(inputs).__name__} of {', '.join(sorted({type(v).__name__ for v in (inputs.values() if isinstance(inputs, Mapping) else inputs)})) or 'nothing'}"
    raise ResacctError(f"example_input is {shown}; expected a tensor (model(x)), a tuple of tensors (model(*xs)) "
                       "or a dict of name → tensor (model(**inputs))")


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping) and name in output:
        return output[name]
    return getattr(output, name, None) if not isinstance(output, (torch.Tensor, tuple, list)) else None


def model_loss(output: Any) -> Float[torch.Tensor, ""] | None:
    """The loss the model computed itself (``output.loss``, e.g. a causal LM given labels), or None."""
    loss = _field(output, "loss")
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def output_tensor(output: Any) -> Shaped[torch.Tensor, "..."]:
    """The tensor a loss is taken of: a tensor; ``.logits`` (or ``["logits"]``); an encoder's or a
    seq2seq model's ``.last_hidden_state`` (transformers' ``BertModel``, ``T5Model``: no head, no
    loss of their own — the step's loss is the one named, ``mean`` by default); a tuple's or list's first tensor."""
    if isinstance(output, torch.Tensor):
        return output
    for name in ("logits", "last_hidden_state"):
        value = _field(output, name)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    raise ResacctError(f"the model returned a {type(output).__name__}; expected a tensor, an output with .logits, .last_hidden_state or .loss, "
                       "or a tuple holding a tensor")


def resolve_loss(output: Any, loss: str) -> str:
    """``auto`` → ``model`` when the output carries its own loss, else ``mean``; others unchanged."""
    if loss not in LOSS_CHOICES:
        raise ResacctError(f"loss {loss!r}: expected one of {', '.join(LOSS_CHOICES)}")
    if loss == "auto":
        return "model" if model_loss(output) is not None else "mean"
    return loss


def loss_of_output(output: Any, loss: str) -> Float[torch.Tensor, ""]:
    """The scalar a step differentiates: the model's own loss (``model``; ``auto`` when there is
    one), or ``mean`` / ``sum`` of the output tensor, ``mse`` against zeros, ``cross-entropy``
    against class 0 (the last axis is the classes)."""
    chosen = resolve_loss(output, loss)
    if chosen == "model":
        own = model_loss(output)
        if own is None:
            raise ResacctError(f"--loss model: the model returned a {type(output).__name__} without a .loss; expected labels it can score, or --loss mean")
        value = own.float()
    else:
        tensor = output_tensor(output)
        if chosen == "mean":
            value = tensor.float().mean()
        elif chosen == "sum":
            value = tensor.float().sum()
        elif chosen == "mse":  # in the output's dtype (what resacct.formulas.account_formulas predicts), the scalar in float32
            value = nn.functional.mse_loss(tensor, torch.zeros_like(tensor)).float()
        else:
            classes = tensor.reshape(-1, tensor.shape[-1])
            value = nn.functional.cross_entropy(classes, torch.zeros(classes.shape[0], dtype=torch.long, device=tensor.device)).float()
    if torch.is_grad_enabled() and not value.requires_grad:
        raise ResacctError(f"the {chosen} loss of the model's output needs no gradient (no trainable parameter reaches it); "
                           "expected a forward whose output depends on the parameters")
    return value
