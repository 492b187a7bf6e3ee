"""Token data on disk, read lazily, and random next-token batches from it.

A token file is a small header followed by the raw token ids::

    offset 0   8 bytes  magic b"RESACTOK"
    offset 8   uint32   format version (1)
    offset 12  8 bytes  dtype name, ASCII, NUL-padded ("uint16", "int32", "uint32")
    offset 20  uint32   reserved (0)
    offset 24  uint64   token count
    offset 32  ...      token_count × itemsize bytes, little-endian

Why a header: ``np.memmap`` trusts the dtype it is given, so a uint16 file read as int32
silently yields ids ``a + 65536·b`` (see the claim ``memmap-trusts-the-dtype``). With the
header, a wrong dtype, a truncated file or trailing bytes are refused by name. Headerless
files (nanoGPT's ``train.bin``) still read: pass ``dtype=`` and the size must be a whole
number of tokens.

>>> import tempfile, os, numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "tokens.bin")
>>> write_tokens(path, np.arange(10), "uint16")
>>> tokens = read_tokens(path)
>>> tokens.dtype.name, len(tokens)
('uint16', 10)
>>> x, y = get_batch(tokens, batch_size=2, context_length=4, generator=torch.Generator().manual_seed(0))
>>> bool((y[:, :-1] == x[:, 1:]).all())
True
"""

from __future__ import annotations

import numbers
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Int64, Integer

from resacct.training.atomic_files import write_atomically
from resacct.errors import ResacctError

__all__ = [
    "TOKEN_DTYPES",
    "HEADER_BYTES",
    "token_file_header",
    "write_tokens",
    "read_tokens",
    "window_start_count",
    "sample_window_starts",
    "get_batch",
    "TokenBatchSampler",
]

TOKEN_DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in ("uint16", "int32", "uint32")}
MAGIC = b"RESACTOK"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sI8sIQ")
HEADER_BYTES = _HEADER.size  # 32
MAX_BATCH_TOKENS = 2**28  # batch_size × (context_length + 1): 2 GiB per int64 copy, 16× Llama 3's 16M-token batch
MAX_SEED = 2**64 - 1  # torch.Generator's seeds; a negative one would alias 2**64 + seed, so it is refused


def _whole_number(name: str, value: Any, low: int, high: int, why: str = "") -> int:
    """``value`` as an int in ``low..high``, or one ResacctError naming it and the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= int(value) <= high:
        raise ResacctError(f"{name} {_shown(value)}: expected an int in {low}..{high}{why}")
    return int(value)


def _checked_device(device: Any) -> torch.device:
    """``device`` parsed and present, before anything is allocated: 'bogus' or a missing GPU is one line."""
    if not isinstance(device, (str, torch.device)):
        raise ResacctError(f"device {device!r}: expected a device name such as 'cpu' or 'cuda:0', or a torch.device")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ResacctError(f"device {device!r}: expected a torch device such as 'cpu', 'cuda', 'cuda:0' or 'mps'") from None
    if parsed.type == "cuda" and (not torch.cuda.is_available() or (parsed.index or 0) >= torch.cuda.device_count()):
        raise ResacctError(f"device {device!r}: this machine has {torch.cuda.device_count() if torch.cuda.is_available() else 'no'} CUDA devices; use 'cpu'")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ResacctError(f"device {device!r}: MPS is not available on this machine; use 'cpu'")
    return parsed


def _checked_batch_shape(batch_size: Any, context_length: Any) -> tuple[int, int]:
    batch_size = _whole_number("batch_size", batch_size, 1, MAX_BATCH_TOKENS)
    context_length = _whole_number("context_length", context_length, 1, MAX_BATCH_TOKENS)
    if batch_size * (context_length + 1) > MAX_BATCH_TOKENS:
        raise ResacctError(f"batch_size {batch_size} × (context_length {context_length} + 1) = {batch_size * (context_length + 1)} tokens "
                           f"per batch: expected at most {MAX_BATCH_TOKENS} (2**28)")
    return batch_size, context_length


def _token_dtype(dtype: str | np.dtype | type) -> np.dtype:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    if name not in TOKEN_DTYPES:
        raise ResacctError(f"token dtype {dtype!r}: expected one of {', '.join(TOKEN_DTYPES)}")
    return TOKEN_DTYPES[name]


def token_file_header(dtype: str, token_count: int) -> bytes:
    """The 32-byte header of a token file holding ``token_count`` tokens of ``dtype``.

    >>> len(token_file_header("uint16", 10))
    32
    """
    if token_count < 0:
        raise ResacctError(f"token_count {token_count}: expected ≥ 0")
    return _HEADER.pack(MAGIC, FORMAT_VERSION, _token_dtype(dtype).name.encode("ascii"), 0, token_count)


def write_tokens(
    path: str | os.PathLike,
    tokens: Integer[np.ndarray, " tokens"] | Sequence[int],
    dtype: str = "uint16",
    *,
    vocab_size: int | None = None,
) -> None:
    """Write ``tokens`` to ``path`` as a headed token file of ``dtype``.

    Refuses ids that are negative, do not fit ``dtype`` (uint16 holds < 65536) or are
    ``≥ vocab_size``: a silent wrap-around would train on the wrong tokens.

    The file is written to a temporary file in the same directory and ``os.replace``-d over
    ``path`` (:func:`resacct.training.atomic_files.write_atomically`): a job that has the old file
    memory-mapped keeps reading the old tokens (overwriting in place would change them under
    it, or kill it with SIGBUS when the file shrinks), and a failed write (disk full) leaves
    the old file whole. A ``path`` that is a directory, FIFO or device is refused.

    >>> import tempfile, os
    >>> write_tokens(os.path.join(tempfile.mkdtemp(), "t.bin"), [70000], "uint16")
    Traceback (most recent call last):
    ...
    resacct.errors.ResacctError: token id 70000 at index 0 does not fit uint16 (ids 0..65535); use uint32
    """
    token_dtype = _token_dtype(dtype)
    values = np.asarray(tokens)
    if values.ndim != 1:
        raise ResacctError(f"tokens have shape {values.shape}; expected a 1-D sequence of token ids")
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise ResacctError(f"tokens have dtype {values.dtype}; expected integer token ids")
    if values.size:
        lowest, highest = int(values.min()), int(values.max())
        if lowest < 0:
            raise ResacctError(f"token id {lowest} at index {int(values.argmin())} is negative; token ids are ≥ 0")
        limit = int(np.iinfo(token_dtype).max)
        if highest > limit:
            raise ResacctError(
                f"token id {highest} at index {int(values.argmax())} does not fit {token_dtype.name} (ids 0..{limit}); use uint32"
            )
        if vocab_size is not None and highest >= vocab_size:
            raise ResacctError(f"token id {highest} at index {int(values.argmax())} is not below vocab_size {vocab_size}")
    header = token_file_header(token_dtype.name, values.size)
    body = np.ascontiguousarray(values.astype(token_dtype.newbyteorder("<"), copy=False))

    def write(file: Any) -> None:
        file.write(header)
        if body.size:
            file.write(body.view(np.uint8))

    write_atomically(path, write, what="token file")


def _read_header(path: Path, file_bytes: int) -> tuple[np.dtype, int] | None:
    """(dtype, token count) from the header, or None for a headerless file."""
    with open(path, "rb") as file:
        head = file.read(HEADER_BYTES)
    if not head.startswith(MAGIC):
        return None
    if len(head) < HEADER_BYTES:
        raise ResacctError(f"{path}: token file header is cut short ({len(head)} of {HEADER_BYTES} bytes); the file is truncated")
    _, version, dtype_name, _, count = _HEADER.unpack(head)
    if version > FORMAT_VERSION:
        raise ResacctError(f"{path}: token file format version {version}; this resacct reads version ≤ {FORMAT_VERSION}")
    token_dtype = _token_dtype(dtype_name.rstrip(b"\0").decode("ascii", errors="replace"))
    expected_bytes = HEADER_BYTES + count * token_dtype.itemsize
    if file_bytes < expected_bytes:
        raise ResacctError(
            f"{path}: truncated: the header promises {count} {token_dtype.name} tokens ({expected_bytes} bytes), the file has {file_bytes} bytes"
        )
    if file_bytes > expected_bytes:
        raise ResacctError(
            f"{path}: {file_bytes - expected_bytes} trailing bytes after {count} {token_dtype.name} tokens; the file is not what its header says"
        )
    return token_dtype, count


def read_tokens(path: str | os.PathLike, dtype: str | None = None) -> np.memmap:
    """Map the token file at ``path`` read-only (``np.memmap``): nothing is read until indexed.

    A headed file knows its dtype; ``dtype``, when given, must agree. A headerless file needs
    ``dtype`` and a size that is a whole number of tokens.
    """
    path = Path(path)
    if not path.is_file():
        raise ResacctError(f"{path}: no token file there")
    file_bytes = path.stat().st_size
    header = _read_header(path, file_bytes)
    if header is not None:
        token_dtype, count = header
        if dtype is not None and _token_dtype(dtype) != token_dtype:
            raise ResacctError(f"{path}: holds {token_dtype.name} tokens (says its header); you asked for {dtype}")
        offset = HEADER_BYTES
    else:
        if dtype is None:
            raise ResacctError(f"{path}: no resacct header; pass dtype= ({', '.join(TOKEN_DTYPES)}) to read a raw token file")
        token_dtype = _token_dtype(dtype)
        if file_bytes % token_dtype.itemsize:
            raise ResacctError(
                f"{path}: {file_bytes} bytes is not a whole number of {token_dtype.name} tokens ({token_dtype.itemsize} bytes each); wrong dtype or a truncated file?"
            )
        count, offset = file_bytes // token_dtype.itemsize, 0
    if count == 0:
        raise ResacctError(f"{path}: holds no tokens")
    return np.memmap(path, dtype=token_dtype.newbyteorder("<"), mode="r", offset=offset, shape=(count,))


def window_start_count(token_count: int, context_length: int) -> int:
    """How many start positions give a full window: inputs ``[i, i+C)`` and targets
    ``[i+1, i+C+1)`` fit when ``i ≤ token_count − C − 1``, so there are ``token_count − C``.

    >>> window_start_count(12, 4)
    8
    """
    context_length = _whole_number("context_length", context_length, 1, MAX_BATCH_TOKENS)
    if token_count < context_length + 1:
        raise ResacctError(
            f"{token_count} tokens are too few for context_length {context_length}: a window needs {context_length + 1} (inputs plus the next-token target)"
        )
    return token_count - context_length


def sample_window_starts(
    token_count: int, batch_size: int, context_length: int, generator: torch.Generator | None = None
) -> Int64[torch.Tensor, " batch"]:
    """``batch_size`` uniform start positions in ``0 .. token_count − C − 1`` (as the lecture:
    ``torch.randint(len(tokens) − C, ...)``, whose upper bound is exclusive)."""
    batch_size, context_length = _checked_batch_shape(batch_size, context_length)
    starts = window_start_count(token_count, context_length)
    return torch.randint(starts, (batch_size,), generator=generator)


def get_batch(
    tokens: Integer[np.ndarray, " tokens"],
    batch_size: int,
    context_length: int,
    *,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    vocab_size: int | None = None,
    pin_memory: bool = False,
) -> tuple[Int64[torch.Tensor, "batch context"], Int64[torch.Tensor, "batch context"]]:
    """Random windows of ``tokens``: inputs ``x`` and next-token targets ``y = x`` shifted by one.

    Only the ``batch_size × (context_length + 1)`` sampled tokens are read, so a memmapped file
    stays on disk. ``generator`` (a CPU ``torch.Generator``) makes the draw reproducible and is
    the data position a checkpoint must keep. ``vocab_size`` refuses ids ``≥ vocab_size``.
    ``pin_memory`` pins the batch in page-locked host memory and copies it with
    ``non_blocking=True`` (only useful, and only possible, with an accelerator).

    >>> x, y = get_batch(np.arange(100, dtype=np.uint16), 3, 8, generator=torch.Generator().manual_seed(1))
    >>> x.shape, x.dtype, bool((y == x + 1).all())
    (torch.Size([3, 8]), torch.int64, True)

    Refused in one line, before anything is allocated: a ``batch_size`` or ``context_length``
    that is not an int ≥ 1, a batch of more than :data:`MAX_BATCH_TOKENS` tokens
    (``batch_size × (context_length + 1)``), a ``vocab_size`` below 1, a ``device`` torch does not
    know (``"bogus"``) or this machine lacks (``"cuda:3"`` without it).
    """
    batch_size, context_length = _checked_batch_shape(batch_size, context_length)
    device = _checked_device(device)
    if vocab_size is not None:
        vocab_size = _whole_number("vocab_size", vocab_size, 1, 2**63 - 1)
    if tokens.ndim != 1:
        raise ResacctError(f"tokens have shape {tokens.shape}; expected a 1-D array of token ids")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ResacctError(f"tokens have dtype {tokens.dtype}; expected integer token ids")
    starts = sample_window_starts(len(tokens), batch_size, context_length, generator).numpy()
    positions = starts[:, None] + np.arange(context_length + 1)  # (batch, context + 1)
    windows = np.asarray(tokens[positions]).astype(np.int64)  # reads only these tokens
    if np.issubdtype(tokens.dtype, np.signedinteger):
        _refuse_negative_ids(windows, positions)
    if vocab_size is not None:
        _refuse_out_of_vocabulary(windows, positions, vocab_size)
    x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))  # (batch, context)
    y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))  # (batch, context)
    return _to_device(x, device, pin_memory), _to_device(y, device, pin_memory)


def _refuse_negative_ids(windows: np.ndarray, positions: np.ndarray) -> None:
    negative = windows < 0
    if negative.any():
        row, column = map(int, np.argwhere(negative)[0])
        raise ResacctError(
            f"token id {int(windows[row, column])} at position {int(positions[row, column])} is negative; token ids are ≥ 0 "
            "(a signed file with bad ids, or read with the wrong dtype?)"
        )


def _refuse_out_of_vocabulary(windows: np.ndarray, positions: np.ndarray, vocab_size: int) -> None:
    bad = windows >= vocab_size
    if bad.any():
        row, column = map(int, np.argwhere(bad)[0])
        raise ResacctError(
            f"token id {int(windows[row, column])} at position {int(positions[row, column])} is not below vocab_size {vocab_size}"
        )


def _to_device(batch: torch.Tensor, device: str | torch.device, pin_memory: bool) -> torch.Tensor:
    if not pin_memory:
        return batch.to(device)
    try:
        pinned = batch.pin_memory()
    except RuntimeError as error:
        raise ResacctError(f"pin_memory=True needs an accelerator; torch says: {error}") from None
    return pinned.to(device, non_blocking=True)


class TokenBatchSampler:
    """A stateful batch source: ``sampler()`` gives the next ``(x, y)``; ``state_dict()`` is its
    data position (the generator state and how many batches it has drawn), which
    :func:`resacct.training.checkpoint.save_checkpoint` stores so a resumed run sees the same batches.

    >>> sampler = TokenBatchSampler(np.arange(50, dtype=np.uint16), 2, 4, seed=0)
    >>> state = sampler.state_dict(); first = sampler()[0]
    >>> sampler.load_state_dict(state); bool(torch.equal(sampler()[0], first))
    True
    """

    def __init__(
        self,
        tokens: Integer[np.ndarray, " tokens"],
        batch_size: int,
        context_length: int,
        *,
        seed: int,
        device: str | torch.device = "cpu",
        vocab_size: int | None = None,
        pin_memory: bool = False,
    ):
        """Refuses now, not at step 1: what :func:`get_batch` refuses, a file too short for one
        window, a ``seed`` outside 0..2**64-1 (a negative one would silently be ``2**64 + seed``)."""
        batch_size, context_length = _checked_batch_shape(batch_size, context_length)
        device = _checked_device(device)
        seed = _whole_number("seed", seed, 0, MAX_SEED, " (torch.Generator seeds)")
        window_start_count(len(tokens), context_length)  # refuse a too-short file now, not at step 1
        self.tokens = tokens
        self.batch_size = batch_size
        self.context_length = context_length
        self.device = device
        self.vocab_size = vocab_size
        self.pin_memory = pin_memory
        self.generator = torch.Generator().manual_seed(seed)
        self.batches_drawn = 0

    def __call__(self) -> tuple[Int64[torch.Tensor, "batch context"], Int64[torch.Tensor, "batch context"]]:
        batch = get_batch(
            self.tokens,
            self.batch_size,
            self.context_length,
            generator=self.generator,
            device=self.device,
            vocab_size=self.vocab_size,
            pin_memory=self.pin_memory,
        )
        self.batches_drawn += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"generator_state": self.generator.get_state(), "batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; checks it all first, so a refusal changes nothing."""
        if not isinstance(state, dict) or not {"generator_state", "batches_drawn"} <= set(state):
            raise ResacctError(f"sampler state {_shown(state)}: expected a dict with 'generator_state' and 'batches_drawn'")
        generator_state, batches_drawn = state["generator_state"], state["batches_drawn"]
        if isinstance(batches_drawn, bool) or not isinstance(batches_drawn, int) or not 0 <= batches_drawn <= 2**63 - 1:
            raise ResacctError(f"sampler state 'batches_drawn' is {_shown(batches_drawn)}; expected an int ≥ 0, at most 2**63 - 1")
        try:
            torch.Generator().set_state(generator_state)
        except (RuntimeError, TypeError, ValueError) as error:
            raise ResacctError(
                f"sampler state 'generator_state' is {_shown(generator_state)}; expected torch.Generator().get_state() ({str(error).splitlines()[0]})"
            ) from None
        self.generator.set_state(generator_state)
        self.batches_drawn = batches_drawn


def _shown(value: Any) -> str:
    if isinstance(value, numbers.Integral) and int(value).bit_length() > 128:  # repr() refuses ints over 4,300 digits
        return f"<an integer of about {int(int(value).bit_length() * 0.30103) + 1} digits>"
    text = f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."
