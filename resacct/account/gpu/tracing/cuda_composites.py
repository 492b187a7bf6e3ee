"""Composite kernels whose CUDA run allocates temporaries that one op on meta tensors hides (issue 31).

A dispatch mode sees an op once: an op with a ``CompositeExplicitAutograd`` kernel (one C++ function calling other
ops) shows only its output to :class:`~resacct.account.gpu.tracing.allocation_trace.AllocationRecorder`, while on a GPU every
op inside it allocates from the caching allocator. Where those temporaries are large, the reserved peak (the
segments they make) depends on them; here such an op is run as its C++ does, each temporary tracked in order.

``aten._safe_softmax`` (sdpa's math path: grouped-query attention where the memory-efficient kernel refuses it, or
``attention="math"``). PyTorch's ``attention.cpp``::

    auto out = at::softmax(self, dim, dtype);
    const auto masked = self.isneginf();
    const auto masked_rows = all(masked, dim, true);
    const auto zero = at::scalar_tensor(0.0, ...);
    return at::where_out(out, masked_rows, zero, out);   // reuse storage for out

So a bool mask as large as the scores, its row mask and a 4-byte scalar live beside the softmax's output, freed in
reverse order, and no second output is made. The H200 record of 2026-11-30 (torch 2.11, gqa-llama/fp32/math) shows
exactly that per layer: ``alloc 268435456`` (the output), ``alloc 67108864`` (the mask), ``alloc 65536`` (the rows),
``alloc 4``, then the frees 4, 65536, 67108864. (Older PyTorch compared with a ``-inf`` scalar tensor and returned a
new ``where``: another output's bytes; the record is the evidence for the form modelled.)

sdpa's math path adds the attention mask **in place** on a GPU (``attn.add_(*attn_mask)`` in
``_scaled_dot_product_attention_math``) but out of place under any dispatch mode (``areAnyTensorSubclassLike`` is true
while a ``TorchDispatchMode`` is on: ``attn = attn.add(*attn_mask)``), so traced on meta the scores are allocated twice.
Inside :func:`sdpa_math_region` (the routing modes of :mod:`~resacct.account.gpu.tracing.cuda_step` open it around a call
that takes the math path) the recorder gives that ``add``'s output the scores' block (:func:`in_sdpa_math`): the same
record shows one 268 MB scores block per layer where the trace on meta had two.

``aten.embedding_dense_backward`` over more than 3,072 indices sorts them and sums partial segments around its output
(:mod:`~resacct.account.gpu.tracing.cuda_embedding`).

And the other way: outputs a meta kernel makes on the device that CUDA makes on the host (:func:`host_outputs`). The
memory-efficient attention's philox ``seed`` and ``offset`` are CPU scalars on a GPU outside CUDA-graph capture
(``_efficient_attention_forward``: ``at::empty({}, at::dtype(at::kLong))`` without dropout, ``at::scalar_tensor`` of
the unpacked philox state with it); its meta kernel puts them on meta. The H200 record's efficient-attention steps
show no 8-byte blocks per layer; traced on meta each layer had two.

And autograd's gradient accumulation: where two gradients meet at one input (a residual stream's two paths), the engine
(``input_buffer.cpp``'s ``accumulate``) adds the second **in place** into the first when grad mode is off, it holds the
first's last reference and its storage's, and neither is "tensor-subclass-like" — which every tensor is while a
dispatch mode is on (``isTensorSubclassLike``: ``dispatch_mode_enabled()``), so traced on meta the sum was a new
block. :func:`accumulated_in_place` tells that ``add`` apart by the reference counts the first operand shows inside a
dispatch mode when the buffer alone holds it, measured once per process on a tiny backward
(:func:`sole_buffer_counts`: a count of torch's internals, not a constant written here). The H200 record of 2026-11-30
shows it: the expandable GPT-2 step's 72 such sums (two per layer per step) allocate nothing on the board; the three
whose storage another tensor shares (the tied embedding's two gradients) do.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, no_type_check

import torch

from resacct.account.gpu.tracing.cuda_embedding import embedding_dense_backward

__all__ = ["cuda_composite", "host_outputs", "sdpa_math_region", "in_sdpa_math", "mask_added_in_place", "accumulated_in_place",
           "sole_buffer_counts", "note_accumulating_add", "measure_sole_buffer_counts"]

Track = Callable[[torch.Tensor], None]


def _safe_softmax(args: tuple, kwargs: dict, track: Track) -> torch.Tensor:
    names = ("self", "dim", "dtype")
    given = dict(zip(names, args)) | kwargs
    scores, dim, dtype = given["self"], given["dim"], given.get("dtype")
    out = torch.ops.aten.softmax.int(scores, dim, dtype)
    track(out)
    masked = torch.ops.aten.isneginf.default(scores)
    track(masked)
    masked_rows = torch.ops.aten.all.dim(masked, dim, True)
    track(masked_rows)
    zero = torch.ops.aten.scalar_tensor.default(0.0, dtype=out.dtype, device=out.device)
    track(zero)
    torch.ops.aten.where.self_out(masked_rows, zero, out, out=out)
    del zero, masked_rows, masked  # C++ destroys its locals in reverse order
    return out


def _ops(named: dict[str, Any]) -> dict[Any, Any]:
    """``named`` keyed by the aten overloads this torch has (``_safe_softmax`` arrived in 2.5)."""
    found = {}
    for name, value in named.items():
        packet, _, overload = name.partition(".")
        if hasattr(torch.ops.aten, packet):
            found[getattr(getattr(torch.ops.aten, packet), overload)] = value
    return found


_COMPOSITES: dict[Any, Callable[[tuple, dict, Track], Any]] = _ops({"_safe_softmax.default": _safe_softmax,
                                                                     "embedding_dense_backward.default": embedding_dense_backward})


def cuda_composite(func: Any) -> Callable[[tuple, dict, Track], Any] | None:
    """How CUDA runs ``func`` op by op (``(args, kwargs, track) -> out``, each temporary given to ``track`` as it is
    made), or None where one op's output is all it allocates."""
    return _COMPOSITES.get(func)


_HOST_OUTPUTS: dict[Any, tuple[int, ...]] = _ops({"_scaled_dot_product_efficient_attention.default": (2, 3)})


def host_outputs(func: Any) -> tuple[int, ...]:
    """The positions of ``func``'s outputs that CUDA makes on the host, not the device (none for most ops)."""
    return _HOST_OUTPUTS.get(func, ())


_REGION = threading.local()


@contextlib.contextmanager
def sdpa_math_region(query: torch.Tensor | None = None) -> Iterator[None]:
    """While open (on this thread), an ``F.scaled_dot_product_attention`` call runs sdpa's math path: its mask's ``add``
    is the in-place one of a GPU (:func:`in_sdpa_math`). On meta tensors sdpa chooses its math path itself; on any other
    ``query`` (the fake CPU tensors of ``shard --device``) the math backend is forced (``sdpa_kernel(MATH)``): the CPU's
    own choice, its flash kernel, never builds the scores a GPU's math path does."""
    depth = getattr(_REGION, "depth", 0)
    _REGION.depth = depth + 1
    try:
        if query is None or query.device.type == "meta":
            yield
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                yield
    finally:
        _REGION.depth = depth


def in_sdpa_math() -> bool:
    """Whether an sdpa math call is running on this thread (:func:`sdpa_math_region`)."""
    return getattr(_REGION, "depth", 0) > 0


_ADD = torch.ops.aten.add.Tensor


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def mask_added_in_place(func: Any, args: tuple, out: Any) -> bool:
    """Whether ``func`` is sdpa's math path adding the attention mask to the scores (:func:`in_sdpa_math`), which a GPU does
    in place: ``out`` then takes the scores' block, no allocation of its own."""
    if func is not _ADD or not in_sdpa_math():
        return False
    source = args[0]
    return (isinstance(out, torch.Tensor) and isinstance(source, torch.Tensor) and out.shape == source.shape and out.dtype == source.dtype
            and out.stride() == source.stride())


def _counts(tensor: torch.Tensor) -> tuple[int, int]:
    return tensor._use_count(), torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def _in_backward_without_grad() -> bool:
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1 and not torch.is_grad_enabled()


@functools.lru_cache(maxsize=1)
def sole_buffer_counts() -> tuple[int, int] | None:
    """The (tensor, storage) use counts the first operand of autograd's accumulating ``add`` shows inside a dispatch mode
    when the engine's input buffer alone holds it: measured on ``lin1(x) + lin2(x)``'s backward on meta (x's two
    gradients, each a fresh ``mm`` output, meet in its buffer). None where this torch shows no such ``add``."""

    class _Probe(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            note_accumulating_add(func, args, seen)
            return func(*args, **(kwargs or {}))

    seen: list[tuple[int, int]] = []
    return measure_sole_buffer_counts(_Probe, seen, device="meta")


def note_accumulating_add(func: Any, args: tuple, seen: list[tuple[int, int]]) -> None:
    """Append the counts of ``args[0]`` to ``seen`` where ``func`` is autograd's accumulating ``add`` (a probe's hook)."""
    if func is _ADD and _in_backward_without_grad() and len(args) > 1 and isinstance(args[1], torch.Tensor):
        seen.append(_counts(args[0]))


def measure_sole_buffer_counts(make_probe: Callable[[], Any], seen: list[tuple[int, int]], *, device: str | None = None,
                               fake: bool = False) -> tuple[int, int] | None:
    """Run ``lin1(x) + lin2(x)``'s backward under the dispatch mode ``make_probe()`` makes (it calls
    :func:`note_accumulating_add` into ``seen`` for each op) — on ``device``, under ``FakeTensorMode`` where ``fake`` (the
    probe inside it, as ``shard --device``'s tracker runs) — and return the one count it saw; None where this torch shows no
    such ``add`` or lacks the internals."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes(), torch.enable_grad(), FakeTensorMode() if fake else contextlib.nullcontext():
            first, second = torch.nn.Linear(4, 4, bias=False, device=device), torch.nn.Linear(4, 4, bias=False, device=device)
            x = torch.empty(2, 4, device=device, requires_grad=True)
            with make_probe():
                (first(x) + second(x)).sum().backward()
    except (AttributeError, RuntimeError, TypeError):  # a torch without these internals: the sums stay out of place
        return None
    return seen[0] if len(seen) == 1 else None


@no_type_check  # per accumulating add of a traced step
def _non_overlapping_and_dense(tensor: torch.Tensor) -> bool:
    """ATen's ``is_non_overlapping_and_dense`` (TensorImpl's ``compute_non_overlapping_and_dense``): its elements fill one
    block of its storage in some order of its dimensions — contiguous, or a permutation of a contiguous layout (a transposed
    gradient). torch's own Python helper for it changed its name between releases; this is its rule."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(((int(size), int(stride)) for size, stride in zip(tensor.shape, tensor.stride()) if size != 1), key=lambda pair: pair[1]):
        if stride != expected:
            return False
        expected *= size
    return True


@no_type_check  # per op of a traced step
def accumulated_in_place(func: Any, args: tuple, sole_counts: tuple[int, int] | None) -> bool:
    """Whether ``func`` (called with ``args``, before it runs) is autograd's accumulation of a second gradient into a first
    that the engine's buffer alone holds (``sole_counts``: :func:`sole_buffer_counts`, measured before the step) — on a GPU
    ``old_var.add_(var)``: the sum takes the first's block."""
    if sole_counts is None or func is not _ADD or len(args) < 2 or not _in_backward_without_grad():
        return False
    first, second = args[0], args[1]
    # input_buffer.cpp's can_accumulate_inplace: a non-overlapping, dense first gradient (a permuted one too, not only contiguous)
    if not isinstance(first, torch.Tensor) or not isinstance(second, torch.Tensor) or not _non_overlapping_and_dense(first) or first.shape != second.shape:
        return False
    return _counts(first) == sole_counts
