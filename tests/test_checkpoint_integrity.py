"""Checkpoints are read only when intact (SHA-256 trailer) and loaded only when they fit: a
refusal is one line naming the file, and leaves the model, optimizer, data position and
generators exactly as they were (issue 13, "Checkpoints")."""

from __future__ import annotations

import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from resacct.training.checkpoint import CheckpointError, capture_rng_states, load_checkpoint, read_checkpoint, save_checkpoint, write_checkpoint_file
from resacct.training.checkpoint_file import TRAILER_BYTES, TRAILER_MAGIC
from resacct.training.data import TokenBatchSampler
from resacct.training.models import Cruncher
from resacct.training.seeding import preserved_global_rng


def trained(seed: int = 0, *, num_layers: int = 2, sgd: bool = False) -> tuple[Cruncher, torch.optim.Optimizer]:
    generator = torch.Generator().manual_seed(seed)
    with preserved_global_rng():
        torch.manual_seed(seed)
        model = Cruncher(dim=4, num_layers=num_layers)
    optimizer: torch.optim.Optimizer = (
        torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9) if sgd else torch.optim.AdamW(model.parameters(), lr=1e-2)
    )
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(torch.randn(3, 4, generator=generator)), torch.randn(3, 1, generator=generator)).backward()
        optimizer.step()
    return model, optimizer


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> list[torch.Tensor]:
    """Copies of every parameter, buffer and optimizer state tensor (and the torch and numpy
    global generator states: Python's is advanced by the type checker's sampling under pytest)."""
    tensors = [value.detach().clone() for value in model.state_dict().values()]
    if optimizer is not None:
        for state in optimizer.state.values():
            tensors += [value.clone() for value in state.values() if isinstance(value, torch.Tensor)]
        tensors += [torch.tensor([group["lr"] for group in optimizer.param_groups])]
    return [*tensors, torch.get_rng_state(), torch.from_numpy(np.random.get_state()[1].astype(np.int64))]


def unchanged(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return len(before) == len(after) and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(before, after))


def assert_one_line_naming(error: pytest.ExceptionInfo, path: Path) -> None:
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(path)), message


# --- integrity: the SHA-256 trailer ----------------------------------------------------------


def test_checkpoint_ends_in_a_zip_comment_holding_the_archive_sha256(tmp_path: Path):
    import hashlib

    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=3)
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as archive:  # still a zip (the comment is part of the format)
        assert archive.comment == raw[-TRAILER_BYTES:]
    assert raw[-TRAILER_BYTES:].startswith(TRAILER_MAGIC)
    as_torch_wrote_it = raw[: -TRAILER_BYTES - 2] + b"\x00\x00"
    assert raw[-TRAILER_BYTES:][len(TRAILER_MAGIC) :].decode() == hashlib.sha256(as_torch_wrote_it).hexdigest()
    assert torch.load(path, weights_only=True)["step"] == 3  # torch.load reads it as it is


def tensor_byte_ranges(raw: bytes) -> list[range]:
    """Where the tensors' bytes lie in a torch.save archive (its ``<archive>/data/<n>``
    records): a flip there changes a weight or an optimizer moment, the silent kind."""
    import io
    import struct

    ranges = []
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        for info in archive.infolist():
            if "/data/" in info.filename:
                name_bytes, extra_bytes = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
                start = info.header_offset + 30 + name_bytes + extra_bytes
                ranges.append(range(start, start + info.file_size))
    return ranges


def flipped(raw: bytes, rng: random.Random, tensor_ranges: list[range] | None) -> tuple[bytes, int]:
    """``raw`` with one bit flipped: inside ``tensor_ranges`` when given, else anywhere."""
    if tensor_ranges:
        position = rng.choice(rng.choice(tensor_ranges))
    else:
        position = rng.randrange(len(raw))
    damaged = bytearray(raw)
    damaged[position] ^= 1 << rng.randrange(8)
    return bytes(damaged), position


FLIPS = 256


def test_no_bit_flip_loads_a_changed_checkpoint(tmp_path: Path):
    """256 seeded single-bit flips — half anywhere in the file, half inside the tensors' bytes
    (where a flip used to load silently) — are each refused with one line naming the file, and
    the model and optimizer they were to be loaded into stay as they were."""
    model, optimizer = trained()
    original = save_checkpoint(tmp_path / "original.pt", model=model, optimizer=optimizer, step=5).read_bytes()
    target_model, target_optimizer = trained(seed=1)
    path = tmp_path / "flipped.pt"
    rng, tensor_ranges = random.Random(13), tensor_byte_ranges(original)
    before = snapshot(target_model, target_optimizer)
    positions = set()
    for flip in range(FLIPS):
        damaged, position = flipped(original, rng, tensor_ranges if flip % 2 else None)
        path.write_bytes(damaged)
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(path, model=target_model, optimizer=target_optimizer)
        assert_one_line_naming(error, path)
        positions.add(position)
    assert unchanged(before, snapshot(target_model, target_optimizer))  # no refusal changed anything (none is undone)
    assert len(positions) > 200


def test_control_without_the_checksum_flips_in_tensors_load_changed_values(tmp_path: Path):
    """The control: the same flips inside the tensors' bytes of a file without the trailer,
    read with require_checksum=False (what every checkpoint was before format 2), load changed
    tensors silently — the test above would catch a checksum that is not checked."""
    model, optimizer = trained()
    content = torch.load(save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer, step=5), weights_only=True)
    buffer_path = tmp_path / "plain.pt"
    torch.save(content, buffer_path)
    original, expected = buffer_path.read_bytes(), model.state_dict()
    rng, tensor_ranges = random.Random(13), tensor_byte_ranges(original)
    changed = 0
    for _ in range(16):
        damaged, _ = flipped(original, rng, tensor_ranges)
        buffer_path.write_bytes(damaged)
        loaded = read_checkpoint(buffer_path, require_checksum=False)
        moments = [value for state in loaded["optimizer"]["state"].values() for value in state.values()]
        saved_moments = [value for state in content["optimizer"]["state"].values() for value in state.values()]
        changed += any(not torch.equal(loaded["model"][name], expected[name]) for name in expected) or any(
            not torch.equal(a, b) for a, b in zip(moments, saved_moments)
        ) or not torch.equal(loaded["rng"]["torch"], content["rng"]["torch"]) or not torch.equal(loaded["rng"]["numpy"]["keys"], content["rng"]["numpy"]["keys"])
    assert changed >= 12


def test_a_plain_torch_save_file_needs_require_checksum_false(tmp_path: Path):
    model, optimizer = trained()
    content = torch.load(save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer, step=2), weights_only=True)
    plain = tmp_path / "plain.pt"
    torch.save(content, plain)  # a format-1 checkpoint, or one edited with torch.save
    with pytest.raises(CheckpointError, match=r"plain\.pt: no SHA-256 trailer") as error:
        read_checkpoint(plain)
    assert_one_line_naming(error, plain)
    assert read_checkpoint(plain, require_checksum=False)["step"] == 2


def test_a_damaged_trailer_is_refused_even_with_require_checksum_false(tmp_path: Path):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=2)
    raw = bytearray(path.read_bytes())
    raw[-1] = ord("0") if raw[-1] != ord("0") else ord("1")  # the last hex digit of the digest
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"ckpt\.pt: checksum mismatch"):
        read_checkpoint(path, require_checksum=False)


# --- validate everything, then change anything -------------------------------------------------


def test_another_model_shape_is_refused_before_anything_is_loaded(tmp_path: Path):
    """torch's load_state_dict copies every tensor that fits before it reports the misfit; a
    checkpoint of a 2-layer Cruncher into a 3-layer one used to overwrite layers 0, 1 and final."""
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=None, step=1)
    deeper = Cruncher(dim=4, num_layers=3)
    before = snapshot(deeper)
    with pytest.raises(CheckpointError, match=r"ckpt\.pt: the model state does not fit this Cruncher: missing 'layers\.2\.weight', 'layers\.2\.bias'$") as error:
        load_checkpoint(path, model=deeper)
    assert_one_line_naming(error, path)
    assert unchanged(before, snapshot(deeper))
    wider = Cruncher(dim=5, num_layers=2)
    with pytest.raises(CheckpointError, match=r"'layers\.0\.weight' is \(4, 4\) in the checkpoint, \(5, 5\) in the model \(and 4 more\)"):
        load_checkpoint(path, model=wider)


def test_adamw_state_into_sgd_is_refused(tmp_path: Path):
    model, adamw = trained()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=adamw, step=1)
    target, sgd = trained(seed=1, sgd=True)
    before = snapshot(target, sgd)
    with pytest.raises(CheckpointError, match=r"ckpt\.pt: the optimizer state was saved from AdamW; refusing to load it into SGD") as error:
        load_checkpoint(path, model=target, optimizer=sgd)
    assert_one_line_naming(error, path)
    assert unchanged(before, snapshot(target, sgd))


def test_adamw_state_into_sgd_is_refused_without_a_recorded_class(tmp_path: Path):
    model, adamw = trained()
    content = read_checkpoint(save_checkpoint(tmp_path / "c.pt", model=model, optimizer=adamw, step=1))
    del content["optimizer_class"]  # as format 1 wrote it
    path = write_checkpoint_file(tmp_path / "old.pt", content)
    target, sgd = trained(seed=1, sgd=True)
    before = snapshot(target, sgd)
    with pytest.raises(CheckpointError, match=r"the optimizer state is not from a SGD: its param group 0 has \[.*'betas'.*\], a SGD has \[.*'momentum'"):
        load_checkpoint(path, model=target, optimizer=sgd)
    assert unchanged(before, snapshot(target, sgd))


def test_optimizer_state_of_another_shape_is_refused(tmp_path: Path):
    model, adamw = trained()
    content = read_checkpoint(save_checkpoint(tmp_path / "c.pt", model=model, optimizer=adamw, step=1))
    content["optimizer"]["state"][0]["exp_avg"] = torch.zeros(3)
    path = write_checkpoint_file(tmp_path / "bad.pt", content)
    target, target_adamw = trained(seed=1)
    before = snapshot(target, target_adamw)
    with pytest.raises(CheckpointError, match=r"bad\.pt: the optimizer's 'exp_avg' for parameter 0 is \(3,\); the parameter is \(4, 4\)"):
        load_checkpoint(path, model=target, optimizer=target_adamw)
    assert unchanged(before, snapshot(target, target_adamw))


def crafted(tmp_path: Path, change) -> Path:  # type: ignore[no-untyped-def]
    model, optimizer = trained()
    content = read_checkpoint(save_checkpoint(tmp_path / "good.pt", model=model, optimizer=optimizer, step=4))
    change(content)
    return write_checkpoint_file(tmp_path / "crafted.pt", content)


def _set(path: str, value: object):  # type: ignore[no-untyped-def]
    *parents, last = path.split(".")

    def change(content: dict) -> None:
        for key in parents:
            content = content[int(key) if key.isdigit() else key]  # "optimizer.param_groups.0.lr"
        key = int(last) if last.isdigit() else last
        if value is DELETE:
            del content[key]
        else:
            content[key] = value

    return change


DELETE = object()

CRAFTED = [
    ("step-text", _set("step", "abc"), r"field 'step' is 'abc'; expected the number of optimizer steps taken, an int ≥ 0"),
    ("step-negative", _set("step", -3), r"field 'step' is -3; expected"),
    ("step-bool", _set("step", True), r"field 'step' is True; expected"),
    ("step-float", _set("step", 2.5), r"field 'step' is 2\.5; expected"),
    ("rng-missing", _set("rng", DELETE), r"checkpoint is missing 'rng'"),
    ("rng-empty", _set("rng", {}), r"field 'rng' is \{\}; expected a dict with the 'python', 'numpy' and 'torch' generator states"),
    ("rng-python-text", _set("rng.python", "abc"), r"field 'rng\.python' is 'abc'; expected random\.getstate\(\)"),
    ("rng-python-short", _set("rng.python", (3, (1, 2, 3), None)), r"field 'rng\.python' is \(3, \(1, 2, 3\), None\)"),
    ("rng-numpy-keys", _set("rng.numpy.keys", torch.zeros(3, dtype=torch.int64)), r"field 'rng\.numpy\.keys' is a torch\.int64 tensor of shape \(3,\); expected 624"),
    ("rng-numpy-negative", _set("rng.numpy.keys", torch.full((624,), -1, dtype=torch.int64)), r"field 'rng\.numpy\.keys'.*0\.\.2\*\*32-1"),
    ("rng-numpy-position", _set("rng.numpy.position", 999), r"field 'rng\.numpy\.position' is 999; expected an int in 0\.\.624"),
    ("rng-torch-size", _set("rng.torch", torch.zeros(10, dtype=torch.uint8)), r"field 'rng\.torch' is a torch\.uint8 tensor of shape \(10,\); expected torch\.get_rng_state\(\)"),
    ("rng-torch-list", _set("rng.torch", [1, 2]), r"field 'rng\.torch' is \[1, 2\]"),
    ("model-list", _set("model", [1]), r"field 'model' is \[1\]; expected a model\.state_dict\(\)"),
    ("model-value", lambda content: content["model"].__setitem__("final.weight", "weights"), r"field \"model\['final\.weight'\]\" is 'weights'; expected a tensor"),
    ("optimizer-text", _set("optimizer", "adam"), r"field 'optimizer' is 'adam'; expected None or an optimizer\.state_dict\(\)"),
    ("optimizer-group", _set("optimizer.param_groups", [{"params": "all"}]), r"field 'optimizer\.param_groups\[0\]'"),
    ("optimizer-state-key", _set("optimizer.state", {99: {}}), r"field 'optimizer\.state\[99\]'"),
    ("optimizer-class", _set("optimizer_class", 7), r"field 'optimizer_class' is 7; expected the optimizer's class name"),
    ("data-list", _set("data", [1]), r"field 'data' is \[1\]; expected None or a state_dict\(\)"),
    ("extra-list", _set("extra", [1]), r"field 'extra' is \[1\]; expected a dict"),
    ("version-text", _set("format_version", "2"), r"format version '2' is not one this resacct reads"),
    ("version-zero", _set("format_version", 0), r"format version 0 is not one this resacct reads"),
    # issue 26: values of the right container but a wrong kind, not finite, or out of range
    ("step-1e30", _set("step", 10**30), r"field 'step' is 1000000000000000000000000000000; expected the number of optimizer steps taken, an int ≥ 0, at most 2\*\*63 - 1 \(int64\)$"),
    ("lr-text", _set("optimizer.param_groups.0.lr", "fast"), r"field 'optimizer\.param_groups\[0\]\.lr' is 'fast'; expected a finite number ≥ 0$"),
    ("lr-nan", _set("optimizer.param_groups.0.lr", float("nan")), r"field 'optimizer\.param_groups\[0\]\.lr' is nan; expected a finite number ≥ 0$"),
    ("lr-infinite", _set("optimizer.param_groups.0.lr", float("inf")), r"field 'optimizer\.param_groups\[0\]\.lr' is inf; expected a finite number ≥ 0$"),
    ("lr-negative", _set("optimizer.param_groups.0.lr", -0.1), r"field 'optimizer\.param_groups\[0\]\.lr' is -0\.1; expected a finite number ≥ 0$"),
    ("lr-nan-tensor", _set("optimizer.param_groups.0.lr", torch.tensor(float("nan"))), r"'optimizer\.param_groups\[0\]\.lr' is a torch\.float32 tensor of shape \(\) holding nan; expected a finite number ≥ 0$"),
    ("lr-bool", _set("optimizer.param_groups.0.lr", True), r"'optimizer\.param_groups\[0\]\.lr' is True; expected a finite number ≥ 0$"),
    ("weight-decay-nan", _set("optimizer.param_groups.0.weight_decay", float("nan")), r"'optimizer\.param_groups\[0\]\.weight_decay' is nan; expected a finite number ≥ 0$"),
    ("eps-text", _set("optimizer.param_groups.0.eps", "tiny"), r"'optimizer\.param_groups\[0\]\.eps' is 'tiny'; expected a finite number ≥ 0$"),
    ("betas-text", _set("optimizer.param_groups.0.betas", "high"), r"'optimizer\.param_groups\[0\]\.betas' is 'high'; expected a pair of numbers in \[0, 1\)$"),
    ("betas-one", _set("optimizer.param_groups.0.betas", (0.9, 1.0)), r"'optimizer\.param_groups\[0\]\.betas' is \(0\.9, 1\.0\); expected a pair of numbers in \[0, 1\)$"),
    ("betas-three", _set("optimizer.param_groups.0.betas", (0.9, 0.99, 0.5)), r"'optimizer\.param_groups\[0\]\.betas' is \(0\.9, 0\.99, 0\.5\); expected a pair"),
    ("other-hyperparameter-nan", _set("optimizer.param_groups.0.warmup", float("nan")), r"'optimizer\.param_groups\[0\]\.warmup' is nan; expected a finite number$"),
    ("state-step-nan", _set("optimizer.state.0.step", torch.tensor(float("nan"))), r"'optimizer\.state\[0\]\.step' is a torch\.float32 tensor of shape \(\) holding nan; expected the steps this parameter took"),
    ("state-step-negative", _set("optimizer.state.0.step", torch.tensor(-1.0)), r"'optimizer\.state\[0\]\.step' is .* holding -1\.0; expected the steps this parameter took, a number ≥ 0"),
    ("state-step-text", _set("optimizer.state.0.step", "two"), r"'optimizer\.state\[0\]\.step' is 'two'; expected"),
    ("scaler-scale-nan", _set("grad_scaler", {"scale": float("nan"), "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 0}),
     r"field 'grad_scaler\.scale' is nan; expected a finite number ≥ 0$"),
]


@pytest.mark.parametrize(("change", "expected"), [case[1:] for case in CRAFTED], ids=[case[0] for case in CRAFTED])
def test_crafted_field_is_one_line_and_changes_nothing(tmp_path: Path, change, expected: str):  # type: ignore[no-untyped-def]
    path = crafted(tmp_path, change)
    target, optimizer = trained(seed=1)
    before = snapshot(target, optimizer)
    with pytest.raises(CheckpointError, match=expected) as error:
        load_checkpoint(path, model=target, optimizer=optimizer)
    assert_one_line_naming(error, path)
    assert unchanged(before, snapshot(target, optimizer))


def test_a_data_state_that_does_not_fit_puts_the_optimizer_back(tmp_path: Path):
    """The data position is checked by the sampler's own load_state_dict, after the optimizer
    was loaded: the optimizer is put back, and the model (loaded last) is never touched."""
    path = crafted(tmp_path, _set("data", {"generator_state": torch.zeros(3, dtype=torch.uint8), "batches_drawn": 1}))
    target, optimizer = trained(seed=1)
    sampler = TokenBatchSampler(np.arange(100, dtype=np.uint16), 2, 4, seed=0)
    sampler()
    before, sampler_before = snapshot(target, optimizer), sampler.state_dict()
    with pytest.raises(CheckpointError, match=r"crafted\.pt: the data state does not fit this TokenBatchSampler: sampler state 'generator_state'") as error:
        load_checkpoint(path, model=target, optimizer=optimizer, data=sampler)
    assert_one_line_naming(error, path)
    assert unchanged(before, snapshot(target, optimizer))
    assert sampler.batches_drawn == 1 and torch.equal(sampler.state_dict()["generator_state"], sampler_before["generator_state"])


def test_refusal_leaves_the_global_generators_alone(tmp_path: Path):
    path = crafted(tmp_path, _set("rng.torch", torch.zeros(10, dtype=torch.uint8)))
    target, _ = trained(seed=1)
    with preserved_global_rng():
        torch.manual_seed(7), np.random.seed(7)
        states = capture_rng_states()
        with pytest.raises(CheckpointError):
            load_checkpoint(path, model=target)
        assert torch.equal(torch.get_rng_state(), states["torch"])
        assert torch.equal(capture_rng_states()["numpy"]["keys"], states["numpy"]["keys"])


def test_a_hyperparameter_of_another_kind_than_the_optimizer_holds_is_refused(tmp_path: Path):
    """A hyperparameter resacct does not know by name (here a scheduler's 'warmup') must still be
    of the kind the optimizer it is loaded into holds: a number, not "ten"."""
    model, optimizer = trained()
    optimizer.param_groups[0]["warmup"] = 10
    content = read_checkpoint(save_checkpoint(tmp_path / "good.pt", model=model, optimizer=optimizer, step=4))
    content["optimizer"]["param_groups"][0]["warmup"] = "ten"
    path = write_checkpoint_file(tmp_path / "crafted.pt", content)
    target, target_optimizer = trained(seed=1)
    target_optimizer.param_groups[0]["warmup"] = 10
    before = snapshot(target, target_optimizer)
    with pytest.raises(CheckpointError, match=r"crafted\.pt: checkpoint field 'optimizer\.param_groups\[0\]\.warmup' is 'ten'; expected a number, as this AdamW holds \(10\)$") as error:
        load_checkpoint(path, model=target, optimizer=target_optimizer)
    assert_one_line_naming(error, path)
    assert unchanged(before, snapshot(target, target_optimizer)) and target_optimizer.param_groups[0]["warmup"] == 10


def test_a_nan_learning_rate_is_refused_at_save_and_the_good_checkpoint_stays(tmp_path: Path):
    model, optimizer = trained()
    path = save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer, step=4)
    good = path.read_bytes()
    optimizer.param_groups[0]["lr"] = float("nan")
    with pytest.raises(CheckpointError, match=r"c\.pt: refusing to save: checkpoint field 'optimizer\.param_groups\[0\]\.lr' is nan; expected a finite number ≥ 0; nothing was written$"):
        save_checkpoint(path, model=model, optimizer=optimizer, step=5)
    assert path.read_bytes() == good


@pytest.mark.parametrize("name", ["Adadelta", "Adafactor", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "LBFGS", "NAdam", "RAdam", "RMSprop", "Rprop", "SGD"])
def test_every_torch_optimizer_still_round_trips(tmp_path: Path, name: str):
    """The range checks know torch's hyperparameters (Adafactor's eps is a pair with None in it)."""
    if not hasattr(torch.optim, name):
        pytest.skip(f"torch {torch.__version__} has no torch.optim.{name}")
    model, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    make = getattr(torch.optim, name)
    optimizer = make(model.parameters()) if name == "LBFGS" else make(model.parameters(), lr=0.01)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(torch.ones(4, 3)).pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    path = save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer, step=1)
    target_optimizer = make(target.parameters()) if name == "LBFGS" else make(target.parameters(), lr=0.01)
    assert load_checkpoint(path, model=target, optimizer=target_optimizer) == 1


def test_a_step_beyond_int64_is_refused_at_save_in_one_line(tmp_path: Path):
    model, optimizer = trained()
    for step, shown in [(2**63, "9223372036854775808"), (10**5000, "an integer of about 5001 digits")]:
        with pytest.raises(CheckpointError, match=rf"c\.pt: refusing to save: checkpoint field 'step' is {shown}; expected the number of optimizer steps taken, "
                                                  r"an int ≥ 0, at most 2\*\*63 - 1 \(int64\); nothing was written$"):
            save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer, step=step)
    assert not (tmp_path / "c.pt").exists()


def test_a_file_holding_an_integer_too_long_for_torch_names_the_reason(tmp_path: Path):
    """torch.load(weights_only=True) refuses pickle's LONG4 (an int of thousands of digits) over
    three lines; the refusal quotes the line that says why, not an empty one."""
    path = tmp_path / "plain.pt"
    torch.save({"step": 10**5000}, path)
    with pytest.raises(CheckpointError, match=r"Unsupported operand 139") as error:
        read_checkpoint(path, require_checksum=False)
    assert_one_line_naming(error, path)
