"""Measuring mixed precision with torch: the dtypes autocast gives each matmul, bytes per
parameter and saved-activation ratios of each recipe, torch.amp's entry points, fp16 gradient
underflow and loss scaling. The training-loop checks are in :mod:`resacct.checks.train` (which
re-exports these)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from resacct.facts.dtypes import FORMATS, smallest_subnormal
from resacct.checks._train_models import _cruncher, _dtype, _saved_activation_bytes
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.training.models import Cruncher
from resacct.facts.precision import get_recipe, persistent_bytes_per_parameter, saved_activation_bytes_ratio

__all__: list[str] = []


# --- mixed precision -----------------------------------------------------------------------


class _MatmulDtypes(TorchDispatchMode):
    """Records the dtype of every matmul (``aten.mm``/``addmm``/``bmm``) output torch computes."""

    MATMULS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        output = func(*args, **(kwargs or {}))
        if func.overloadpacket in self.MATMULS:
            self.dtypes.add(_dtype(output))
        return output

    def single(self) -> str:
        return "+".join(sorted(self.dtypes)) or "none"


def _one_step_dtypes(recipe_name: str) -> tuple[list[str], Cruncher, torch.optim.Optimizer]:
    """One AdamW step of a Cruncher under ``recipe_name``; the dtypes of [parameter, forward
    matmul outputs, backward matmul outputs, parameter gradient, AdamW exp_avg]."""
    recipe = get_recipe(recipe_name)
    if recipe.uses_autocast:
        _require_cpu_autocast(getattr(torch, recipe.computes_in))
    model = _cruncher(0).to(getattr(torch, recipe.parameter_dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, dtype=getattr(torch, recipe.parameter_dtype))
    with torch.autocast("cpu", dtype=getattr(torch, recipe.computes_in), enabled=recipe.uses_autocast):
        with _MatmulDtypes() as forward:
            loss = model(x).float().pow(2).mean()
    with _MatmulDtypes() as backward:
        loss.backward()
    optimizer.step()
    weight = model.layers[0].weight
    dtypes = [_dtype(weight), forward.single(), backward.single(), _dtype(weight.grad), _dtype(optimizer.state[weight]["exp_avg"])]  # type: ignore[arg-type]
    return dtypes, model, optimizer


@check("train.training_dtypes", evidence="measured")
def training_dtypes(recipe: str) -> Outcome:
    """One AdamW step of a Cruncher under a precision recipe (``bf16-autocast``:
    ``torch.autocast("cpu", dtype=bfloat16)``; ``bf16-cast-model``: ``model.to(bfloat16)``);
    measures the dtypes [parameter, forward matmul outputs, backward matmul outputs, parameter
    gradient, optimizer state] that torch uses (matmuls seen by a ``TorchDispatchMode``). resacct's recipe predicts them."""
    dtypes, _, _ = _one_step_dtypes(recipe)
    return Outcome(measured=dtypes, predicted=get_recipe(recipe).as_list())


@check("train.persistent_bytes_per_parameter", evidence="measured")
def measured_persistent_bytes_per_parameter(recipe: str) -> Outcome:
    """Bytes that outlive one AdamW step under ``recipe`` — parameters, gradients and the
    optimizer states other than its scalar ``step`` (``untyped_storage().nbytes()``) — per parameter."""
    _, model, optimizer = _one_step_dtypes(recipe)
    total, count = 0, 0
    for parameter in model.parameters():
        count += parameter.numel()
        total += parameter.untyped_storage().nbytes() + parameter.grad.untyped_storage().nbytes()  # type: ignore[union-attr]
        total += sum(state.untyped_storage().nbytes() for key, state in optimizer.state[parameter].items() if key != "step")
    return Outcome(measured=total / count, predicted=persistent_bytes_per_parameter(recipe, optimizer_states=2))


@check("train.saved_bytes_ratio", evidence="measured")
def saved_bytes_ratio(recipe: str, batch_size: int = 32, dim: int = 64, num_layers: int = 4) -> Outcome:
    """Bytes autograd saves for backward (``saved_tensors_hooks``, weights' copies included) under
    the recipe's autocast, divided by the same forward in float32."""
    model = _cruncher(0, dim=dim, num_layers=num_layers)
    x = torch.randn(batch_size, dim)
    compute = getattr(torch, get_recipe(recipe).computes_in)
    mixed = _saved_activation_bytes(model, x, autocast_dtype=compute, include_weights=True)
    full = _saved_activation_bytes(model, x, include_weights=True)
    return Outcome(measured=mixed / full, predicted=saved_activation_bytes_ratio(recipe))


@check("train.cuda_amp_entry_point", evidence="measured")
def cuda_amp_entry_point(name: str, report: str = "exists") -> Outcome:
    """``torch.cuda.amp.<name>`` (autocast or GradScaler): ``report: exists`` → whether the
    attribute is there; ``report: warning`` → the category of the first warning other than
    "CUDA not available" that constructing it emits (``"none"`` if none)."""
    amp = getattr(torch.cuda, "amp", None)
    entry = getattr(amp, name, None) if amp is not None else None
    if report == "exists":
        return Outcome(measured=entry is not None)
    if entry is None:
        return Outcome(measured="missing")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entry()
    categories = [w.category.__name__ for w in caught if "not available" not in str(w.message)]
    return Outcome(measured=categories[0] if categories else "none")


def _require_cpu_autocast(dtype: torch.dtype) -> None:
    """Older torch builds disable CPU autocast for some dtypes (with a warning); say so."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=dtype):
            pass
    disabled = [str(w.message) for w in caught if "autocast" in str(w.message).lower()]
    if disabled:
        raise NotMeasurable(f"torch {torch.__version__} does not autocast to {dtype} on CPU: {disabled[0]}")


def _fp16_underflow_setup() -> tuple[nn.Parameter, torch.Tensor, Callable[[], torch.Tensor]]:
    """A weight whose true gradient is 2e-8 per element: below float16's smallest subnormal."""
    _require_cpu_autocast(torch.float16)
    weight = nn.Parameter(torch.ones(4, 4))
    x = torch.full((2, 4), 1e-4)

    def loss() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            return ((x @ weight) * 1e-4).sum()

    return weight, x, loss


@check("train.fp16_gradient_kept_fraction", evidence="measured")
def fp16_gradient_kept_fraction(loss_scale: float) -> Outcome:
    """Under ``torch.autocast("cpu", dtype=float16)``, a loss whose true gradient is 2e-8 per
    weight; backward with ``torch.amp.GradScaler("cpu", init_scale=loss_scale)`` (no scaler
    when ``loss_scale`` is 0), then unscale. Measures the recovered gradient divided by the
    float32 gradient. resacct predicts 0 when gradient × scale is below half of float16's
    smallest subnormal, else 1."""
    weight, x, loss = _fp16_underflow_setup()
    reference = torch.ones(4, 4, requires_grad=True)
    ((x @ reference) * 1e-4).sum().backward()
    true_gradient = float(reference.grad[0, 0])  # type: ignore[index]
    if loss_scale:
        scaler = torch.amp.GradScaler("cpu", init_scale=loss_scale)
        scaler.scale(loss()).backward()
        scaler.unscale_(torch.optim.SGD([weight], lr=0.0))
    else:
        loss().backward()
    kept = float(weight.grad[0, 0]) / true_gradient  # type: ignore[index]
    survives = true_gradient * (loss_scale or 1.0) >= smallest_subnormal(FORMATS["float16"]) / 2
    return Outcome(measured=kept, predicted=1.0 if survives else 0.0)


@check("train.grad_scaler_dynamics", evidence="measured")
def grad_scaler_dynamics(init_scale: float, steps: int, growth_interval: int = 2000, report: str = "scale") -> Outcome:
    """``steps`` SGD steps with ``torch.amp.GradScaler("cpu", init_scale, growth_interval)`` on
    the float16 problem above (whose scaled gradient overflows float16 at 65536). ``report``:
    ``scale`` (after the last ``update()``) or ``first_step_skipped`` (the weight unchanged)."""
    weight, _, loss = _fp16_underflow_setup()
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    first_step_skipped = False
    for step in range(steps):
        before = weight.detach().clone()
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss()).backward()
        scaler.step(optimizer)
        scaler.update()
        if step == 0:
            first_step_skipped = torch.equal(before, weight.detach())
    if report == "scale":
        return Outcome(measured=float(scaler.get_scale()))
    if report == "first_step_skipped":
        return Outcome(measured=first_step_skipped)
    raise ValueError(f"report {report!r}: expected scale or first_step_skipped")
