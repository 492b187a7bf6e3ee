"""Measuring tensor memory, strides, views and copies with torch."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import strategies as st

from resacct.facts.dtypes import parse_dtype
from resacct.harness.registry import Outcome, check
from resacct.harness.strategies import strategy
from resacct.measurement.tensors import (
    contiguous_strides,
    element_offset,
    makes_view,
    numel,
    shares_storage,
    storage_bytes,
    tensor_bytes,
)


@strategy("index_fraction")
def _index_fractions() -> st.SearchStrategy:
    return st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@check("tensors.storage_bytes", evidence="measured", quantities=("numel", "element_size"))
def storage_bytes_of_new_tensor(shape: list, dtype: str, device: str = "cpu") -> Outcome:
    """Bytes of the storage behind a new tensor (``untyped_storage().nbytes()``), with its
    ``numel()`` and ``element_size()`` as quantities. ``device: meta`` allocates nothing."""
    tensor = torch.empty(tuple(shape), dtype=parse_dtype(dtype), device=device)
    return Outcome(
        measured=storage_bytes(tensor),
        predicted=tensor_bytes(shape, dtype),
        quantities={"numel": tensor.numel(), "element_size": tensor.element_size()},
    )


@check("tensors.numel", evidence="measured")
def numel_of_new_tensor(shape: list) -> Outcome:
    """``numel()`` of a tensor of ``shape`` (on the meta device: nothing is allocated)."""
    return Outcome(measured=torch.empty(tuple(shape), device="meta").numel(), predicted=numel(shape))


@check("tensors.strides", evidence="measured")
def strides_of_new_tensor(d0: int, d1: int | None = None, d2: int | None = None, d3: int | None = None) -> Outcome:
    """``stride()`` of a new (contiguous) tensor of shape (d0[, d1[, d2[, d3]]])."""
    shape = [dim for dim in (d0, d1, d2, d3) if dim is not None]
    return Outcome(measured=list(torch.empty(tuple(shape), device="meta").stride()), predicted=list(contiguous_strides(shape)))


@check("tensors.transposed_strides", evidence="measured", quantities=("original",))
def transposed_strides(rows: int, cols: int) -> Outcome:
    """``stride()`` of ``x.transpose(0, 1)`` for a contiguous rows×cols ``x``."""
    x = torch.empty(rows, cols, device="meta")
    return Outcome(
        measured=list(x.transpose(0, 1).stride()),
        predicted=list(reversed(contiguous_strides((rows, cols)))),
        quantities={"original": list(x.stride())},
    )


@check("tensors.element_offset", evidence="measured", quantities=("row", "col", "stride0", "stride1", "storage_offset"))
def element_offset_in_storage(rows: int, cols: int, row_fraction: float, col_fraction: float, layout: str = "contiguous") -> Outcome:
    """Where element (row, col) lives in storage, measured by filling the storage with 0, 1, 2 …
    and reading the element back. ``layout``: contiguous, transposed (a ``.t()`` view) or
    sliced (``base[1:, 1:]`` of a larger tensor)."""
    row, col = int(row_fraction * rows), int(col_fraction * cols)
    if layout == "contiguous":
        x = torch.arange(rows * cols).view(rows, cols)
    elif layout == "transposed":
        x = torch.arange(rows * cols).view(cols, rows).t()
    elif layout == "sliced":
        x = torch.arange((rows + 1) * (cols + 1)).view(rows + 1, cols + 1)[1:, 1:]
    else:
        raise ValueError(f"layout {layout!r}: expected contiguous, transposed or sliced")
    stride0, stride1 = x.stride()
    return Outcome(
        measured=int(x[row, col].item()),
        predicted=element_offset((row, col), (stride0, stride1), x.storage_offset()),
        quantities={"row": row, "col": col, "stride0": stride0, "stride1": stride1, "storage_offset": x.storage_offset()},
    )


_OPERATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "row": lambda x: x[0],
    "column": lambda x: x[:, 1],
    "view": lambda x: x.view(x.shape[1], x.shape[0]),
    "transpose": lambda x: x.transpose(0, 1),
    "reshape_contiguous": lambda x: x.reshape(-1),
    "reshape_transposed": lambda x: x.t().reshape(-1),
    "contiguous_of_contiguous": lambda x: x.contiguous(),
    "contiguous_of_transposed": lambda x: x.t().contiguous(),
    "add": lambda x: x + x,
    "relu": torch.relu,
    "pow": lambda x: x.pow(2),
    "flatten_contiguous": lambda x: x.flatten(),
}


@check("tensors.shares_storage", evidence="measured")
def operation_shares_storage(operation: str, rows: int = 2, cols: int = 3) -> Outcome:
    """Whether the result of ``operation`` on a rows×cols tensor shares its input's storage."""
    x = torch.randn(rows, max(cols, 2))
    result = _OPERATIONS[operation](x)
    return Outcome(measured=shares_storage(x, result), predicted=makes_view(operation))


@check("tensors.mutation_visible", evidence="measured")
def mutation_visible(operation: str) -> Outcome:
    """After ``y = operation(x)``, does writing ``x[0, 0] = 100`` change what ``y`` holds?"""
    x = torch.tensor([[1.0, 2, 3], [4, 5, 6]])
    y = _OPERATIONS[operation](x)
    before = y.clone()
    x[0, 0] = 100
    return Outcome(measured=not torch.equal(before, y), predicted=makes_view(operation))


@check("tensors.new_storage_bytes", evidence="measured", quantities=("numel", "element_size"))
def new_storage_bytes(operation: str, shape: list, dtype: str = "float32") -> Outcome:
    """Bytes of new storage the result of ``operation`` brings (0 when it is a view), with the
    result's ``numel()`` and ``element_size()`` as quantities."""
    x = torch.ones(tuple(shape), dtype=parse_dtype(dtype))
    if len(shape) < 2:
        x = x.view(1, -1)
    result = _OPERATIONS[operation](x)
    measured = 0 if shares_storage(x, result) else storage_bytes(result)
    predicted = 0 if makes_view(operation) else tensor_bytes(list(result.shape), dtype)
    return Outcome(measured=measured, predicted=predicted, quantities={"numel": result.numel(), "element_size": result.element_size()})


@strategy("matrix_shape")
def _matrix_shapes() -> st.SearchStrategy:
    return st.lists(st.integers(2, 16), min_size=2, max_size=2)


_INDEX_EXPRESSIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "x[:, 1, :]": lambda x: x[:, 1, :],
    "x[:, 1]": lambda x: x[:, 1],
    "x[0]": lambda x: x[0],
}


@check("tensors.index_is_view", evidence="measured")
def index_is_view(expression: str) -> Outcome:
    """Whether indexing ``x = torch.arange(6).view(2, 3)`` with ``expression`` gives a view of x;
    if torch refuses the expression, the measurement is its error message."""
    x = torch.arange(6).view(2, 3)
    try:
        result = _INDEX_EXPRESSIONS[expression](x)
    except IndexError as error:
        return Outcome(measured=f"IndexError: {error}")
    return Outcome(measured=shares_storage(x, result))


@check("tensors.is_contiguous", evidence="measured")
def is_contiguous(operation: str, rows: int = 2, cols: int = 3) -> Outcome:
    """``is_contiguous()`` of the result of ``operation`` on a rows×cols tensor."""
    result = _OPERATIONS[operation](torch.empty(rows, cols))
    predicted = list(result.stride()) == list(contiguous_strides(tuple(result.shape))) or result.numel() <= 1
    return Outcome(measured=result.is_contiguous(), predicted=predicted)


@check("tensors.view_of_transposed", evidence="measured")
def view_of_transposed(rows: int = 2, cols: int = 3) -> Outcome:
    """``x.transpose(1, 0).view(rows, cols)``: raises for a non-contiguous transpose."""
    x = torch.arange(rows * cols).view(rows, cols)
    y = x.transpose(1, 0).view(rows, cols)
    return Outcome(measured=y.tolist())


@check("tensors.values_after", evidence="measured")
def values_after(expression: str) -> Outcome:
    """The values (``tolist()``) a small expression from the lecture notes produces.

    Expressions are picked by name, never evaluated from the spec."""
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    results = {
        "x[0]": lambda: x[0],
        "x[:, 1]": lambda: x[:, 1],
        "x.view(3, 2)": lambda: x.view(3, 2),
        "x.transpose(1, 0)": lambda: x.transpose(1, 0),
        "arange(6).view(2,3)[:, 1, :]": lambda: torch.arange(6).view(2, 3)[:, 1, :],
        "arange(12).reshape(3, 4).stride()": lambda: torch.tensor(torch.arange(12).reshape(3, 4).stride()),
        "4x4 strides": lambda: torch.tensor(torch.arange(16).view(4, 4).stride()),
    }
    return Outcome(measured=results[expression]().tolist())
