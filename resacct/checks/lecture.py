"""Measuring the lecture's own code: its tensor expressions, its asserts and its helpers.

The expressions and asserts are those of ``lecture_02.py`` (CS336 2025, and 2024 where it
differs), picked by their source text — never evaluated from the spec. Helpers are resacct's
faithful copies in :mod:`resacct.training.lecture`; what they return is the measurement, and the
ground truth a claim compares with comes from torch itself (storage, finfo) or a datasheet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, reduce
from torch import nn

from resacct.checks.hardware import raw_peak_flops_per_sec
from resacct.facts.dtypes import parse_dtype
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.training.lecture import FACTS_2024, FACTS_2025, get_device, get_memory_usage, get_promised_flop_per_sec, same_storage


def _ints() -> torch.Tensor:
    return torch.tensor([1, 4, 9])  # tensor_elementwise, L280


def _matrix() -> torch.Tensor:
    return torch.tensor([[1.0, 2, 3], [4, 5, 6]])  # tensors_basics L93, tensor_slicing L231


def _per_head() -> torch.Tensor:
    x = rearrange(torch.ones(2, 3, 8), "... (heads hidden1) -> ... heads hidden1", heads=2)  # L385
    return einsum(x, torch.ones(4, 4), "... hidden1, hidden1 hidden2 -> ... hidden2")  # L388


# Source text → the tensor it produces (lecture_02.py 2025 unless marked 2024).
_EXPRESSIONS: dict[str, Callable[[], Any]] = {
    "torch.tensor([[1., 2, 3], [4, 5, 6]])": _matrix,
    "torch.zeros(4, 8)": lambda: torch.zeros(4, 8),
    "torch.ones(4, 8)": lambda: torch.ones(4, 8),
    "torch.randn(4096, 8)": lambda: torch.randn(4096, 8, generator=torch.Generator().manual_seed(0)),
    "x.pow(2)": lambda: _ints().pow(2),
    "x.sqrt()": lambda: _ints().sqrt(),
    "x.rsqrt()": lambda: _ints().rsqrt(),
    "x + x": lambda: _ints() + _ints(),
    "x * 2": lambda: _ints() * 2,
    "x / 0.5": lambda: _ints() / 0.5,
    "x / 2": lambda: _ints() / 2,
    "torch.ones(3, 3).triu()": lambda: torch.ones(3, 3).triu(),
    "x.transpose(1, 0).contiguous().view(2, 3)": lambda: _matrix().transpose(1, 0).contiguous().view(2, 3),
    "x @ y.transpose(-2, -1)": lambda: torch.ones(2, 2, 3) @ torch.ones(2, 2, 3).transpose(-2, -1),
    "einsum(x, y, 'batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2')":
        lambda: einsum(torch.ones(2, 3, 4), torch.ones(2, 3, 4), "batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2"),
    "x.mean(dim=-1)": lambda: torch.ones(2, 3, 4).mean(dim=-1),
    "reduce(x, '... hidden -> ...', 'sum')": lambda: reduce(torch.ones(2, 3, 4), "... hidden -> ...", "sum"),
    "rearrange(x, '... (heads hidden1) -> ... heads hidden1', heads=2)":
        lambda: rearrange(torch.ones(2, 3, 8), "... (heads hidden1) -> ... heads hidden1", heads=2),
    "einsum(x, w, '... hidden1, hidden1 hidden2 -> ... hidden2')": _per_head,
    "rearrange(x, '... heads hidden2 -> ... (heads hidden2)')": lambda: rearrange(_per_head(), "... heads hidden2 -> ... (heads hidden2)"),
    # 2024 only
    "torch.zeros(16, 32)": lambda: torch.zeros(16, 32),
    "torch.mean(x)": lambda: torch.mean(_matrix()),
    "torch.mean(x, dim=1)": lambda: torch.mean(_matrix(), dim=1),
    "torch.var(torch.tensor([-10., 10]))": lambda: torch.var(torch.tensor([-10.0, 10])),
    "torch.var(torch.tensor([-10., 10]), correction=0)": lambda: torch.var(torch.tensor([-10.0, 10]), correction=0),
    "torch.stack([x, x], dim=0)": lambda: torch.stack([_matrix(), _matrix()], dim=0),
    "torch.cat([x, x], dim=1)": lambda: torch.cat([_matrix().long(), _matrix().long()], dim=1),
    "torch.unsqueeze(x, dim=0)": lambda: torch.unsqueeze(torch.tensor([1, 2, 3]), dim=0),
    "torch.squeeze(torch.unsqueeze(x, dim=0))": lambda: torch.squeeze(torch.unsqueeze(torch.tensor([1, 2, 3]), dim=0)),
    "torch.ones(4, 4, 16, 32) @ torch.ones(32, 16)": lambda: torch.ones(4, 4, 16, 32) @ torch.ones(32, 16),
    "x.stride()": lambda: torch.tensor(_matrix().stride()),
}


@check("lecture.tensor", evidence="measured")
def tensor_of_expression(expression: str, field: str = "values") -> Outcome:
    """What a tensor expression of the lecture's code produces, by ``field``: ``values``
    (``tolist()``, up to 2-D), ``shape``, ``dtype`` (name), ``unique`` (sorted distinct values),
    ``mean`` or ``std``."""
    if expression not in _EXPRESSIONS:
        raise ValueError(f"expression {expression!r}: expected one of {', '.join(_EXPRESSIONS)}")
    result = _EXPRESSIONS[expression]()
    fields: dict[str, Callable[[], Any]] = {
        "values": result.tolist,
        "shape": lambda: list(result.shape),
        "dtype": lambda: str(result.dtype).removeprefix("torch."),
        "unique": lambda: torch.unique(result).tolist(),
        "mean": lambda: float(result.float().mean()),
        "std": lambda: float(result.float().std()),
    }
    return Outcome(measured=fields[field]())


def _raises_view_error() -> bool:
    try:
        _matrix().transpose(1, 0).view(2, 3)
    except RuntimeError as error:
        return "view size is not compatible with input tensor's size and stride" in str(error)
    return False


def _gradients_basics(before_backward: bool) -> dict[str, Any]:
    x = torch.tensor([1.0, 2, 3])
    w = torch.tensor([1.0, 1, 1], requires_grad=True)
    pred_y = x @ w
    loss = 0.5 * (pred_y - 5).pow(2)
    if before_backward:
        return {"x.requires_grad": x.requires_grad, "w.grad": w.grad}
    loss.backward()
    return {"w.grad": w.grad}


def _tensor_split_roundtrip() -> bool:
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    list_x = [x, x, x]
    roundtrip_list_x = torch.tensor_split(torch.cat(list_x, dim=1), 3, dim=1)
    return all(torch.equal(a, b) for a, b in zip(list_x, roundtrip_list_x))


def _parameter_data_is_tensor() -> bool:
    w = nn.Parameter(torch.randn(16384, 32))
    return isinstance(w, torch.Tensor) and type(w.data) == torch.Tensor  # noqa: E721 — the lecture's own test


# The lecture's asserts, verbatim; True when the assert passes on the installed torch.
_ASSERTS: dict[str, Callable[[], bool]] = {
    "torch.equal(x.pow(2), torch.tensor([1, 16, 81]))": lambda: torch.equal(_ints().pow(2), torch.tensor([1, 16, 81])),
    "torch.equal(x.sqrt(), torch.tensor([1, 2, 3]))": lambda: torch.equal(_ints().sqrt(), torch.tensor([1, 2, 3])),
    "torch.equal(x.rsqrt(), torch.tensor([1, 1 / 2, 1 / 3]))": lambda: torch.equal(_ints().rsqrt(), torch.tensor([1, 1 / 2, 1 / 3])),
    "torch.equal(x + x, torch.tensor([2, 8, 18]))": lambda: torch.equal(_ints() + _ints(), torch.tensor([2, 8, 18])),
    "torch.equal(x * 2, torch.tensor([2, 8, 18]))": lambda: torch.equal(_ints() * 2, torch.tensor([2, 8, 18])),
    "torch.equal(x / 0.5, torch.tensor([2, 8, 18]))": lambda: torch.equal(_ints() / 0.5, torch.tensor([2, 8, 18])),
    "torch.equal(x / 2, torch.tensor([0.5, 2, 4.5]))": lambda: torch.equal(_ints() / 2, torch.tensor([0.5, 2, 4.5])),
    "torch.equal(torch.ones(3, 3).triu(), [[1, 1, 1], [0, 1, 1], [0, 0, 1]])":
        lambda: torch.equal(torch.ones(3, 3).triu(), torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 1]])),
    "torch.equal(x[0], torch.tensor([1., 2, 3]))": lambda: torch.equal(_matrix()[0], torch.tensor([1.0, 2, 3])),
    "torch.equal(x[:, 1], torch.tensor([2, 5]))": lambda: torch.equal(_matrix()[:, 1], torch.tensor([2, 5])),
    "y.view(2, 3) raises 'view size is not compatible with input tensor's size and stride'": _raises_view_error,
    "not same_storage(x, x.transpose(1, 0).contiguous().view(2, 3))":
        lambda: not same_storage(_matrix(), _matrix().transpose(1, 0).contiguous().view(2, 3)),
    "isinstance(w, torch.Tensor) and type(w.data) == torch.Tensor": _parameter_data_is_tensor,
    "(nn.Parameter(torch.randn(input_dim)) @ w).size() == torch.Size([output_dim])":
        lambda: (nn.Parameter(torch.randn(16384)) @ nn.Parameter(torch.randn(16384, 32))).size() == torch.Size([32]),
    "torch.equal(w.grad, torch.tensor([1, 2, 3]))": lambda: torch.equal(_gradients_basics(False)["w.grad"], torch.tensor([1, 2, 3])),
    # 2024 only
    "x.requires_grad == False": lambda: _gradients_basics(True)["x.requires_grad"] is False,
    "w.grad is None (before backward)": lambda: _gradients_basics(True)["w.grad"] is None,
    "torch.equal(torch.mean(x), torch.tensor(3.5))": lambda: torch.equal(torch.mean(_matrix()), torch.tensor(3.5)),
    "torch.equal(torch.mean(x, dim=1), torch.tensor([2, 5]))": lambda: torch.equal(torch.mean(_matrix(), dim=1), torch.tensor([2, 5])),
    "torch.equal(torch.var(torch.tensor([-10., 10])), torch.tensor(200))":
        lambda: torch.equal(torch.var(torch.tensor([-10.0, 10])), torch.tensor(200)),
    "torch.equal(torch.stack([x, x], dim=0), [[[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]])":
        lambda: torch.equal(torch.stack([_matrix(), _matrix()], dim=0), torch.tensor([[[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]])),
    "torch.equal(torch.cat([x, x], dim=1), [[1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6]])":
        lambda: torch.equal(torch.cat([_matrix().long()] * 2, dim=1), torch.tensor([[1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6]])),
    "all(torch.equal(a, b) for a, b in zip(list_x, roundtrip_list_x))": _tensor_split_roundtrip,
    "torch.equal(torch.unsqueeze(x, dim=0), torch.tensor([[1, 2, 3]]))":
        lambda: torch.equal(torch.unsqueeze(torch.tensor([1, 2, 3]), dim=0), torch.tensor([[1, 2, 3]])),
    "torch.equal(torch.squeeze(torch.unsqueeze(x, dim=0)), x)":
        lambda: torch.equal(torch.squeeze(torch.unsqueeze(torch.tensor([1, 2, 3]), dim=0)), torch.tensor([1, 2, 3])),
}


@check("lecture.assert_passes", evidence="measured")
def assert_passes(assertion: str) -> Outcome:
    """Whether one of the lecture's asserts (picked by its source text) passes on this torch."""
    if assertion not in _ASSERTS:
        raise ValueError(f"assertion {assertion!r}: expected one of {', '.join(_ASSERTS)}")
    return Outcome(measured=bool(_ASSERTS[assertion]()))


# ─────────────────────────────── same_storage / get_memory_usage ───────────────────────────────

_PAIRS: dict[str, Callable[[], tuple[torch.Tensor, torch.Tensor]]] = {
    "x, x[0]": lambda: (lambda x: (x, x[0]))(_matrix()),
    "x, x[1]": lambda: (lambda x: (x, x[1]))(_matrix()),
    "x, x[:, 1]": lambda: (lambda x: (x, x[:, 1]))(_matrix()),
    "x, x.view(3, 2)": lambda: (lambda x: (x, x.view(3, 2)))(_matrix()),
    "x, x.transpose(1, 0)": lambda: (lambda x: (x, x.transpose(1, 0)))(_matrix()),
    "x, x.reshape(3, 2)": lambda: (lambda x: (x, x.reshape(3, 2)))(_matrix()),
    "x, x.transpose(1, 0).reshape(6)": lambda: (lambda x: (x, x.transpose(1, 0).reshape(6)))(_matrix()),
    "torch.empty(0), torch.empty(0)": lambda: (torch.empty(0), torch.empty(0)),
    "torch.empty(3, device='meta') twice": lambda: (torch.empty(3, device="meta"), torch.empty(3, device="meta")),
}


@check("lecture.same_storage", evidence="measured", quantities=("writes_through",))
def same_storage_helper(pair: str) -> Outcome:
    """The lecture's ``same_storage(a, b)`` for a named pair, as 1 (True) or 0; quantity
    ``writes_through``: 1 when writing 100 into every element of ``a`` changes ``b``, else 0 (also
    for pairs with no element to write)."""
    a, b = _PAIRS[pair]()
    try:
        answer = same_storage(a, b)
    except RuntimeError as error:  # older torch refuses data_ptr() of some storages (meta)
        raise NotMeasurable(f"torch {torch.__version__} refuses same_storage here: {error}") from None
    writes_through = False
    if a.numel() and b.numel() and a.device.type != "meta":
        before = b.clone()
        a.fill_(100)
        writes_through = not torch.equal(before, b)
    return Outcome(measured=int(answer), quantities={"writes_through": int(writes_through)})


_MEMORY_SUBJECTS: dict[str, Callable[[list], torch.Tensor]] = {
    "new": lambda shape: torch.zeros(tuple(shape)),
    "expand": lambda shape: torch.zeros(1, shape[-1]).expand(tuple(shape)),
    "row": lambda shape: torch.zeros(tuple(shape))[0],
}


@check("lecture.memory_usage", evidence="measured", quantities=("storage_bytes",))
def memory_usage_helper(shape: list, subject: str = "new") -> Outcome:
    """The lecture's ``get_memory_usage`` of a float32 tensor of ``shape`` (``new``), of an
    ``expand`` of one row to that shape, or of row 0 of it; quantity: the bytes of the storage
    behind it (``untyped_storage().nbytes()``)."""
    tensor = _MEMORY_SUBJECTS[subject](shape)
    return Outcome(measured=get_memory_usage(tensor), quantities={"storage_bytes": tensor.untyped_storage().nbytes()})


# ─────────────────────────────── get_promised_flop_per_sec ───────────────────────────────


@check("lecture.promised_flop_per_sec", evidence="arithmetic")
def promised_flop_per_sec(dtype: str, device_name: str = "") -> Outcome:
    """The lecture's peak lookup for a device name as ``torch.cuda.get_device_properties`` reports
    it ("" = no CUDA device). Its ValueError for an unknown device or dtype is the measurement."""
    return Outcome(measured=get_promised_flop_per_sec(device_name or None, parse_dtype(dtype)))


@check("lecture.promised_over_datasheet", evidence="arithmetic", quantities=("lookup_flops_per_sec", "datasheet_flops_per_sec"))
def promised_over_datasheet(device_name: str, dtype: str, board: str, table_dtype: str, sparse: bool = False) -> Outcome:
    """The lookup's answer for ``device_name`` ÷ the dense (or 2:4-sparse) peak the datasheet
    prints for ``board`` (``resacct/facts/datasheets/accelerators.yaml``); when the lookup raises, its
    error line is the measurement."""
    datasheet = raw_peak_flops_per_sec(board, table_dtype, sparse)
    try:
        lookup = float(get_promised_flop_per_sec(device_name, parse_dtype(dtype)))
    except ValueError as error:
        return Outcome(measured=f"ValueError: {error}", quantities={"lookup_flops_per_sec": 0.0, "datasheet_flops_per_sec": datasheet})
    return Outcome(measured=lookup / datasheet, quantities={"lookup_flops_per_sec": lookup, "datasheet_flops_per_sec": datasheet})


@check("lecture.facts_over_datasheet", evidence="arithmetic", quantities=("fact_flops_per_sec", "datasheet_flops_per_sec"))
def facts_over_datasheet(year: int, fact: str, board: str, table_dtype: str, sparse: bool = False) -> Outcome:
    """A ``facts.py`` constant of that year's lecture ÷ the datasheet peak of ``board``."""
    facts = {2024: FACTS_2024, 2025: FACTS_2025}[year]
    datasheet = raw_peak_flops_per_sec(board, table_dtype, sparse)
    return Outcome(measured=facts[fact] / datasheet, quantities={"fact_flops_per_sec": facts[fact], "datasheet_flops_per_sec": datasheet})


@check("lecture.datasheet_ratio", evidence="arithmetic")
def datasheet_ratio(board: str, table_dtype: str, other_board: str, other_dtype: str) -> Outcome:
    """Dense datasheet peak of (board, dtype) ÷ that of (other_board, other_dtype)."""
    return Outcome(measured=raw_peak_flops_per_sec(board, table_dtype) / raw_peak_flops_per_sec(other_board, other_dtype))


# ─────────────────────────────── fp8 formats ───────────────────────────────


def _float_dtype(dtype: str) -> torch.dtype:
    found = getattr(torch, dtype, None)
    if not isinstance(found, torch.dtype):
        raise NotMeasurable(f"torch {torch.__version__} has no torch.{dtype}")
    return found


@check("lecture.finfo", evidence="measured")
def finfo_field(dtype: str, field: str) -> Outcome:
    """A field of ``torch.finfo(torch.<dtype>)`` (the lecture's float32_info … and the fp8 formats):
    ``max``, ``min``, ``eps``, ``tiny`` (smallest normal) or ``resolution``."""
    if field not in ("max", "min", "eps", "tiny", "resolution"):
        raise ValueError(f"field {field!r}: expected max, min, eps, tiny or resolution")
    return Outcome(measured=float(getattr(torch.finfo(_float_dtype(dtype)), field)))


@check("lecture.e4m3_variants", evidence="measured")
def e4m3_variants() -> Outcome:
    """The largest finite value of every E4M3 dtype torch ships (float8_e4m3*), sorted by name."""
    names = sorted(name for name in dir(torch) if name.startswith("float8_e4m3") and isinstance(getattr(torch, name), torch.dtype))
    return Outcome(measured=[float(torch.finfo(getattr(torch, name)).max) for name in names])


# ─────────────────────────────── causal mask ───────────────────────────────


@check("lecture.triu_mask_attention", evidence="measured")
def triu_mask_attention(mask_layout: str, size: int = 4) -> Outcome:
    """Largest |difference| between F.scaled_dot_product_attention(is_causal=True) and attention
    whose scores[query, key] are masked with ``ones(size, size).triu()`` (``as_scores``) or with
    its transpose (``transposed``: M[i, j] read as i's contribution to j)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, size, 8, generator=generator) for _ in range(3))
    mask = torch.ones(size, size).triu()
    mask = {"as_scores": mask, "transposed": mask.T}[mask_layout].bool()
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return Outcome(measured=float((causal - masked).abs().max()))


# ─────────────────────────────── this machine's device (get_device, tensors_on_gpus) ───────────────────────────────


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise NotMeasurable("needs a CUDA GPU (torch.cuda.is_available() is False)")


@check("lecture.gpu_total_memory_bytes", evidence="measured")
def gpu_total_memory_bytes(name_contains: str = "") -> Outcome:
    """``torch.cuda.get_device_properties(0).total_memory`` (tensors_on_gpus, L176-178); skipped
    unless the device name contains ``name_contains``."""
    _require_cuda()
    properties = torch.cuda.get_device_properties(0)
    if name_contains not in properties.name:
        raise NotMeasurable(f"about a GPU named *{name_contains}*; this one is {properties.name}")
    return Outcome(measured=int(properties.total_memory))


@check("lecture.gpu_allocated_bytes", evidence="measured")
def gpu_allocated_bytes(elements: int) -> Outcome:
    """Growth of ``torch.cuda.memory_allocated()`` for one float32 tensor of ``elements``."""
    _require_cuda()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    tensor = torch.zeros(elements, device="cuda:0")
    grown = torch.cuda.memory_allocated() - before
    del tensor
    return Outcome(measured=int(grown))


@check("lecture.get_device", evidence="measured")
def get_device_name(needs: str = "any") -> Outcome:
    """What the lecture's ``get_device()`` picks here (L980-985): ``cuda:0`` if CUDA is available,
    else ``cpu``. ``needs: cpu`` / ``cuda`` skips the claim on the other kind of machine."""
    if needs == "cuda":
        _require_cuda()
    if needs == "cpu" and torch.cuda.is_available():
        raise NotMeasurable("about a machine without CUDA; this one has a GPU")
    return Outcome(measured=str(get_device()))
