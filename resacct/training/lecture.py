"""The lecture's own code (CS336 lecture 2, ``lecture_02.py``), reproduced faithfully — latent bugs kept.

Sources: ``stanford-cs336/spring2025-lectures`` at bbdbc9c (``lecture_02.py``, ``facts.py``) and
``stanford-cs336/spring2024-lectures`` at 7373ffb. Each function names the lines it reproduces.
These are *specimens*, not resacct's answers: claims run them to show what the lecture's code
does (a lookup that returns ``1`` without CUDA, a ``train`` that ignores ``lr`` and
``num_layers``, a ``get_batch`` that never draws the last window …). The only changes: a
device name can be passed in instead of asking CUDA, and ``text()``/``note()`` calls are dropped.

>>> get_num_parameters(LectureCruncher(dim=64, num_layers=2)) == 64 * 64 * 2 + 64
True
>>> get_promised_flop_per_sec("NVIDIA H100 80GB HBM3", torch.bfloat16)
989500000000000.0
>>> get_promised_flop_per_sec(None, torch.float32)  # no CUDA: the lecture returns 1
1
"""

from __future__ import annotations

import timeit
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Integer, Shaped
from torch import nn

__all__ = [
    "FACTS_2024",
    "FACTS_2025",
    "LectureAdaGrad",
    "LectureCruncher",
    "LectureLinear",
    "LectureSGD",
    "get_batch",
    "get_device",
    "get_memory_usage",
    "get_num_parameters",
    "get_promised_flop_per_sec",
    "lecture_optimizer_demo",
    "linear_regression_batch",
    "same_storage",
    "time_matmul",
    "train",
]

# facts.py of each year, verbatim values.
FACTS_2025 = {"a100_flop_per_sec": 312e12, "h100_flop_per_sec": 1979e12 / 2}
FACTS_2024 = {"a100_flop_per_sec": 312e12, "h100_flop_per_sec": 989e12}


def get_memory_usage(x: Shaped[torch.Tensor, "..."]) -> int:
    """lecture_02.py (2025) get_memory_usage, L921-922: ``numel × element_size`` of the tensor
    (not of its storage: a view or an ``expand`` is counted as if it owned its elements)."""
    return x.numel() * x.element_size()


def get_promised_flop_per_sec(device_name: str | None, dtype: torch.dtype) -> float:
    """lecture_02.py (2025) get_promised_flop_per_sec, L925-948 (2024: L930-953, identical).

    ``device_name`` stands for ``torch.cuda.get_device_properties(device).name``; ``None`` means
    ``torch.cuda.is_available()`` is False, where the lecture returns the integer ``1``.
    Substring matching, as in the lecture: any name containing "A100" or "H100" matches.
    """
    if device_name is None:
        return 1
    if "A100" in device_name:
        if dtype == torch.float32:
            return 19.5e12
        if dtype in (torch.bfloat16, torch.float16):
            return 312e12
        raise ValueError(f"Unknown dtype: {dtype}")
    if "H100" in device_name:
        if dtype == torch.float32:
            return 67.5e12
        if dtype in (torch.bfloat16, torch.float16):
            return 1979e12 / 2  # 1979 is for sparse, dense is half of that
        raise ValueError(f"Unknown dtype: {dtype}")
    raise ValueError(f"Unknown device: {device_name}")


def same_storage(x: Shaped[torch.Tensor, "..."], y: Shaped[torch.Tensor, "..."]) -> bool:
    """lecture_02.py (2025) same_storage, L951-952: equal ``untyped_storage().data_ptr()``."""
    return x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def time_matmul(a: Shaped[torch.Tensor, "*batch m k"], b: Shaped[torch.Tensor, "k n"]) -> float:
    """lecture_02.py (2025) time_matmul, L955-974: ``timeit`` of ``a @ b`` five times, mean
    seconds per call, CUDA synchronised before and after each call, no warm-up."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()

    def run() -> None:
        a @ b
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    num_trials = 5
    total_time = timeit.timeit(run, number=num_trials)
    return total_time / num_trials


def get_num_parameters(model: nn.Module) -> int:
    """lecture_02.py (2025) get_num_parameters, L977-978."""
    return sum(param.numel() for param in model.parameters())


def get_device(index: int = 0) -> torch.device:
    """lecture_02.py (2025) get_device, L980-985: ``cuda:{index}`` if CUDA is available, else cpu."""
    if torch.cuda.is_available():
        return torch.device(f"cuda:{index}")
    return torch.device("cpu")


class LectureLinear(nn.Module):
    """lecture_02.py (2025) Linear, L638-645: a weight (in, out) ~ N(0, 1/in), no bias."""

    def __init__(self, input_dim: int, output_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(input_dim, output_dim) / np.sqrt(input_dim))

    def forward(self, x: Float[torch.Tensor, "*batch input_dim"]) -> Float[torch.Tensor, "*batch output_dim"]:
        return x @ self.weight


class LectureCruncher(nn.Module):
    """lecture_02.py (2025) Cruncher, L648-671: ``num_layers`` bias-free D×D layers, a D×1 final,
    and the last dimension squeezed away (output shape ``[B]``)."""

    def __init__(self, dim: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList([LectureLinear(dim, dim) for _ in range(num_layers)])
        self.final = LectureLinear(dim, 1)
        self.final_shapes: list[tuple[int, ...]] = []  # x.size() at the lecture's two asserts

    def forward(self, x: Float[torch.Tensor, "batch dim"]) -> Float[torch.Tensor, " batch"]:
        B, D = x.size()
        for layer in self.layers:
            x = layer(x)
        x = self.final(x)
        self.final_shapes = [tuple(x.size())]
        assert x.size() == torch.Size([B, 1])
        x = x.squeeze(-1)
        self.final_shapes.append(tuple(x.size()))
        assert x.size() == torch.Size([B])
        return x


def get_batch(data: np.ndarray, batch_size: int, sequence_length: int, device: str) -> Integer[torch.Tensor, "batch_size sequence_length"]:
    """lecture_02.py (2025) get_batch, L674-699: inputs only (no targets); starts drawn from
    ``randint(len(data) - sequence_length)``; a tensor built from a list of numpy slices."""
    start_indices = torch.randint(len(data) - sequence_length, (batch_size,))
    assert start_indices.size() == torch.Size([batch_size])
    x = torch.tensor([data[start:start + sequence_length] for start in start_indices])
    assert x.size() == torch.Size([batch_size, sequence_length])
    if torch.cuda.is_available():
        x = x.pin_memory()
    x = x.to(device, non_blocking=True)
    return x


class LectureSGD(torch.optim.Optimizer):
    """lecture_02.py (2025) SGD, L742-751: ``p.data -= lr * grad`` for every parameter."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 0.01):
        super().__init__(params, dict(lr=lr))

    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr = group["lr"]
            for p in group["params"]:
                grad = p.grad.data
                p.data -= lr * grad


class LectureAdaGrad(torch.optim.Optimizer):
    """lecture_02.py (2025) AdaGrad, L754-774: ``g2 += grad²``; ``p -= lr · grad / √(g2 + 1e-5)``."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 0.01):
        super().__init__(params, dict(lr=lr))

    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr = group["lr"]
            for p in group["params"]:
                state = self.state[p]
                grad = p.grad.data
                g2 = state.get("g2", torch.zeros_like(grad))
                g2 += torch.square(grad)
                state["g2"] = g2
                p.data -= lr * grad / torch.sqrt(g2 + 1e-5)


def lecture_optimizer_demo(seed: int = 0) -> tuple[LectureCruncher, LectureAdaGrad, dict[str, Float[torch.Tensor, "..."]], dict[str, Float[torch.Tensor, "..."]]]:
    """lecture_02.py (2025) optimizer(), L777-806: Cruncher(D=4, two layers), AdaGrad(lr=0.01),
    one MSE step on x ~ randn(2, 4), y = [4, 5]. Returns the model, the optimizer and the
    state_dict before and after the step (copies)."""
    torch.manual_seed(seed)
    B, D, num_layers = 2, 4, 2
    model = LectureCruncher(dim=D, num_layers=num_layers)
    optimizer = LectureAdaGrad(model.parameters(), lr=0.01)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    x = torch.randn(B, D)
    y = torch.tensor([4.0, 5.0])
    pred_y = model(x)
    loss = F.mse_loss(input=pred_y, target=y)
    loss.backward()
    optimizer.step()
    after = {name: value.clone() for name, value in model.state_dict().items()}
    return model, optimizer, before, after


def linear_regression_batch(B: int, D: int = 16) -> tuple[Float[torch.Tensor, "B D"], Float[torch.Tensor, " B"]]:
    """lecture_02.py (2025) train_loop's get_batch, L839-845: x ~ randn(B, D), y = x @ (0, 1, …, D−1)."""
    true_w = torch.arange(D, dtype=torch.float32)
    x = torch.randn(B, D)
    true_y = x @ true_w
    return (x, true_y)


def train(name: str, get_batch: Callable[..., tuple[Float[torch.Tensor, "B D"], Float[torch.Tensor, " B"]]], D: int, num_layers: int, B: int,
          num_train_steps: int, lr: float, *, as_in_seeds: bool = False) -> tuple[LectureCruncher, list[float]]:
    """lecture_02.py (2025) train, L854-873 (2024: L854-876 without wandb): the model is built with
    ``num_layers=0`` and the optimizer with ``lr=0.01`` whatever is passed. Returns the model
    and each step's loss (the lecture returns nothing; 2024 logged the loss to wandb).
    ``as_in_seeds``: the seeds' version of the same function (seed 003 "[02:20:00] Training
    Loop"), which passes ``num_layers`` and ``lr`` on."""
    model = LectureCruncher(dim=D, num_layers=num_layers if as_in_seeds else 0)
    optimizer = LectureSGD(model.parameters(), lr=lr if as_in_seeds else 0.01)
    losses = []
    for t in range(num_train_steps):
        x, y = get_batch(B=B)
        pred_y = model(x)
        loss = F.mse_loss(pred_y, y)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, losses
