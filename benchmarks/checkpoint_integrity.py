"""What a checkpoint's SHA-256 trailer catches, and what it costs.

    OMP_NUM_THREADS=1 python benchmarks/checkpoint_integrity.py                 # 600 flips, 64 MiB model
    OMP_NUM_THREADS=1 python benchmarks/checkpoint_integrity.py --flips 200 --model-mib 16 --repeats 3

1. Bit flips: a small checkpoint (Cruncher dim 16, 2 layers, AdamW after 2 steps) gets
   ``--flips`` seeded single-bit flips anywhere in the file. Each damaged file is read
   (a) as resacct reads it now (``read_checkpoint``: trailer checked) and (b) as a checkpoint
   without the trailer was read before format 2 (the same content written by ``torch.save``,
   ``read_checkpoint(require_checksum=False)``). Counted: refused, loaded identical, loaded
   with different weights, loaded with different optimizer state.
2. Cost: ``save_checkpoint`` / ``load_checkpoint`` of a model of ``--model-mib`` MiB of float32
   parameters (AdamW state: 3× that on disk) beside bare ``torch.save`` / ``torch.load`` of the
   same dict (no fsync, no checks) and a bare SHA-256 of the file; ``read_checkpoint`` is the
   check plus the load, ``load_checkpoint`` also copies into the model and optimizer. The median
   of ``--repeats`` runs, in a temporary directory (page cache warm).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from resacct.training.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from resacct.training.models import Cruncher


def _trained(dim: int, num_layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Cruncher(dim=dim, num_layers=num_layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        F.mse_loss(model(torch.randn(4, dim)), torch.randn(4, 1)).backward()
        optimizer.step()
    return model, optimizer


def _tensors_differ(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, dict):
        return not isinstance(b, dict) or a.keys() != b.keys() or any(_tensors_differ(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return not isinstance(b, (list, tuple)) or len(a) != len(b) or any(_tensors_differ(x, y) for x, y in zip(a, b))
    return a != b


def _outcome(path: Path, original: dict, require_checksum: bool) -> str:
    try:
        loaded = read_checkpoint(path, require_checksum=require_checksum)
    except CheckpointError:
        return "refused"
    if _tensors_differ(original["model"], loaded["model"]):
        return "different weights"
    if _tensors_differ(original["optimizer"], loaded["optimizer"]):
        return "different optimizer state"
    return "loaded identical" if not _tensors_differ(original, loaded) else "other field different"


def bit_flips(flips: int, directory: Path) -> None:
    model, optimizer = _trained(16, 2)
    checked = save_checkpoint(directory / "checked.pt", model=model, optimizer=optimizer, step=2)
    original = read_checkpoint(checked)
    unchecked = directory / "unchecked.pt"
    torch.save(original, unchecked)
    for label, source, require in (("with the SHA-256 trailer", checked, True), ("without (before format 2)", unchecked, False)):
        raw, damaged_path, rng, counts = source.read_bytes(), directory / "damaged.pt", random.Random(13), {}
        for _ in range(flips):
            damaged = bytearray(raw)
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            damaged_path.write_bytes(bytes(damaged))
            outcome = _outcome(damaged_path, original, require)
            counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{flips} flips of a {len(raw)}-byte checkpoint, {label}: {dict(sorted(counts.items()))}")


def _median_seconds(run, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cost(model_mib: int, repeats: int, directory: Path) -> None:
    dim = int((model_mib * 2**20 / 4 / 2) ** 0.5)
    model, optimizer = _trained(dim, 2)
    path, bare = directory / "resacct.pt", directory / "bare.pt"
    save_checkpoint(path, model=model, optimizer=optimizer, step=1)
    content = read_checkpoint(path)
    rows = [
        ("save_checkpoint", lambda: save_checkpoint(path, model=model, optimizer=optimizer, step=1)),
        ("torch.save (same dict)", lambda: torch.save(content, bare)),
        ("load_checkpoint", lambda: load_checkpoint(path, model=model, optimizer=optimizer, restore_rng=False)),
        ("read_checkpoint", lambda: read_checkpoint(path)),
        ("torch.load (weights_only)", lambda: torch.load(bare, weights_only=True)),
        ("hashlib.sha256 of the file", lambda: hashlib.file_digest(open(path, "rb"), "sha256")),
    ]
    print(f"model {sum(p.numel() for p in model.parameters()) * 4 / 2**20:.1f} MiB float32, file {path.stat().st_size / 2**20:.1f} MiB:")
    for name, run in rows:
        run()  # warm-up
        print(f"  {name:28s} {_median_seconds(run, repeats) * 1e3:8.1f} ms (median of {repeats})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flips", type=int, default=600)
    parser.add_argument("--model-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        bit_flips(arguments.flips, Path(directory))
        cost(arguments.model_mib, arguments.repeats, Path(directory))


if __name__ == "__main__":
    main()
