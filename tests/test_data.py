"""Token files, lazy reads and batch sampling (resacct.training.data)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from resacct.checks.data import resident_memory_bytes, sparse_token_file
from resacct.training.data import (
    HEADER_BYTES,
    TokenBatchSampler,
    get_batch,
    read_tokens,
    sample_window_starts,
    window_start_count,
    write_tokens,
)
from resacct.errors import ResacctError


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- writing and reading ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint16", "int32", "uint32"])
def test_round_trip_keeps_values_and_dtype(tmp_path: Path, dtype: str):
    tokens = np.array([0, 1, 2, 65535, 7, 3])
    write_tokens(tmp_path / "t.bin", tokens, dtype)
    read = read_tokens(tmp_path / "t.bin")
    assert isinstance(read, np.memmap) and read.dtype == np.dtype(dtype) and not read.flags.writeable
    assert read.tolist() == tokens.tolist()
    assert (tmp_path / "t.bin").stat().st_size == HEADER_BYTES + len(tokens) * np.dtype(dtype).itemsize


def test_list_input_and_explicit_matching_dtype(tmp_path: Path):
    write_tokens(tmp_path / "t.bin", [5, 6, 7], "int32")
    assert read_tokens(tmp_path / "t.bin", dtype="int32").tolist() == [5, 6, 7]


def test_wrong_dtype_for_a_headed_file_is_refused(tmp_path: Path):
    write_tokens(tmp_path / "t.bin", [1, 2, 3, 4], "uint16")
    with pytest.raises(ResacctError, match=r"t\.bin: holds uint16 tokens \(says its header\); you asked for int32"):
        read_tokens(tmp_path / "t.bin", dtype="int32")


def test_raw_file_needs_dtype_and_a_whole_number_of_tokens(tmp_path: Path):
    raw = tmp_path / "train.bin"
    np.array([1, 2, 3], dtype=np.uint16).tofile(raw)  # 6 bytes, nanoGPT style
    assert read_tokens(raw, dtype="uint16").tolist() == [1, 2, 3]
    with pytest.raises(ResacctError, match=r"no resacct header; pass dtype="):
        read_tokens(raw)
    with pytest.raises(ResacctError, match=r"6 bytes is not a whole number of int32 tokens \(4 bytes each\)"):
        read_tokens(raw, dtype="int32")


def test_truncated_and_padded_files_are_refused(tmp_path: Path):
    path = tmp_path / "t.bin"
    write_tokens(path, np.arange(100), "uint16")
    content = path.read_bytes()
    path.write_bytes(content[:-10])
    with pytest.raises(ResacctError, match=r"truncated: the header promises 100 uint16 tokens \(232 bytes\), the file has 222 bytes"):
        read_tokens(path)
    path.write_bytes(content + b"\0\0")
    with pytest.raises(ResacctError, match=r"2 trailing bytes after 100 uint16 tokens"):
        read_tokens(path)
    path.write_bytes(content[:20])
    with pytest.raises(ResacctError, match=r"header is cut short"):
        read_tokens(path)


def test_newer_format_and_unknown_dtype_in_header_are_refused(tmp_path: Path):
    path = tmp_path / "t.bin"
    path.write_bytes(struct.pack("<8sI8sIQ", b"RESACTOK", 2, b"uint16", 0, 0))
    with pytest.raises(ResacctError, match=r"format version 2; this resacct reads version ≤ 1"):
        read_tokens(path)
    path.write_bytes(struct.pack("<8sI8sIQ", b"RESACTOK", 1, b"float32", 0, 1) + b"\0" * 4)
    with pytest.raises(ResacctError, match=r"token dtype 'float32': expected one of uint16, int32, uint32"):
        read_tokens(path)


def test_missing_and_empty_files_are_refused(tmp_path: Path):
    with pytest.raises(ResacctError, match=r"absent\.bin: no token file there"):
        read_tokens(tmp_path / "absent.bin")
    write_tokens(tmp_path / "empty.bin", [], "uint16")
    with pytest.raises(ResacctError, match=r"empty\.bin: holds no tokens"):
        read_tokens(tmp_path / "empty.bin")


@pytest.mark.parametrize(
    ("tokens", "dtype", "vocab_size", "expected"),
    [
        ([1, 70000], "uint16", None, r"token id 70000 at index 1 does not fit uint16 \(ids 0\.\.65535\); use uint32"),
        ([3, -1], "int32", None, r"token id -1 at index 1 is negative"),
        ([3, 50], "uint16", 50, r"token id 50 at index 1 is not below vocab_size 50"),
        ([1], "int64", None, r"token dtype 'int64': expected one of uint16, int32, uint32"),
    ],
)
def test_write_refuses_bad_tokens(tmp_path: Path, tokens: list, dtype: str, vocab_size: int | None, expected: str):
    with pytest.raises(ResacctError, match=expected):
        write_tokens(tmp_path / "t.bin", np.array(tokens), dtype, vocab_size=vocab_size)
    assert not (tmp_path / "t.bin").exists()


def type_refusals() -> tuple[type[BaseException], ...]:
    """Under the test hook, jaxtyping refuses a wrong shape or dtype before resacct's own check
    runs; without it, resacct raises ResacctError. Either is a refusal."""
    import beartype.roar
    import jaxtyping

    return (ResacctError, jaxtyping.TypeCheckError, beartype.roar.BeartypeException)


@pytest.mark.parametrize(
    "call",
    [
        lambda path: write_tokens(path, np.array([[1, 2]]), "uint16"),
        lambda path: write_tokens(path, np.array([0.5, 1.0]), "uint16"),
        lambda path: get_batch(np.zeros((2, 5), dtype=np.uint16), 1, 2),
        lambda path: get_batch(np.zeros(10, dtype=np.float32), 1, 2),
    ],
    ids=["2-d tokens", "float tokens", "2-d array to sample", "float array to sample"],
)
def test_wrong_shapes_and_dtypes_are_refused(tmp_path: Path, call):
    with pytest.raises(type_refusals()):
        call(tmp_path / "t.bin")
    assert not (tmp_path / "t.bin").exists()


# --- sampling ---------------------------------------------------------------------------------


def test_batch_shapes_dtypes_and_shift():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = get_batch(tokens, batch_size=5, context_length=16, generator=seeded())
    assert x.shape == y.shape == (5, 16) and x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(y, x + 1)
    assert torch.equal(x, x[:, :1] + torch.arange(16))


def test_same_generator_seed_same_batch_different_seed_different_batch():
    tokens = np.arange(10_000, dtype=np.uint32)
    first = get_batch(tokens, 8, 4, generator=seeded(1))[0]
    assert torch.equal(first, get_batch(tokens, 8, 4, generator=seeded(1))[0])
    assert not torch.equal(first, get_batch(tokens, 8, 4, generator=seeded(2))[0])


def test_without_generator_the_global_torch_generator_decides():
    tokens = np.arange(10_000, dtype=np.uint32)
    torch.manual_seed(3)
    first = get_batch(tokens, 8, 4)[0]
    torch.manual_seed(3)
    assert torch.equal(first, get_batch(tokens, 8, 4)[0])


def test_every_window_is_reachable_and_none_out_of_range():
    tokens = np.arange(12, dtype=np.uint16)
    x, y = get_batch(tokens, batch_size=2000, context_length=4, generator=seeded())
    assert sorted(set(x[:, 0].tolist())) == list(range(8))
    assert int(y.max()) == 11


def test_context_that_exactly_fits_has_one_window():
    x, y = get_batch(np.arange(5, dtype=np.uint16), 3, 4, generator=seeded())
    assert x.tolist() == [[0, 1, 2, 3]] * 3 and y.tolist() == [[1, 2, 3, 4]] * 3


def test_reads_from_a_memmapped_file(tmp_path: Path):
    write_tokens(tmp_path / "t.bin", np.arange(300) % 50, "uint16")
    x, y = get_batch(read_tokens(tmp_path / "t.bin"), 4, 10, generator=seeded(), vocab_size=50)
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], (x[:, -1] + 1) % 50)


def test_too_few_tokens_for_the_context_are_refused(tmp_path: Path):
    with pytest.raises(ResacctError, match=r"4 tokens are too few for context_length 4: a window needs 5"):
        get_batch(np.arange(4, dtype=np.uint16), 1, 4)
    write_tokens(tmp_path / "short.bin", [1, 2, 3], "uint16")
    with pytest.raises(ResacctError, match=r"3 tokens are too few for context_length 8"):
        TokenBatchSampler(read_tokens(tmp_path / "short.bin"), 2, 8, seed=0)


def test_token_beyond_vocabulary_is_refused_with_its_position():
    tokens = np.zeros(10, dtype=np.uint16)
    tokens[6] = 99
    with pytest.raises(ResacctError, match=r"token id 99 at position 6 is not below vocab_size 50"):
        get_batch(tokens, 50, 9, generator=seeded(), vocab_size=50)
    get_batch(tokens, 50, 9, generator=seeded(), vocab_size=100)  # fits


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: window_start_count(10, 0), r"context_length 0: expected an int in 1\.\.268435456"),
        (lambda: sample_window_starts(10, 0, 2), r"batch_size 0: expected an int in 1\.\.268435456"),
    ],
)
def test_bad_arguments_are_refused(call, expected: str):
    with pytest.raises(ResacctError, match=expected):
        call()


def test_window_start_count():
    assert window_start_count(12, 4) == 8
    assert window_start_count(5, 4) == 1


def test_device_argument_moves_the_batch():
    x, y = get_batch(np.arange(100, dtype=np.uint16), 2, 4, generator=seeded(), device="meta")
    assert x.device.type == y.device.type == "meta"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_pin_memory_without_accelerator_is_refused_clearly():
    with pytest.raises(ResacctError, match=r"pin_memory=True needs an accelerator"):
        get_batch(np.arange(100, dtype=np.uint16), 2, 4, pin_memory=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pinned_batch_on_gpu_matches_cpu_batch():
    tokens = np.arange(1000, dtype=np.uint16)
    cpu = get_batch(tokens, 4, 8, generator=seeded(5))
    gpu = get_batch(tokens, 4, 8, generator=seeded(5), device="cuda", pin_memory=True)
    torch.cuda.synchronize()
    assert gpu[0].is_cuda and torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1])


# --- laziness ---------------------------------------------------------------------------------


def test_batches_from_a_large_file_do_not_load_it(tmp_path: Path):
    file_bytes = sparse_token_file(tmp_path / "big.bin", 100 * 2**20)  # 200 MB of uint16, sparse
    tokens = read_tokens(tmp_path / "big.bin")
    get_batch(np.arange(1000, dtype=np.uint16), 8, 64, generator=seeded())  # warm up
    before = resident_memory_bytes()
    generator = seeded()
    for _ in range(4):
        x, _ = get_batch(tokens, 8, 256, generator=generator)
    assert resident_memory_bytes() - before < 0.05 * file_bytes
    assert int(x.max()) == 0  # sparse zeros really were read


# --- the stateful sampler ---------------------------------------------------------------------


def test_sampler_state_round_trip_replays_the_same_batches():
    sampler = TokenBatchSampler(np.arange(500, dtype=np.uint16), batch_size=3, context_length=5, seed=9)
    sampler()
    state = sampler.state_dict()
    expected = [sampler()[0] for _ in range(3)]
    assert sampler.batches_drawn == 4
    sampler.load_state_dict(state)
    assert sampler.batches_drawn == 1
    assert all(torch.equal(sampler()[0], batch) for batch in expected)


def test_sampler_arguments_reach_get_batch():
    tokens = np.arange(500, dtype=np.uint16)
    x, y = TokenBatchSampler(tokens, batch_size=3, context_length=5, seed=9, device="meta")()
    assert x.shape == (3, 5) and x.device.type == "meta"
    with pytest.raises(ResacctError, match=r"not below vocab_size 10"):
        TokenBatchSampler(tokens, batch_size=3, context_length=5, seed=9, vocab_size=10)()
    first = TokenBatchSampler(tokens, 3, 5, seed=1)()[0]
    assert not torch.equal(first, TokenBatchSampler(tokens, 3, 5, seed=2)()[0])


# --- replacing a token file that someone is reading (issue 13) ---------------------------------


@pytest.mark.parametrize("new_length", [1000, 10, 4000], ids=["same-size", "smaller", "larger"])
def test_a_memmap_of_the_old_file_keeps_its_tokens_after_write_tokens(tmp_path: Path, new_length: int):
    """write_tokens used to truncate and rewrite in place: a job with the file memory-mapped
    got SIGBUS when it shrank, or silently read the new tokens when the size matched. Now the
    path is replaced by a new file; the old mapping keeps the old inode and its tokens."""
    path = tmp_path / "tokens.bin"
    write_tokens(path, np.arange(1000) % 500, "uint16")
    running_job = read_tokens(path)
    old = np.array(running_job)
    write_tokens(path, np.full(new_length, 7), "uint16")
    assert np.array_equal(np.array(running_job), old)  # no SIGBUS, no changed tokens
    assert read_tokens(path).tolist() == [7] * new_length
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["tokens.bin"]


def test_disk_full_while_writing_tokens_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import errno
    import io

    from resacct.training import atomic_files

    class DiskFull(io.FileIO):
        def __init__(self, temporary: Path):
            super().__init__(temporary, "x")

        def write(self, data) -> int:  # type: ignore[no-untyped-def, override]
            raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "tokens.bin"
    write_tokens(path, np.arange(100), "uint16")
    monkeypatch.setattr(atomic_files, "_open_temporary", DiskFull)
    with pytest.raises(ResacctError) as error:
        write_tokens(path, np.arange(200), "uint16")
    assert str(error.value) == f"{path}: cannot write the token file: no space left on the device (errno ENOSPC) after 0 bytes of the new token file; the previous token file at {path} is untouched"
    monkeypatch.undo()
    assert read_tokens(path).tolist() == list(range(100))
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["tokens.bin"]


def test_write_tokens_refuses_a_directory_or_fifo(tmp_path: Path):
    import os

    (tmp_path / "dir.bin").mkdir()
    with pytest.raises(ResacctError, match=r"dir\.bin: is a directory, not a regular file; refusing to replace it with a token file"):
        write_tokens(tmp_path / "dir.bin", [1, 2], "uint16")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.bin")
        with pytest.raises(ResacctError, match=r"pipe\.bin: is a FIFO"):
            write_tokens(tmp_path / "pipe.bin", [1, 2], "uint16")


def signed_token_file(tmp_path: Path, values: list[int]) -> np.memmap:
    """A raw int32 token file (as other tools write them): write_tokens would refuse -1."""
    path = tmp_path / "signed.bin"
    np.asarray(values, dtype="<i4").tofile(path)
    return read_tokens(path, dtype="int32")


@pytest.mark.parametrize("vocab_size", [None, 50])
def test_negative_ids_in_a_signed_file_are_refused(tmp_path: Path, vocab_size: int | None):
    """-1 passed the vocabulary check (it is < vocab_size) and reached the embedding."""
    tokens = signed_token_file(tmp_path, [3] * 10 + [-1] + [3] * 10)
    with pytest.raises(ResacctError, match=r"^token id -1 at position 10 is negative; token ids are ≥ 0") as error:
        for seed in range(50):  # some window covers position 10
            get_batch(tokens, batch_size=4, context_length=8, generator=seeded(seed), vocab_size=vocab_size)
    assert "\n" not in str(error.value)


def test_sampler_state_that_does_not_fit_changes_nothing():
    sampler = TokenBatchSampler(np.arange(50, dtype=np.uint16), 2, 4, seed=0)
    sampler()
    before = sampler.state_dict()
    for bad, expected in [
        ({"generator_state": torch.zeros(3, dtype=torch.uint8), "batches_drawn": 5}, r"sampler state 'generator_state' is a torch\.uint8 tensor of shape \(3,\)"),
        ({"generator_state": before["generator_state"], "batches_drawn": "many"}, r"sampler state 'batches_drawn' is 'many'; expected an int ≥ 0"),
        ({"batches_drawn": 1}, r"sampler state \{'batches_drawn': 1\}: expected a dict with 'generator_state' and 'batches_drawn'"),
    ]:
        with pytest.raises(ResacctError, match=expected):
            sampler.load_state_dict(bad)
        assert sampler.batches_drawn == 1 and torch.equal(sampler.generator.get_state(), before["generator_state"])


# --- absurd arguments (issue 26): one line naming the value and the range, before any allocation ---

TOKENS = np.arange(100, dtype=np.uint16)


def unchecked(function):  # type: ignore[no-untyped-def]
    """``function`` without the test hook's type checking: what a user calls (a float batch_size
    or device=7 would otherwise be refused by jaxtyping before resacct's own one-line check)."""
    return getattr(function, "__wrapped__", function)


def sampler(*args, **kwargs) -> TokenBatchSampler:  # type: ignore[no-untyped-def]
    instance = TokenBatchSampler.__new__(TokenBatchSampler)
    unchecked(TokenBatchSampler.__init__)(instance, *args, **kwargs)
    return instance


ABSURD = [
    ("batch-1e12", lambda: get_batch(TOKENS, 10**12, 4), r"^batch_size 1000000000000: expected an int in 1\.\.268435456$"),
    ("batch-1e30", lambda: get_batch(TOKENS, 10**30, 4), r"^batch_size 1000000000000000000000000000000: expected an int in 1\.\.268435456$"),
    ("batch-5000-digits", lambda: get_batch(TOKENS, 10**5000, 4), r"^batch_size <an integer of about 5001 digits>: expected an int in 1\.\.268435456$"),
    ("batch-float", lambda: unchecked(get_batch)(TOKENS, 2.5, 4), r"^batch_size 2\.5: expected an int in 1\.\.268435456$"),
    ("batch-bool", lambda: unchecked(get_batch)(TOKENS, True, 4), r"^batch_size True: expected an int in"),
    ("batch-times-context", lambda: get_batch(TOKENS, 2**20, 2**10), r"^batch_size 1048576 × \(context_length 1024 \+ 1\) = 1074790400 tokens per batch: expected at most 268435456 \(2\*\*28\)$"),
    ("context-1e12", lambda: get_batch(TOKENS, 2, 10**12), r"^context_length 1000000000000: expected an int in 1\.\.268435456$"),
    ("vocab-zero", lambda: get_batch(TOKENS, 2, 4, vocab_size=0), r"^vocab_size 0: expected an int in 1\.\."),
    ("device-bogus", lambda: get_batch(TOKENS, 2, 4, device="bogus"), r"^device 'bogus': expected a torch device such as 'cpu', 'cuda', 'cuda:0' or 'mps'$"),
    ("device-int", lambda: unchecked(get_batch)(TOKENS, 2, 4, device=7), r"^device 7: expected a device name such as 'cpu' or 'cuda:0', or a torch\.device$"),
    ("device-absent-gpu", lambda: get_batch(TOKENS, 2, 4, device="cuda:99"), r"^device 'cuda:99': this machine has (no|\d+) CUDA devices; use 'cpu'$"),
    ("seed-2**64", lambda: TokenBatchSampler(TOKENS, 2, 4, seed=2**64), r"^seed 18446744073709551616: expected an int in 0\.\.18446744073709551615 \(torch\.Generator seeds\)$"),
    ("seed-negative", lambda: TokenBatchSampler(TOKENS, 2, 4, seed=-1), r"^seed -1: expected an int in 0\.\.18446744073709551615"),
    ("seed-below-int64", lambda: TokenBatchSampler(TOKENS, 2, 4, seed=-(2**63) - 1), r"^seed -9223372036854775809: expected an int in 0\.\."),
    ("seed-float", lambda: sampler(TOKENS, 2, 4, seed=1.5), r"^seed 1\.5: expected an int in 0\.\."),
    ("sampler-batch", lambda: TokenBatchSampler(TOKENS, 10**12, 4, seed=0), r"^batch_size 1000000000000: expected an int in"),
    ("sampler-device", lambda: TokenBatchSampler(TOKENS, 2, 4, seed=0, device="bogus"), r"^device 'bogus': expected a torch device"),
]


@pytest.mark.parametrize(("call", "expected"), [case[1:] for case in ABSURD], ids=[case[0] for case in ABSURD])
def test_absurd_arguments_are_one_line_before_anything_is_allocated(monkeypatch: pytest.MonkeyPatch, call, expected: str):
    def allocates(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("allocated before refusing")

    monkeypatch.setattr(torch, "randint", allocates)
    monkeypatch.setattr(torch, "Generator", allocates)
    with pytest.raises(ResacctError, match=expected) as error:
        call()
    assert "\n" not in str(error.value)


def test_the_edges_of_the_ranges_are_accepted():
    assert TokenBatchSampler(TOKENS, 2, 4, seed=0).state_dict()["batches_drawn"] == 0
    assert TokenBatchSampler(TOKENS, 2, 4, seed=2**64 - 1, device=torch.device("cpu"))()[0].shape == (2, 4)
    assert get_batch(TOKENS, 1, 99, generator=seeded(), device="meta")[0].shape == (1, 99)
    assert unchecked(get_batch)(TOKENS, np.int64(2), np.int32(4), generator=seeded())[0].shape == (2, 4)  # numpy integers are integers


@pytest.mark.parametrize("batches_drawn, shown", [(10**30, "1000000000000000000000000000000"), (10**5000, "<an integer of about 5001 digits>"), (-1, "-1")],
                         ids=["1e30", "5000-digits", "negative"])
def test_a_sampler_state_beyond_int64_is_refused(batches_drawn: int, shown: str):
    sampler = TokenBatchSampler(TOKENS, 2, 4, seed=0)
    state = {"generator_state": sampler.generator.get_state(), "batches_drawn": batches_drawn}
    with pytest.raises(ResacctError, match=rf"^sampler state 'batches_drawn' is {shown}; expected an int ≥ 0, at most 2\*\*63 - 1$"):
        sampler.load_state_dict(state)
    assert sampler.batches_drawn == 0
