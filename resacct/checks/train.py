"""Measuring the training loop and mixed precision with torch: zero_grad, loop order, gradient
accumulation, the learning-rate schedule, clipping, autocast dtypes, loss scaling."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from resacct.dtypes import FORMATS, smallest_subnormal
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.models import Cruncher
from resacct.precision import get_recipe, persistent_bytes_per_parameter, saved_activation_bytes_ratio
from resacct.train import clipped_grad_norm, cosine_lr, global_grad_norm

__all__: list[str] = []


def _cruncher(seed: int, dim: int = 8, num_layers: int = 2) -> Cruncher:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Cruncher(dim=dim, num_layers=num_layers)


def _regression_batches(seed: int, count: int, batch_size: int, dim: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, dim, generator=generator), torch.randn(batch_size, 1, generator=generator)) for _ in range(count)]


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


# --- zero_grad -----------------------------------------------------------------------------


@check("train.zero_grad_frees", quantities=("grads_none",))
def zero_grad_frees(mode: str) -> Outcome:
    """After a backward pass, call ``optimizer.zero_grad(...)`` (``mode``: ``set_to_none`` →
    ``set_to_none=True``, ``zeros`` → ``set_to_none=False``, ``default`` → no argument) and
    measure the fraction of gradient tensors that are freed (their weak references die: the
    last reference is gone, so the memory is back with the allocator)."""
    model = _cruncher(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    (x, y), = _regression_batches(0, 1, 4, 8)
    F.mse_loss(model(x), y).backward()
    references = [weakref.ref(parameter.grad) for parameter in model.parameters()]
    if mode == "set_to_none":
        optimizer.zero_grad(set_to_none=True)
    elif mode == "zeros":
        optimizer.zero_grad(set_to_none=False)
    elif mode == "default":
        optimizer.zero_grad()
    else:
        raise ValueError(f"mode {mode!r}: expected set_to_none, zeros or default")
    freed = sum(reference() is None for reference in references) / len(references)
    grads_none = all(parameter.grad is None for parameter in model.parameters())
    return Outcome(measured=freed, quantities={"grads_none": grads_none})


# --- loop order ----------------------------------------------------------------------------


def _run_loop(order: str, steps: int, seed: int) -> list[torch.Tensor]:
    model = _cruncher(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in _regression_batches(seed + 1, steps, 4, 8):
        if order == "zero_grad_first":  # seed 001
            optimizer.zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()
            optimizer.step()
        elif order == "step_then_zero_grad":  # seed 003
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        elif order == "no_zero_grad":
            F.mse_loss(model(x), y).backward()
            optimizer.step()
        else:
            raise ValueError(f"order {order!r}: expected zero_grad_first, step_then_zero_grad or no_zero_grad")
    return [parameter.detach().clone() for parameter in model.parameters()]


@check("train.loop_order_same_parameters")
def loop_order_same_parameters(order: str, steps: int = 5, seed: int = 0) -> Outcome:
    """Train a Cruncher with SGD+momentum for ``steps`` steps with the loop ``order`` and with the
    lecture-001 order (zero_grad, backward, step); measure whether every parameter ends
    bit-identical (``torch.equal``)."""
    reference = _run_loop("zero_grad_first", steps, seed)
    other = _run_loop(order, steps, seed)
    return Outcome(measured=all(torch.equal(a, b) for a, b in zip(reference, other)))


# --- gradient accumulation -----------------------------------------------------------------


def _gradients(model: nn.Module) -> list[torch.Tensor]:
    return [parameter.grad.detach().clone() for parameter in model.parameters()]  # type: ignore[union-attr]


@check("train.accumulated_gradient_difference")
def accumulated_gradient_difference(micro_batches: int, micro_batch_size: int, seed: int = 0, dim: int = 8) -> Outcome:
    """Largest relative difference between the gradients of one batch of
    ``micro_batches × micro_batch_size`` rows (mean loss) and the gradients accumulated over the
    micro-batches, each loss divided by ``micro_batches``: ``max |g_acc − g| / max |g|``."""
    model = _cruncher(seed, dim=dim)
    (x, y), = _regression_batches(seed, 1, micro_batches * micro_batch_size, dim)
    F.mse_loss(model(x), y).backward()
    large = _gradients(model)
    model.zero_grad(set_to_none=True)
    for x_micro, y_micro in zip(x.split(micro_batch_size), y.split(micro_batch_size)):
        (F.mse_loss(model(x_micro), y_micro) / micro_batches).backward()
    accumulated = _gradients(model)
    scale = max(float(g.abs().max()) for g in large)
    difference = max(float((a - g).abs().max()) for a, g in zip(accumulated, large))
    return Outcome(measured=difference / scale)


def _saved_activation_bytes(model: nn.Module, x: torch.Tensor, autocast_dtype: torch.dtype | None = None, include_weights: bool = False) -> int:
    """Bytes of the tensors autograd saves for backward during ``model(x)``, by
    ``saved_tensors_hooks``; parameters themselves are left out unless ``include_weights``."""
    parameter_storages = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    seen: set[int] = set()
    total = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in seen and (include_weights or pointer not in parameter_storages):
            seen.add(pointer)
            total[0] += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            output = model(x)
    del output
    return total[0]


@check("train.micro_batch_activation_fraction")
def micro_batch_activation_fraction(micro_batches: int, micro_batch_size: int, dim: int = 16, num_layers: int = 3) -> Outcome:
    """Bytes autograd saves for backward (``saved_tensors_hooks``, parameters excluded) for one
    micro-batch, divided by those for the whole ``micro_batches × micro_batch_size`` batch."""
    model = _cruncher(0, dim=dim, num_layers=num_layers)
    whole = torch.randn(micro_batches * micro_batch_size, dim)
    micro = whole[:micro_batch_size].clone()  # a slice would keep the whole batch's storage
    return Outcome(measured=_saved_activation_bytes(model, micro) / _saved_activation_bytes(model, whole))


# --- learning-rate schedule ----------------------------------------------------------------


def _torch_warmup_cosine(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> list[float]:
    """The learning rate torch's ``LinearLR`` (from ~0) → ``CosineAnnealingLR`` sets at steps 0 … total."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=max_lr)
    schedulers: list[torch.optim.lr_scheduler.LRScheduler] = []
    if warmup_steps:
        schedulers.append(torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1e-12, end_factor=1.0, total_iters=warmup_steps))
    schedulers.append(torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps, eta_min=min_lr))
    schedule = schedulers[0] if len(schedulers) == 1 else torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones=[warmup_steps])
    learning_rates = []
    for _ in range(total_steps + 1):
        learning_rates.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        schedule.step()
    return learning_rates


@check("train.warmup_cosine_endpoints")
def warmup_cosine_endpoints(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> Outcome:
    """Torch's warm-up + cosine learning rate at step 0, at the end of warm-up and at the last
    step; resacct's :func:`cosine_lr` predicts them."""
    torch_rates = _torch_warmup_cosine(max_lr, min_lr, warmup_steps, total_steps)
    points = (0, warmup_steps, total_steps)
    return Outcome(
        measured=[torch_rates[step] for step in points],
        predicted=[cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps) for step in points],
    )


@check("train.warmup_cosine_largest_deviation")
def warmup_cosine_largest_deviation(max_lr: float, min_lr_fraction: float, warmup_steps: int, decay_steps: int) -> Outcome:
    """Largest |torch − resacct| learning rate over every step of a warm-up + cosine schedule
    (``min_lr = min_lr_fraction · max_lr``, ``total = warmup + decay``)."""
    total_steps = warmup_steps + decay_steps
    min_lr = min_lr_fraction * max_lr
    torch_rates = _torch_warmup_cosine(max_lr, min_lr, warmup_steps, total_steps)
    return Outcome(measured=max(abs(rate - cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps)) for step, rate in enumerate(torch_rates)))


# --- clipping ------------------------------------------------------------------------------


def _model_with_gradients(seed: int, gradient_scale: float) -> Cruncher:
    model = _cruncher(seed)
    (x, y), = _regression_batches(seed, 1, 4, 8)
    (gradient_scale * F.mse_loss(model(x), y)).backward()
    return model


def _torch_total_norm(model: nn.Module) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()])))  # type: ignore[arg-type]


@check("train.clipped_norm_fraction", quantities=("norm_before",))
def clipped_norm_fraction(max_norm: float, gradient_scale: float, seed: int = 0) -> Outcome:
    """Global gradient norm after ``clip_grad_norm_(parameters, max_norm)``, measured with
    ``torch.linalg.vector_norm`` and divided by ``max_norm``; the norm before is a quantity."""
    model = _model_with_gradients(seed, gradient_scale)
    before = _torch_total_norm(model)
    predicted_after = clipped_grad_norm(global_grad_norm(model.parameters()), max_norm)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return Outcome(
        measured=_torch_total_norm(model) / max_norm,
        predicted=predicted_after / max_norm,
        quantities={"norm_before": before},
    )


@check("train.clip_return_value", quantities=("norm_before", "norm_after"))
def clip_return_value(max_norm: float, gradient_scale: float, seed: int = 0) -> Outcome:
    """What ``clip_grad_norm_`` returns; the global norms before and after clipping (measured
    with ``torch.linalg.vector_norm``) are quantities. resacct predicts the norm before."""
    model = _model_with_gradients(seed, gradient_scale)
    before = _torch_total_norm(model)
    predicted = global_grad_norm(model.parameters())
    returned = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    return Outcome(measured=returned, predicted=predicted, quantities={"norm_before": before, "norm_after": _torch_total_norm(model)})


@check("train.clip_below_threshold_untouched")
def clip_below_threshold_untouched(seed: int = 0) -> Outcome:
    """Whether ``clip_grad_norm_`` leaves gradients bit-identical when their norm is half of
    ``max_norm``."""
    model = _model_with_gradients(seed, 1.0)
    before = _gradients(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 2 * _torch_total_norm(model))
    return Outcome(measured=all(torch.equal(a, b) for a, b in zip(before, _gradients(model))), predicted=True)


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


@check("train.training_dtypes")
def training_dtypes(recipe: str) -> Outcome:
    """One AdamW step of a Cruncher under a precision recipe (``bf16-autocast``:
    ``torch.autocast("cpu", dtype=bfloat16)``; ``bf16-cast-model``: ``model.to(bfloat16)``);
    measures the dtypes [parameter, forward matmul outputs, backward matmul outputs, parameter
    gradient, optimizer state] that torch uses (matmuls seen by a ``TorchDispatchMode``). resacct's recipe predicts them."""
    dtypes, _, _ = _one_step_dtypes(recipe)
    return Outcome(measured=dtypes, predicted=get_recipe(recipe).as_list())


@check("train.persistent_bytes_per_parameter")
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


@check("train.saved_bytes_ratio")
def saved_bytes_ratio(recipe: str, batch_size: int = 32, dim: int = 64, num_layers: int = 4) -> Outcome:
    """Bytes autograd saves for backward (``saved_tensors_hooks``, weights' copies included) under
    the recipe's autocast, divided by the same forward in float32."""
    model = _cruncher(0, dim=dim, num_layers=num_layers)
    x = torch.randn(batch_size, dim)
    compute = getattr(torch, get_recipe(recipe).computes_in)
    mixed = _saved_activation_bytes(model, x, autocast_dtype=compute, include_weights=True)
    full = _saved_activation_bytes(model, x, include_weights=True)
    return Outcome(measured=mixed / full, predicted=saved_activation_bytes_ratio(recipe))


@check("train.cuda_amp_entry_point")
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


@check("train.fp16_gradient_kept_fraction")
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


@check("train.grad_scaler_dynamics")
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
