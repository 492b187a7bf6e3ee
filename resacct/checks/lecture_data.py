"""Measuring the lecture's data, checkpoint and 2024-only demos (``lecture_02.py``).

Files are written in a temporary directory only. ``get_batch`` is the lecture's own (inputs
only, starts from ``randint(len(data) - sequence_length)``).
"""

from __future__ import annotations

import functools
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from resacct.harness.registry import Outcome, check
from resacct.training.lecture import LectureAdaGrad, LectureCruncher, get_batch, get_num_parameters
from resacct.training.seeding import seed_torch


@check("lecture.get_batch", evidence="measured", quantities=("last_window_start", "window_count"))
def get_batch_result(field: str, data_length: int = 10, batch_size: int = 2, sequence_length: int = 4, draws: int = 2000) -> Outcome:
    """The lecture's ``get_batch`` on ``np.memmap`` of an int32 arange(1, data_length+1) file
    (data_loading, L726-738): ``shape``, ``dtype``, ``type`` (of what it returns) or, over ``draws`` sampled rows,
    ``starts_drawn`` (distinct first tokens − 1). Quantities: the last window's start
    (len − L) and how many windows of length L the data holds (len − L + 1)."""
    seed_torch(0)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "data.npy"
        np.arange(1, data_length + 1, dtype=np.int32).tofile(path)
        data = np.memmap(path, dtype=np.int32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns once per process that a list of arrays is slow
            size = draws if field == "starts_drawn" else batch_size
            batch = get_batch(data, batch_size=size, sequence_length=sequence_length, device="cpu")
        del data
    fields: dict[str, Any] = {
        "shape": lambda: list(batch.shape),
        "dtype": lambda: str(batch.dtype).removeprefix("torch."),
        "type": lambda: type(batch).__name__,
        "starts_drawn": lambda: len(set((batch[:, 0] - 1).tolist())),
    }
    return Outcome(
        measured=fields[field](),
        quantities={"last_window_start": data_length - sequence_length, "window_count": data_length - sequence_length + 1},
    )


@check("lecture.tofile", evidence="measured")
def tofile(field: str) -> Outcome:
    """``orig_data.tofile("data.npy")`` of int32 1..10 (L726-733) in a temporary folder:
    ``file_bytes``, ``np_load`` (what ``np.load`` says: "ok" or the exception's type),
    ``memmap_equal`` (np.memmap(dtype=int32) reads back orig_data), and for a real ``np.save``
    file: ``saved_file_bytes``, ``saved_memmap_length`` (elements np.memmap(dtype=int32) sees)."""
    orig_data = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], dtype=np.int32)
    with tempfile.TemporaryDirectory() as folder:
        raw, saved = Path(folder) / "data.npy", Path(folder) / "saved.npy"
        orig_data.tofile(raw)
        np.save(saved, orig_data)
        try:
            np.load(raw)
            loaded = "ok"
        except Exception as error:  # the measurement is what np.load raises on a headerless file
            loaded = type(error).__name__
        memmapped = np.memmap(raw, dtype=np.int32)
        saved_memmapped = np.memmap(saved, dtype=np.int32)
        results = {
            "file_bytes": raw.stat().st_size,
            "np_load": loaded,
            "memmap_equal": bool(np.array_equal(memmapped, orig_data)),
            "saved_file_bytes": saved.stat().st_size,
            "saved_memmap_length": int(saved_memmapped.shape[0]),
            "saved_memmap_equal": bool(np.array_equal(saved_memmapped, orig_data)),
        }
        del memmapped, saved_memmapped
    return Outcome(measured=results[field])


@check("lecture.token_file_bytes", evidence="measured", quantities=("bytes_per_token",))
def token_file_bytes(tokens: float, vocabulary: int) -> Outcome:
    """Bytes of ``tokens`` token ids stored in the smallest unsigned numpy dtype that holds every
    id below ``vocabulary`` (np.min_scalar_type)."""
    per_token = np.dtype(np.min_scalar_type(vocabulary - 1)).itemsize
    return Outcome(measured=tokens * per_token, quantities={"bytes_per_token": per_token})


@check("lecture.checkpoint", evidence="measured", quantities=("params",))
def checkpoint(field: str, steps: int = 0) -> Outcome:
    """checkpointing (L882-893): Cruncher(64, 3) and the lecture's AdaGrad (after ``steps`` steps),
    ``torch.save({"model": …, "optimizer": …})`` then ``torch.load`` in a temporary folder:
    ``model_keys``, ``model_numel``, ``optimizer_state_entries``, ``optimizer_lr``,
    ``optimizer_param_ids``, ``roundtrip_equal`` (every model tensor loads back equal)."""
    seed_torch(0)
    model = LectureCruncher(dim=64, num_layers=3)
    optimizer = LectureAdaGrad(model.parameters(), lr=0.01)
    for _ in range(steps):
        F.mse_loss(model(torch.randn(2, 64)), torch.randn(2)).backward()
        optimizer.step()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model_checkpoint.pt"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        loaded = torch.load(path)
    results = {
        "model_keys": lambda: list(loaded["model"]),
        "model_numel": lambda: sum(value.numel() for value in loaded["model"].values()),
        "optimizer_state_entries": lambda: len(loaded["optimizer"]["state"]),
        "optimizer_lr": lambda: loaded["optimizer"]["param_groups"][0]["lr"],
        "optimizer_param_ids": lambda: list(loaded["optimizer"]["param_groups"][0]["params"]),
        "roundtrip_equal": lambda: all(torch.equal(value, model.state_dict()[name]) for name, value in loaded["model"].items()),
    }
    return Outcome(measured=results[field](), quantities={"params": get_num_parameters(model)})


@functools.cache
def _dropout_statistics(p: float, elements: int, runs: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Per-run zero fraction and mean of ``F.dropout(torch.ones(runs, elements), p)`` (seed 0), and
    the largest value; cached, as several claims read the same draws."""
    with torch.random.fork_rng():
        seed_torch(0)
        x = F.dropout(torch.ones(runs, elements), p=p)
    return (x == 0).float().mean(dim=1), x.mean(dim=1), float(x.max())


@check("lecture.dropout", evidence="measured", quantities=("p",))
def dropout(field: str, p: float = 0.3, elements: int = 16384, runs: int = 1) -> Outcome:
    """``F.dropout(torch.ones(elements), p)`` (2024 tensor_operations, L262-269), ``runs`` times
    at once (rows of one call, seed 0): ``zero_fraction`` and ``mean`` (of run 0), ``kept_value``
    (the largest value), or how often each of the lecture's two asserts fails over the runs:
    ``zero_assert_failures`` (|zeros/n − 0.3| > 0.01) and ``mean_assert_failures`` (|mean − 1| > 0.02)."""
    zero_fraction, mean, kept_value = _dropout_statistics(p, elements, runs)
    results = {
        "zero_fraction": lambda: float(zero_fraction[0]),
        "mean": lambda: float(mean[0]),
        "kept_value": lambda: kept_value,
        "zero_assert_failures": lambda: float(((zero_fraction - 0.3).abs() > 0.01 + 1e-8 * 0.3).float().mean()),
        "mean_assert_failures": lambda: float(((mean - 1.0).abs() > 0.02 + 1e-5).float().mean()),
    }
    return Outcome(measured=results[field](), quantities={"p": p})


@check("lecture.embedding", evidence="measured", quantities=("vocabulary", "hidden"))
def embedding(field: str, vocabulary: int = 128, hidden: int = 64, batch: int = 16, length: int = 32) -> Outcome:
    """module_embeddings (2024, L584-598): ``nn.Embedding(V, H)`` applied to randint(V, (B, L)):
    ``is_parameter``, ``output_shape``, ``numel`` (of the weight), ``weight_std``, ``rows_equal``
    (embedding(x) equals weight[x])."""
    seed_torch(0)
    layer = nn.Embedding(vocabulary, hidden)
    x = torch.randint(vocabulary, (batch, length))
    output = layer(x)
    results = {
        "is_parameter": lambda: isinstance(layer.weight, nn.Parameter),
        "output_shape": lambda: list(output.shape),
        "numel": lambda: layer.weight.numel(),
        "weight_std": lambda: float(layer.weight.detach().std()),
        "rows_equal": lambda: torch.equal(output, layer.weight[x]),
    }
    return Outcome(measured=results[field](), quantities={"vocabulary": vocabulary, "hidden": hidden})


@check("lecture.unscaled_output_std_ratio", evidence="measured")
def unscaled_output_std_ratio(input_dim: int, hidden_dim: int, other_hidden_dim: int) -> Outcome:
    """std of x @ w (x ~ randn(input_dim), w ~ randn(input_dim, h), unscaled) at h = hidden_dim ÷
    at h = other_hidden_dim, each over 4096 output elements (module_parameters, 2024 L566-573)."""
    return Outcome(measured=_unscaled_output_std(input_dim, hidden_dim) / _unscaled_output_std(input_dim, other_hidden_dim))


@functools.cache
def _unscaled_output_std(input_dim: int, hidden: int) -> float:
    """std of x @ w over ≥ 4096 outputs: x ~ randn(rows, input_dim), w ~ randn(input_dim, hidden)."""
    generator = torch.Generator().manual_seed(hidden)
    rows = max(1, 4096 // hidden)
    x = torch.randn(rows, input_dim, generator=generator)
    w = torch.randn(input_dim, hidden, generator=generator)
    return float((x @ w).std())


@check("lecture.kaiming_normal_warning", evidence="measured")
def kaiming_normal_warning() -> Outcome:
    """The first warning ``nn.init.kaiming_normal(x)`` (2024 tensors_basics, L82) raises, up to its
    first period, or "none"."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nn.init.kaiming_normal(torch.empty(16, 32))
    return Outcome(measured=str(caught[0].message).split(". ")[0] if caught else "none")
