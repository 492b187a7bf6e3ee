"""Issue 26: a save never replaces a good checkpoint with one that ``load_checkpoint`` refuses.

Before: ``extra={"val_loss": np.float64(1.5)}`` (np.int64, an ndarray, a Path, any object) was
written, over the good checkpoint, and every later load was refused (``weights_only``); a lambda or
``extra`` nested 2,000 deep raised a bare PicklingError / RecursionError; a NUL in the path a bare
ValueError; a stale temporary in a read-only directory a bare PermissionError."""

from __future__ import annotations

import enum
import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from resacct.errors import CheckpointError, ResacctError
from resacct.training import atomic_files
from resacct.training.atomic_files import temporary_name
from resacct.training.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint, write_checkpoint_file
from resacct.training.checkpoint_values import MAX_DEPTH, plain_value
from resacct.training.data import write_tokens


class Colour(enum.Enum):
    RED = 1


class Marked(torch.Tensor):
    """A tensor subclass: picklable, but not among the globals weights_only allows."""


class Stateful:
    """A data source or scaler whose state is whatever the test puts in it."""

    def __init__(self, state: Any):
        self.state = state

    def state_dict(self) -> Any:
        return self.state

    def load_state_dict(self, state: Any) -> None:
        self.state = state


def nested(depth: int) -> dict:
    root: dict = {}
    current = root
    for _ in range(depth):
        current["a"] = {}
        current = current["a"]
    return root


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.fixture
def good(tmp_path: Path) -> Path:
    model, optimizer = model_and_optimizer()
    return save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=7, extra={"note": "good"})


def assert_untouched(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before
    assert read_checkpoint(path)["step"] == 7
    assert sorted(entry.name for entry in path.parent.iterdir()) == [path.name]  # no temporary left


def cyclic() -> dict:
    value: dict = {}
    value["self"] = value
    return value


REFUSED_EXTRA = {
    "ndarray": ({"weights": np.zeros(3)}, r"extra\['weights'\] is a numpy\.ndarray of shape \(3,\).*store torch\.from_numpy\(value\) or value\.tolist\(\)"),
    "path": ({"out": Path("runs/a")}, r"extra\['out'\] is a path \(PosixPath\('runs/a'\)\).*store str\(value\)"),
    "object": ({"thing": object()}, r"extra\['thing'\] is a builtins\.object.*store a plain form of it"),
    "lambda": ({"schedule": lambda step: 0.1}, r"extra\['schedule'\] is a function or class \(.*<lambda>\).*store its result"),
    "enum": ({"colour": Colour.RED}, r"extra\['colour'\] is an enum member .*store value\.value"),
    "frozenset": ({"tags": frozenset({"a"})}, r"extra\['tags'\] is a frozenset.*store a set"),
    "ndarray in a list": ({"history": [1.0, np.ones(2)]}, r"extra\['history'\]\[1\] is a numpy\.ndarray"),
    "object as a key": ({"by": {object(): 1}}, r"extra\['by'\] key <object object at .*> is a builtins\.object"),
    "nested 2000 deep": (nested(2000), rf"extra\['a'\]\['a'\].* is nested deeper than {MAX_DEPTH} levels; store a flatter structure"),
    "contains itself": ({"loop": cyclic()}, r"extra\['loop'\]\['self'\] contains itself"),
    "longdouble that a float cannot hold": (
        {"x": np.longdouble(1) + np.finfo(np.longdouble).eps} if np.finfo(np.longdouble).eps < np.finfo(np.float64).eps else {"x": np.ones(1)},
        r"extra\['x'\] is a numpy\.",
    ),
}


@pytest.mark.parametrize("name", list(REFUSED_EXTRA))
def test_extra_that_would_not_load_back_is_refused_before_anything_is_written(good: Path, name: str):
    extra, message = REFUSED_EXTRA[name]
    before = good.read_bytes()
    model, optimizer = model_and_optimizer()
    with pytest.raises(CheckpointError, match=rf"^{good}: refusing to save: {message}.*; nothing was written$") as error:
        save_checkpoint(good, model=model, optimizer=optimizer, step=8, extra=extra)
    assert "\n" not in str(error.value)
    assert_untouched(good, before)


@pytest.mark.parametrize("part", ["data", "grad_scaler"])
@pytest.mark.parametrize(
    "state, message",
    [
        ({"position": np.zeros(2)}, r"\['position'\] is a numpy\.ndarray"),
        ({"file": Path("tokens.bin")}, r"\['file'\] is a path"),
        ({"hook": print}, r"\['hook'\] is a function or class \(print\)"),
    ],
)
def test_data_and_scaler_states_are_checked_the_same_way(good: Path, part: str, state: dict, message: str):
    before = good.read_bytes()
    model, optimizer = model_and_optimizer()
    with pytest.raises(CheckpointError, match=rf"refusing to save: {part}{message}"):
        save_checkpoint(good, model=model, optimizer=optimizer, step=8, **{part: Stateful(state)})
    assert_untouched(good, before)


def test_a_data_state_that_is_not_a_dict_is_refused_at_save_not_at_load(good: Path):
    before = good.read_bytes()
    model, optimizer = model_and_optimizer()
    with pytest.raises(CheckpointError, match=rf"^{good}: refusing to save: checkpoint field 'data' is \[1, 2\]; expected None or a state_dict\(\).*; nothing was written$"):
        save_checkpoint(good, model=model, optimizer=optimizer, step=8, data=Stateful([1, 2]))
    assert_untouched(good, before)


def _weights_only_loads_complex() -> bool:
    """torch 2.4's weights_only unpickler refuses builtins.complex; later versions admit it."""
    import io

    buffer = io.BytesIO()
    torch.save({"z": 1 + 2j}, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception:  # noqa: BLE001 - torch's UnpicklingError, whatever its class in this version
        return False
    return True


def test_numpy_scalars_are_converted_losslessly_and_load_back(tmp_path: Path):
    model, optimizer = model_and_optimizer()
    extra = {
        "val_loss": np.float64(1.5),
        "tokens": np.int64(2**62 + 1),
        "lr": np.float32(1e-4),
        "half": np.float16(0.1),
        "done": np.bool_(True),
        "nan": np.float64("nan"),
        "name": np.str_("run-1"),
        "z": np.complex128(1 + 2j),
        np.int32(3): [np.uint8(255), (np.int16(-1),)],
    }
    data = Stateful({"batches_drawn": np.int64(5)})
    if not _weights_only_loads_complex():  # the save refuses what torch.load(weights_only=True) would not read back
        with pytest.raises(CheckpointError, match="complex"):
            save_checkpoint(tmp_path / "refused.pt", model=model, optimizer=optimizer, step=1, extra={"z": np.complex128(1 + 2j)})
        del extra["z"]
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1, extra=extra, data=data)
    loaded = read_checkpoint(path)
    saved = loaded["extra"]
    assert saved["val_loss"] == 1.5 and type(saved["val_loss"]) is float
    assert saved["tokens"] == 2**62 + 1 and type(saved["tokens"]) is int
    assert saved["lr"] == float(np.float32(1e-4)) and saved["half"] == float(np.float16(0.1))
    assert saved["done"] is True and np.isnan(saved["nan"]) and type(saved["name"]) is str
    assert saved["z"] == 1 + 2j if "z" in extra else "z" not in saved
    assert saved[3] == [255, (-1,)] and type(saved[3][0]) is int
    assert loaded["data"] == {"batches_drawn": 5}
    assert load_checkpoint(path, model=model, optimizer=optimizer, data=Stateful(None)) == 1
    assert type(extra["val_loss"]) is np.float64  # the caller's dict is not changed


def test_plain_values_keep_their_identity_and_state_dict_metadata():
    state = torch.nn.BatchNorm1d(2).state_dict()
    assert plain_value(state, "model", path="c.pt") is state
    changed = plain_value({**state, "x": np.int64(1)}, "model", path="c.pt")
    assert changed["x"] == 1 and type(changed["x"]) is int


def test_a_nul_in_the_path_is_one_line(tmp_path: Path):
    model, optimizer = model_and_optimizer()
    bad = str(tmp_path / "a\x00b.pt")
    with pytest.raises(ResacctError, match=r"the checkpoint path contains a NUL byte \(\\x00\), which no file name may hold$"):
        save_checkpoint(bad, model=model, optimizer=optimizer, step=1)
    with pytest.raises(CheckpointError, match=r"the checkpoint path contains a NUL byte"):
        load_checkpoint(bad, model=model)
    with pytest.raises(ResacctError, match=r"the token file path contains a NUL byte"):
        write_tokens(bad, [1, 2])
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_would_not_load_back_never_replaces_the_checkpoint(good: Path):
    """The last guard: whatever slips past the per-key check (here a tensor subclass) is read back
    with weights_only before the rename, and refused."""
    before = good.read_bytes()
    model, optimizer = model_and_optimizer()
    with pytest.raises(CheckpointError, match=r"refusing to save: the checkpoint would not load back with torch\.load\(weights_only=True\) \(Unsupported global: .*Marked"):
        save_checkpoint(good, model=model, optimizer=optimizer, step=8, extra={"t": torch.ones(2).as_subclass(Marked)})
    assert_untouched(good, before)


def test_write_checkpoint_file_refuses_what_torch_save_cannot_pickle(good: Path):
    before = good.read_bytes()
    with pytest.raises(CheckpointError, match=r"refusing to save: torch\.save cannot store the checkpoint: Can't pickle .*; nothing was replaced$"):
        write_checkpoint_file(good, {"f": lambda: 0})
    with pytest.raises(CheckpointError, match=r"would not load back .*numpy"):
        write_checkpoint_file(good, {"x": np.float64(1.0)})
    assert_untouched(good, before)


def read_only(path: str) -> object:
    raise OSError(errno.EROFS, "Read-only file system", path)


@pytest.mark.parametrize("what", ["checkpoint", "token file"])
def test_a_read_only_directory_with_a_stale_temporary_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str):
    """A temporary left by a killed writer (pid 2**22 + 1: no such process) could not be removed
    from a read-only directory: the unlink's bare PermissionError escaped."""
    target = tmp_path / ("ckpt.pt" if what == "checkpoint" else "tokens.bin")
    stale = tmp_path / temporary_name(target.name, 2**22 + 1, "0123abcd")
    stale.write_bytes(b"torn")

    def refuse_unlink(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", refuse_unlink)
    monkeypatch.setattr(atomic_files, "_open_temporary", read_only)
    model, optimizer = model_and_optimizer()
    with pytest.raises(ResacctError, match=rf"^{target}: cannot write the {what}: Read-only file system; nothing was written at {target}$"):
        if what == "checkpoint":
            save_checkpoint(target, model=model, optimizer=optimizer, step=1)
        else:
            write_tokens(target, [1, 2])
    assert stale.exists()


def test_saving_still_costs_no_second_read_of_the_tensor_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The read-back guard memory-maps the file: it must not load the tensors into memory."""
    calls: list[dict] = []
    original = torch.load

    def recording_load(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    model, optimizer = model_and_optimizer()
    save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1)
    assert [call.get("mmap") for call in calls] == [True] and all(call.get("weights_only") for call in calls)
    assert os.path.getsize(tmp_path / "ckpt.pt") > 0
