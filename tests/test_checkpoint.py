"""Checkpoints: round trips, refusals with clear messages, atomic writes, and an exact resume
after SIGKILL."""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from resacct.training import atomic_files
from resacct.training import checkpoint as checkpoint_module
from resacct.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_FORMAT_VERSION,
    capture_rng_states,
    load_checkpoint,
    missing_resume_state,
    read_checkpoint,
    save_checkpoint,
    write_atomically,
    write_checkpoint_file,
)
from resacct.training.seeding import preserved_global_rng
from resacct.training.data import TokenBatchSampler
from resacct.errors import ResacctError
from resacct.training.models import Cruncher

from tests import resume_worker

WORKER = Path(resume_worker.__file__)


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def trained(seed: int = 0, steps: int = 2) -> tuple[Cruncher, torch.optim.Optimizer]:
    generator = torch.Generator().manual_seed(seed)
    with preserved_global_rng():
        torch.manual_seed(seed)
        model = Cruncher(dim=4, num_layers=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(torch.randn(3, 4, generator=generator)), torch.randn(3, 1, generator=generator)).backward()
        optimizer.step()
    return model, optimizer


# --- round trip -------------------------------------------------------------------------------


def test_round_trip_restores_model_optimizer_and_step(tmp_path: Path):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=42)
    fresh_model, fresh_optimizer = trained(seed=1, steps=0)
    assert not torch.equal(fresh_model.final.weight, model.final.weight)
    assert load_checkpoint(path, model=fresh_model, optimizer=fresh_optimizer) == 42
    for a, b in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(a, b)
    saved_moments = optimizer.state[model.final.weight]["exp_avg"]
    assert torch.equal(fresh_optimizer.state[fresh_model.final.weight]["exp_avg"], saved_moments)


def test_every_global_generator_is_restored(tmp_path: Path):
    model, optimizer = trained()
    with preserved_global_rng():
        path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)
        expected = (random.random(), float(np.random.standard_normal()), float(torch.rand(1)))
        random.seed(123), np.random.seed(123), torch.manual_seed(123)
        load_checkpoint(path, model=model)
        assert (random.random(), float(np.random.standard_normal()), float(torch.rand(1))) == expected


def test_restore_rng_false_leaves_generators_alone(tmp_path: Path):
    model, optimizer = trained()
    with preserved_global_rng():
        path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)
        saved_next = float(torch.rand(1))
        torch.manual_seed(5)
        expected = float(torch.rand(1))
        torch.manual_seed(5)
        load_checkpoint(path, model=model, restore_rng=False)
        drawn = float(torch.rand(1))
    assert drawn == expected != saved_next


def test_numpy_cached_gaussian_survives(tmp_path: Path):
    model, optimizer = trained()
    with preserved_global_rng():
        np.random.seed(7)
        np.random.standard_normal()  # legacy Box–Muller caches the second value
        assert np.random.get_state()[3] == 1
        path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)
        expected = np.random.standard_normal()
        np.random.seed(0)
        load_checkpoint(path, model=model)
        assert np.random.standard_normal() == expected


def test_data_position_is_restored(tmp_path: Path):
    model, optimizer = trained()
    sampler = TokenBatchSampler(np.arange(200, dtype=np.uint16), batch_size=2, context_length=4, seed=3)
    sampler()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1, data=sampler)
    expected = sampler()[0]
    restarted = TokenBatchSampler(np.arange(200, dtype=np.uint16), batch_size=2, context_length=4, seed=3)
    with preserved_global_rng():
        load_checkpoint(path, model=model, data=restarted)
    assert restarted.batches_drawn == 1
    assert torch.equal(restarted()[0], expected)


def test_file_loads_with_weights_only(tmp_path: Path):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=3, extra={"note": "hi"})
    content = torch.load(path, weights_only=True)
    assert content["format"] == CHECKPOINT_FORMAT and content["format_version"] == CHECKPOINT_FORMAT_VERSION
    assert set(content["rng"]) >= {"python", "numpy", "torch"}
    assert content["rng"]["numpy"]["keys"].dtype == torch.int64
    assert content["extra"] == {"note": "hi"}


def test_negative_step_is_refused(tmp_path: Path):
    model, optimizer = trained()
    with pytest.raises(ResacctError, match=r"step -1"):
        save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=-1)


# --- refusals ---------------------------------------------------------------------------------


def saved(tmp_path: Path, content: object, name: str = "foreign.pt") -> Path:
    """``content`` written as resacct writes a checkpoint (with a valid SHA-256 trailer), so
    that what is refused is the content, not the missing checksum (``check_loads=False``: the
    writer itself would refuse content that does not load back)."""
    return write_checkpoint_file(tmp_path / name, content, check_loads=False)


def plain_torch_save(tmp_path: Path, content: object, name: str = "plain.pt") -> Path:
    path = tmp_path / name
    torch.save(content, path)
    return path


def valid_content() -> dict:
    model, optimizer = trained()
    return {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "step": 1,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": capture_rng_states(),
        "data": None,
    }


class NotATensor:
    pass


@pytest.mark.parametrize(
    ("make_file", "expected"),
    [
        (lambda tmp: tmp / "absent.pt", r"absent\.pt: no checkpoint there"),
        (lambda tmp: (tmp / "empty.pt").write_bytes(b"") and tmp / "empty.pt" or tmp / "empty.pt", r"empty\.pt: not a checkpoint: an empty file"),
        (lambda tmp: _write(tmp / "random.pt", os.urandom(4096)), r"random\.pt: not a checkpoint: 4096 bytes that are not a torch\.save archive"),
        (lambda tmp: _write(tmp / "pickle.pt", pickle.dumps({"step": 1})), r"pickle\.pt: not a checkpoint"),
        (lambda tmp: saved(tmp, [1, 2, 3]), r"foreign\.pt: not a resacct checkpoint: it holds a list"),
        (lambda tmp: saved(tmp, {"model": {}, "optimizer": {}}), r"foreign\.pt: not a resacct checkpoint: 'format' is None"),
        (lambda tmp: saved(tmp, {"thing": NotATensor()}), r"foreign\.pt: holds objects other than tensors and plain values"),
        (lambda tmp: saved(tmp, {k: v for k, v in valid_content().items() if k != "optimizer"}), r"foreign\.pt: checkpoint is missing 'optimizer'"),
        (lambda tmp: saved(tmp, {**valid_content(), "format_version": CHECKPOINT_FORMAT_VERSION + 1}), r"format version 3 is not one this resacct reads \(1\.\.2\)"),
        (lambda tmp: plain_torch_save(tmp, valid_content()), r"plain\.pt: no SHA-256 trailer, so its integrity cannot be checked"),
        (lambda tmp: tmp, r": is a directory, not a checkpoint file"),
    ],
    ids=["missing", "empty", "random-bytes", "plain-pickle", "list", "foreign-dict", "arbitrary-object", "missing-key", "newer-version", "plain-torch-save", "directory"],
)
def test_bad_files_are_refused_by_name(tmp_path: Path, make_file, expected: str):
    path = make_file(tmp_path)
    with pytest.raises(ResacctError, match=expected):
        read_checkpoint(path)


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("keep_fraction", [0.1, 0.5, 0.9, 0.999])
def test_truncated_checkpoint_is_refused(tmp_path: Path, keep_fraction: float):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)
    content = path.read_bytes()
    path.write_bytes(content[: int(len(content) * keep_fraction)])
    with pytest.raises(ResacctError, match=r"ckpt\.pt: (not a checkpoint|a damaged torch\.save archive|no SHA-256 trailer)"):
        read_checkpoint(path)


def test_model_that_does_not_fit_is_refused(tmp_path: Path):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)
    with pytest.raises(ResacctError, match=r"ckpt\.pt: the model state does not fit this Cruncher"):
        load_checkpoint(path, model=Cruncher(dim=5, num_layers=2))


def test_asking_for_state_the_checkpoint_lacks_is_refused(tmp_path: Path):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=None, step=1)
    with pytest.raises(ResacctError, match=r"holds no optimizer state"):
        load_checkpoint(path, model=model, optimizer=optimizer)
    sampler = TokenBatchSampler(np.arange(50, dtype=np.uint16), 2, 4, seed=0)
    with pytest.raises(ResacctError, match=r"holds no data state"):
        load_checkpoint(path, model=model, data=sampler)


# --- atomic writes ----------------------------------------------------------------------------


def leftovers(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir() if entry.name != "ckpt.pt")


def test_crash_before_rename_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)

    def crash(*args: object) -> None:
        raise OSError("simulated crash between fsync and rename")

    monkeypatch.setattr(atomic_files.os, "replace", crash)
    with pytest.raises(ResacctError, match=r"ckpt\.pt: cannot write the checkpoint: simulated crash .*; the previous checkpoint at .*ckpt\.pt is untouched"):
        save_checkpoint(path, model=model, optimizer=optimizer, step=2)
    monkeypatch.undo()
    assert read_checkpoint(path)["step"] == 1
    assert leftovers(tmp_path) == []


def test_crash_while_writing_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)
    real_save = torch.save

    def half_written(obj: object, file) -> None:  # type: ignore[no-untyped-def]
        import io

        buffer = io.BytesIO()
        real_save(obj, buffer)
        file.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise KeyboardInterrupt("killed half-way through the write")

    monkeypatch.setattr(checkpoint_module.torch, "save", half_written)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, model=model, optimizer=optimizer, step=2)
    monkeypatch.undo()
    assert read_checkpoint(path)["step"] == 1
    assert leftovers(tmp_path) == []


def test_torn_temporary_file_from_a_killed_writer_is_ignored(tmp_path: Path):
    """SIGKILL during a write leaves a torn temporary file (no cleanup runs); the checkpoint
    itself is untouched, and the next save still works."""
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)
    torn = tmp_path / ".ckpt.pt.12345.deadbeef.tmp"
    torn.write_bytes(path.read_bytes()[:100])
    assert read_checkpoint(path)["step"] == 1
    save_checkpoint(path, model=model, optimizer=optimizer, step=2)
    assert read_checkpoint(path)["step"] == 2


def test_write_atomically_replaces_whole_file(tmp_path: Path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"old content that is longer")
    write_atomically(target, lambda file: file.write(b"new"))
    assert target.read_bytes() == b"new"
    assert [entry.name for entry in tmp_path.iterdir()] == ["file.bin"]


def test_write_atomically_refuses_missing_directory(tmp_path: Path):
    with pytest.raises(ResacctError, match=r"does not exist"):
        write_atomically(tmp_path / "nowhere" / "file.bin", lambda file: file.write(b"x"))


# --- what resuming needs ----------------------------------------------------------------------


def test_missing_resume_state():
    lecture = {"model", "optimizer", "step", "torch_rng"}
    assert missing_resume_state(lecture, {"model", "optimizer", "torch_rng"}) == []
    assert missing_resume_state(lecture, {"model", "optimizer", "data", "numpy_rng"}) == ["numpy_rng", "data"]
    with pytest.raises(ResacctError, match=r"unknown resume state \['dropout_rng'\]"):
        missing_resume_state(lecture, {"dropout_rng"})


# --- SIGKILL, then resume ---------------------------------------------------------------------


def wait_for_line(process: subprocess.Popen, wanted: str, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == wanted:
            return
        if time.monotonic() > deadline:
            break
    process.kill()
    raise AssertionError(f"worker never printed {wanted!r}; stderr: {process.stderr.read() if process.stderr else ''}")


def worker(checkpoint: Path, output: Path, *options: str) -> subprocess.Popen:
    """Start ``tests/resume_worker.py`` as its own process (no type-checking hook there:
    beartype draws from Python's global ``random`` when it samples containers, so runs inside
    pytest and outside it see different random streams; compare process with process)."""
    command = [sys.executable, str(WORKER), "--checkpoint", str(checkpoint), "--output", str(output), "--steps", "12", "--checkpoint-every", "3"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([*command, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)


def finished(process: subprocess.Popen, timeout_seconds: float = 120) -> None:
    _, errors = process.communicate(timeout=timeout_seconds)
    assert process.returncode == 0, errors


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_resume_after_sigkill_is_bit_identical(tmp_path: Path):
    checkpoint, output, go = tmp_path / "ckpt.pt", tmp_path / "final.pt", tmp_path / "go"
    # All three processes start now, so their imports overlap; the resumed one waits for "go".
    reference = worker(tmp_path / "reference.pt", tmp_path / "reference-final.pt")
    resumed_run = worker(checkpoint, output, "--resume", "--start-when-exists", str(go))
    killed = worker(checkpoint, output, "--step-delay", "0.05")
    try:
        wait_for_line(killed, "step 4", timeout_seconds=120)  # step 3's checkpoint is on disk by now
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
    except BaseException:
        for process in (killed, resumed_run, reference):
            process.kill()
        raise
    assert killed.returncode == -signal.SIGKILL
    assert not output.exists(), "the worker finished before it was killed"
    killed_at = read_checkpoint(checkpoint)["step"]
    assert 3 <= killed_at < 12 and killed_at % 3 == 0

    go.touch()
    finished(resumed_run)
    finished(reference)
    resumed = torch.load(output, weights_only=True)
    uninterrupted = torch.load(tmp_path / "reference-final.pt", weights_only=True)
    assert resumed.keys() == uninterrupted.keys()
    for name in uninterrupted:
        assert torch.equal(resumed[name], uninterrupted[name]), name


def crashed_run(tmp_path: Path, steps: int = 6, every: int = 3, crash_after: int = 4) -> Path:
    """A worker run that dies after ``crash_after`` steps; its last checkpoint is at step 3."""
    checkpoint = tmp_path / "ckpt.pt"
    with pytest.raises(resume_worker.SimulatedCrash):
        resume_worker.run(checkpoint, steps, every, crash_after_step=crash_after)
    assert read_checkpoint(checkpoint)["step"] == 3
    return checkpoint


def test_in_process_crash_then_resume_is_bit_identical(tmp_path: Path):
    with single_thread(), preserved_global_rng():
        checkpoint = crashed_run(tmp_path)
        resumed = resume_worker.run(checkpoint, 6, 3, resume=True)
        uninterrupted = resume_worker.run(tmp_path / "reference.pt", 6, 3)
    assert all(torch.equal(resumed[name], uninterrupted[name]) for name in uninterrupted)


def fresh_start_state(part: str) -> object:
    """What ``part`` of a checkpoint would hold if it had not been saved: the state right after
    the worker's own seeding."""
    with preserved_global_rng():
        random.seed(0), np.random.seed(0), torch.manual_seed(0)
        if part in ("python", "numpy", "torch"):
            return capture_rng_states()[part]
        if part == "data":
            return resume_worker.NoisyTokenFeatures(seed=1234).state_dict()
        if part == "optimizer":
            return torch.optim.AdamW(Cruncher(dim=resume_worker.DIM, num_layers=2).parameters(), lr=1e-2, weight_decay=0.1).state_dict()
        if part == "step":
            return 0
    raise ValueError(part)


@pytest.mark.parametrize("part", ["python", "numpy", "torch", "data", "optimizer", "step"])
def test_resume_needs_every_part_of_the_checkpoint(tmp_path: Path, part: str):
    """The control for the resume tests: replace one part of the checkpoint by what a restarted
    process would have without it, and the resumed run no longer matches — every part counts."""
    with single_thread(), preserved_global_rng():
        checkpoint = crashed_run(tmp_path)
        content = torch.load(checkpoint, weights_only=True)
        if part in ("python", "numpy", "torch"):
            content["rng"][part] = fresh_start_state(part)
        else:
            content[part] = fresh_start_state(part)
        write_checkpoint_file(checkpoint, content)
        resumed = resume_worker.run(checkpoint, 6, 3, resume=True)
        uninterrupted = resume_worker.run(tmp_path / "reference.pt", 6, 3)
    assert not all(torch.equal(resumed[name], uninterrupted[name]) for name in uninterrupted)
