"""Measuring the data path: lazy memmap reads, window sampling, token dtypes, pinned memory."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from resacct.training.data import HEADER_BYTES, get_batch, read_tokens, token_file_header, window_start_count
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.training.seeding import seed_torch

__all__ = ["resident_memory_bytes", "sparse_token_file"]

_STATUS = Path("/proc/self/status")


def resident_memory_bytes() -> int:
    """This process's resident set size (``VmRSS`` of ``/proc/self/status``), in bytes."""
    if not _STATUS.exists():
        raise NotMeasurable("resident memory is read from /proc/self/status, which this platform lacks")
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise NotMeasurable("/proc/self/status has no VmRSS line")


def sparse_token_file(path: Path, token_count: int, dtype: str = "uint16") -> int:
    """A headed token file of ``token_count`` zero tokens made with ``truncate`` (sparse: the
    disk holds almost nothing and nothing is in memory). Returns its size in bytes."""
    size = HEADER_BYTES + token_count * np.dtype(dtype).itemsize
    with open(path, "wb") as file:
        file.write(token_file_header(dtype, token_count))
        file.truncate(size)
    return size


@check("data.resident_growth_fraction", evidence="measured", quantities=("file_bytes", "growth_bytes"))
def resident_growth_fraction(file_megabytes: int, reader: str, batches: int = 10, batch_size: int = 8, context_length: int = 256) -> Outcome:
    """Growth of resident memory (VmRSS), as a fraction of the file size, when ``reader``
    touches a sparse token file: ``memmap`` = ``read_tokens`` + ``batches`` calls of
    ``get_batch``; ``fromfile`` = ``np.fromfile`` of the whole file."""
    get_batch(np.arange(1024, dtype=np.uint16), batch_size, context_length, generator=torch.Generator().manual_seed(0))  # warm up
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "tokens.bin"
        file_bytes = sparse_token_file(path, file_megabytes * 2**20 // 2)
        before = resident_memory_bytes()
        if reader == "memmap":
            tokens = read_tokens(path)
            generator = torch.Generator().manual_seed(0)
            for _ in range(batches):
                get_batch(tokens, batch_size, context_length, generator=generator)
            grown = resident_memory_bytes() - before
            del tokens
        elif reader == "fromfile":
            everything = np.fromfile(path, dtype=np.uint16, offset=HEADER_BYTES)
            grown = resident_memory_bytes() - before
            del everything
        else:
            raise ValueError(f"reader {reader!r}: expected memmap or fromfile")
    return Outcome(measured=max(grown, 0) / file_bytes, quantities={"file_bytes": file_bytes, "growth_bytes": grown})


def _arange_tokens(token_count: int) -> np.ndarray:
    return np.arange(token_count, dtype=np.uint32)  # token i is i: a window's first input is its start


def _token_count(token_count: int | None, context_length: int, extra_tokens: int | None) -> int:
    """``token_count`` as given, or ``context_length + extra_tokens`` (so drawn inputs are valid)."""
    if (token_count is None) == (extra_tokens is None):
        raise ValueError("give token_count or extra_tokens (tokens beyond the context), not both")
    return token_count if token_count is not None else context_length + extra_tokens  # type: ignore[operator]


@check("data.window_starts", evidence="measured", quantities=("token_count", "highest_target_position", "lowest_start"))
def window_starts(
    context_length: int,
    token_count: int | None = None,
    extra_tokens: int | None = None,
    draws: int = 4000,
    seed: int = 0,
    report: str = "distinct_count",
) -> Outcome:
    """Draw ``draws`` windows with ``get_batch`` (seeded generator) from tokens 0, 1, …, n−1 and
    read the start of each window off its first input. ``report``: ``distinct_count`` (how many
    different starts appeared), ``starts`` (their sorted list) or ``highest_target_position``.
    ``token_count`` may be given as ``context_length + extra_tokens``."""
    token_count = _token_count(token_count, context_length, extra_tokens)
    x, y = get_batch(_arange_tokens(token_count), draws, context_length, generator=torch.Generator().manual_seed(seed))
    starts = sorted(set(x[:, 0].tolist()))
    valid = list(range(window_start_count(token_count, context_length)))
    if report == "distinct_count":
        measured, predicted = len(starts), len(valid)
    elif report == "starts":
        measured, predicted = starts, valid
    elif report == "highest_target_position":
        measured, predicted = int(y.max()), valid[-1] + context_length
    else:
        raise ValueError(f"report {report!r}: expected distinct_count, starts or highest_target_position")
    return Outcome(
        measured=measured,
        predicted=predicted,
        quantities={"token_count": token_count, "highest_target_position": int(y.max()), "lowest_start": starts[0]},
    )


@check("data.lecture_sampling_code", evidence="measured", quantities=("full_windows",))
def lecture_sampling_code(token_count: int, seq_len: int, batch_size: int = 4000, upper_bound_extra: int = 0, seed: int = 0) -> Outcome:
    """Runs the lecture's sampling code verbatim on a memmap of tokens 0 … n−1::

        ix = torch.randint(len(tokens) - seq_len + upper_bound_extra, (batch_size,))
        x = torch.stack([torch.from_numpy(tokens[i : i + seq_len].astype("int64")) for i in ix])
        y = torch.stack([torch.from_numpy(tokens[i + 1 : i + 1 + seq_len].astype("int64")) for i in ix])

    Measures how many distinct windows were drawn; the fraction of full-length targets is a
    quantity. torch's own error (stack of unequal sizes) is the measurement when it raises."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tokens.bin")
        _arange_tokens(token_count).astype(np.uint16).tofile(path)
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        with torch.random.fork_rng():  # the lecture's code draws from the global generator; leave it as it was
            seed_torch(seed)
            ix = torch.randint(len(tokens) - seq_len + upper_bound_extra, (batch_size,))
        full = sum(len(tokens[i + 1 : i + 1 + seq_len]) == seq_len for i in ix)
        x = torch.stack([torch.from_numpy(tokens[i : i + seq_len].astype("int64")) for i in ix])
        y = torch.stack([torch.from_numpy(tokens[i + 1 : i + 1 + seq_len].astype("int64")) for i in ix])
        distinct = len(set(x[:, 0].tolist()))
        assert torch.equal(y, x + 1)
        del tokens
    return Outcome(measured=distinct, predicted=window_start_count(token_count, seq_len), quantities={"full_windows": full / batch_size})


@check("data.targets_are_next_tokens", evidence="measured")
def targets_are_next_tokens(
    context_length: int, batch_size: int, token_count: int | None = None, extra_tokens: int | None = None, seed: int = 0
) -> Outcome:
    """Whether every target of ``get_batch`` is the token after its input, ``y[b, j] ==
    tokens[start_b + j + 1]``, with tokens 0 … n−1 so that the start is ``x[b, 0]``."""
    token_count = _token_count(token_count, context_length, extra_tokens)
    tokens = _arange_tokens(token_count)
    x, y = get_batch(tokens, batch_size, context_length, generator=torch.Generator().manual_seed(seed))
    starts = x[:, :1]  # (batch, 1)
    positions = starts + torch.arange(context_length)  # (batch, context)
    holds = torch.equal(x, torch.from_numpy(tokens.astype(np.int64))[positions]) and torch.equal(
        y, torch.from_numpy(tokens.astype(np.int64))[positions + 1]
    )
    return Outcome(measured=holds, predicted=True)


@check("data.batch_dtype", evidence="measured")
def batch_dtype(file_dtype: str = "uint16") -> Outcome:
    """The dtype of the tensors ``get_batch`` returns for a token file of ``file_dtype``."""
    x, y = get_batch(np.arange(64, dtype=file_dtype), 2, 8, generator=torch.Generator().manual_seed(0))
    assert x.dtype == y.dtype
    return Outcome(measured=str(x.dtype).removeprefix("torch."), predicted="int64")


@check("data.memmap_reinterpreted", evidence="measured")
def memmap_reinterpreted(first: int, second: int, written_as: str = "uint16", read_as: str = "int32") -> Outcome:
    """Token ids [first, second] written raw as ``written_as``, mapped back with ``np.memmap``
    as ``read_as``: the first value numpy hands out."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tokens.bin")
        np.array([first, second], dtype=written_as).tofile(path)
        mapped = np.memmap(path, dtype=read_as, mode="r")
        value = int(mapped[0])
        del mapped
    return Outcome(measured=value)


@check("data.stored_as", evidence="measured")
def stored_as(token_ids: list, dtype: str = "uint16") -> Outcome:
    """``np.array(token_ids).astype(dtype)`` read back as Python ints: what a raw token file keeps."""
    return Outcome(measured=[int(value) for value in np.array(token_ids, dtype=np.int64).astype(dtype)])


@check("data.index_dtype_accepted", evidence="measured")
def index_dtype_accepted(consumer: str, dtype: str) -> Outcome:
    """Feed indices of ``dtype`` (made with ``torch.from_numpy``) to ``consumer``:
    ``embedding`` (``F.embedding``) or ``cross_entropy`` targets. Measures ``accepted`` or lets
    torch's error be the measurement."""
    indices = torch.from_numpy(np.array([1, 2], dtype=dtype))
    if consumer == "embedding":
        torch.nn.functional.embedding(indices, torch.randn(4, 3))
    elif consumer == "cross_entropy":
        torch.nn.functional.cross_entropy(torch.randn(2, 4), indices)
    else:
        raise ValueError(f"consumer {consumer!r}: expected embedding or cross_entropy")
    return Outcome(measured="accepted")


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


@check("data.pin_memory_without_accelerator", evidence="measured")
def pin_memory_without_accelerator() -> Outcome:
    """``torch.ones(4).pin_memory()`` on a machine with no accelerator; torch's error is the
    measurement. Not measurable where an accelerator exists."""
    if _has_accelerator():
        raise NotMeasurable("this machine has an accelerator; the claim is about machines without one")
    pinned = torch.ones(4).pin_memory()
    return Outcome(measured=f"pinned={pinned.is_pinned()}")


@check("data.pinned_batch_on_gpu", evidence="measured", quantities=("is_pinned",))
def pinned_batch_on_gpu(batch_size: int = 8, context_length: int = 64) -> Outcome:
    """``get_batch(..., device="cuda", pin_memory=True)`` equals the CPU batch drawn with the same
    seed; the host copy's ``is_pinned()`` is a quantity."""
    tokens = np.arange(10_000, dtype=np.uint16)
    cpu_x, _ = get_batch(tokens, batch_size, context_length, generator=torch.Generator().manual_seed(3))
    gpu_x, _ = get_batch(tokens, batch_size, context_length, generator=torch.Generator().manual_seed(3), device="cuda", pin_memory=True)
    torch.cuda.synchronize()
    same = gpu_x.device.type == "cuda" and torch.equal(gpu_x.cpu(), cpu_x)
    return Outcome(measured=same, predicted=True, quantities={"is_pinned": cpu_x.pin_memory().is_pinned()})


def _copy_seconds(host: torch.Tensor, repeats: int) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        host.to("cuda", non_blocking=host.is_pinned())
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


@check("data.pinned_transfer_speedup", evidence="measured", timing=True)
def pinned_transfer_speedup(megabytes: int = 64, repeats: int = 10) -> Outcome:
    """Host→GPU copy time of a pageable tensor divided by that of a pinned one (``non_blocking``)."""
    pageable = torch.ones(megabytes * 2**20 // 4)
    pinned = pageable.pin_memory()
    _copy_seconds(pinned, 2), _copy_seconds(pageable, 2)  # warm up
    return Outcome(measured=_copy_seconds(pageable, repeats) / _copy_seconds(pinned, repeats))
