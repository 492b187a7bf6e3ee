"""The GPU step's anchors (issue 31): on the same steps the committed H100 record holds, resacct's
predictions beside torch's own tools and beside what the board measured.

    .venv/bin/python benchmarks/gpu_anchors.py            # both tables (about a minute on 2 cores)
    .venv/bin/python benchmarks/gpu_anchors.py --json     # the same numbers as JSON

**Memory** (``max_memory_allocated`` above the step's start, fp32, AdamW, math attention):

- resacct: :func:`~resacct.account.gpu.tracing.cuda_step.predict_cuda_step_memory` (meta tensors fed to the
  CUDA caching allocator model) — what the ``gpu_recorded`` claims check;
- MemTracker (``torch.distributed._tools.mem_tracker``): the same steady step (the optimizer's state
  made first) under ``FakeTensorMode``, its ``peak`` snapshot less its snapshot at the step's start.
  On **fake CPU tensors**: on this CPU-only torch a fake ``cuda`` tensor that autograd records aborts
  the process ("PyTorch is not linked with support for cuda devices" from autograd's
  ``InputMetadata``), so MemTracker cannot see the tensors as CUDA ones and does not round them to
  its 512-byte ``_PYTORCH_MIN_ALLOCATE`` (it rounds only ``cuda`` storages).

**Step time** (median of the recorded steps, fp32 with TF32 off):

- resacct: the per-op roofline of :mod:`resacct.account.gpu.timing.step_time` (the record's fp32 matmul rate,
  0.8 × the datasheet's bandwidth, a per-op host overhead calibrated on the record's gpt-tiny step) —
  the ``gpu_recorded`` step-time claims;
- RuntimeEstimator (``torch.distributed._tools.runtime_estimator``, ``operator-level-cost-model``: its
  roofline) over the same step on fake tensors. It asks the GPU for its peak and bandwidth
  (``torch.cuda.is_available()``, ``get_device_tflops``, ``get_gpu_dram_gbps``); here those three
  are answered with the H100 SXM datasheet — 67 TFLOP/s fp32 (989.5 bf16) and 3,350 GB/s — and
  nothing else of it is changed (it takes 75 % of that peak and counts FLOPs as MACs ÷ 2: torch's code).

Ratios are predicted ÷ recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

RECORD = "docs/gpu/2026-11-26-h100-80gb-hbm3.json"
H100_TFLOPS = {torch.float32: 67.0, torch.bfloat16: 989.5, torch.float16: 989.5}
H100_DRAM_GBPS = 3350


def _loss(model: Any, batch: Any) -> Any:
    from resacct.measurement.activation_checkpointing import gpt_loss

    return gpt_loss(model, *batch)


def _gpt(config: dict[str, Any], device: str) -> Any:
    from resacct.training.gpt import GPTConfig, build_gpt

    return build_gpt(GPTConfig(**{key: value for key, value in config.items() if key != "attention"}), device=device, seed=None)


def _fake_step(config: dict[str, Any], batch: int, seq: int, optimizer: bool) -> tuple[Any, Any, Any, Any]:
    """FakeTensorMode, the GPT on fake CPU tensors, its tokens, AdamW (foreach, its state made) or None."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from resacct.measurement.memory_timeline import make_optimizer_state

    mode = FakeTensorMode()
    with mode:
        net = _gpt(config, "cpu")
        tokens = torch.zeros(batch, seq, dtype=torch.long)
        adamw = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=True) if optimizer else None
        if adamw is not None:
            make_optimizer_state(net, adamw)
    return mode, net, tokens, adamw


def memtracker_peak_above_start(config: dict[str, Any], batch: int, seq: int, optimizer: bool) -> int:
    """MemTracker's peak over one steady step less what it counted at the step's start (fake CPU tensors)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from resacct.measurement.memory_timeline import run_training_step

    mode, net, tokens, adamw = _fake_step(config, batch, seq, optimizer)
    tracker = MemTracker()
    with mode:
        tracker.track_external(net, tokens, *([adamw] if adamw is not None else []))
        with tracker:
            start = sum(per_device["Total"] for per_device in tracker.get_tracker_snapshot("current").values())
            tracker.reset_mod_stats()
            if adamw is None:
                _loss(net, (tokens, tokens)).backward()
            else:
                run_training_step(net, (tokens, tokens), _loss, adamw)
        peak = sum(per_device["Total"] for per_device in tracker.get_tracker_snapshot("peak").values())
    return int(peak - start)


def runtime_estimator_ms(config: dict[str, Any], batch: int, seq: int) -> float:
    """RuntimeEstimator's roofline of one steady fp32 AdamW step, the H100's datasheet as its device."""
    import torch.utils._runtime_estimation as estimation
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator

    from resacct.measurement.memory_timeline import run_training_step

    mode, net, tokens, adamw = _fake_step(config, batch, seq, True)
    estimator = RuntimeEstimator()
    # is_available() is faked, so Adam's graph-capture check asks the CUDA runtime whether a stream is
    # capturing: a CUDA build of torch without a driver (torch 2.11+cu130 here) raises there; nothing captures
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.is_current_stream_capturing", return_value=False), \
            mock.patch.object(estimation, "get_device_tflops", lambda dtype: H100_TFLOPS[dtype]), \
            mock.patch.object(estimation, "get_gpu_dram_gbps", lambda: H100_DRAM_GBPS), \
            mock.patch("builtins.print"), mode, estimator("operator-level-cost-model"):
        run_training_step(net, (tokens, tokens), _loss, adamw)
    return float(estimator.total_runtime)


def memory_rows() -> list[dict[str, Any]]:
    from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory
    from resacct.account.gpu.records.recorded import load_gpu_record, recorded_step, recorded_value
    from resacct.training.gpt import get_gpt_config

    record = load_gpu_record(RECORD)
    tiny = {key: value for key, value in vars(get_gpt_config("gpt-tiny")).items() if key != "attention"}
    rows = []
    cases = [("gpt-tiny 8 × 128, forward + backward", tiny, 8, 128, False, recorded_value(RECORD, record, "gpu_claims", "gpu-step-peak-predicted"))]
    for step in ("gpt-tiny", "gpt-small-cpu", "gpt2-small"):
        entry = recorded_step(RECORD, record, step)
        cases.append((f"{step} {entry['batch']} × {entry['seq']}, training step", entry["config"], entry["batch"], entry["seq"], True, entry["peak_bytes"]))
    for name, config, batch, seq, optimizer, measured in cases:
        tokens = torch.zeros(batch, seq, dtype=torch.long)
        predicted = predict_cuda_step_memory(_gpt(config, "meta"), (tokens, tokens), _loss, None if not optimizer else
                                             (lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True))).peak_above_start_bytes
        tracked = memtracker_peak_above_start(config, batch, seq, optimizer)
        rows.append({"step": name, "resacct_bytes": predicted, "memtracker_bytes": tracked, "recorded_bytes": int(measured),
                     "resacct_ratio": predicted / measured, "memtracker_ratio": tracked / measured})
    return rows


def time_rows() -> list[dict[str, Any]]:
    from resacct.checks.gpu_recorded import step_time
    from resacct.account.gpu.records.recorded import load_gpu_record, recorded_step
    from resacct.training.gpt import get_gpt_config

    record = load_gpu_record(RECORD)
    small = {key: value for key, value in vars(get_gpt_config("gpt2-small")).items() if key != "attention"}
    cases = [("gpt-small-cpu 8 × 256", {"step": "gpt-small-cpu"}, recorded_step(RECORD, record, "gpt-small-cpu")["config"], 8, 256),
             ("gpt2-small 8 × 512", {"claim": "gpu-step-time-at-least-flops-over-peak", "model": "gpt2-small", "batch": 8, "seq": 512}, small, 8, 512),
             ("gpt2-small 8 × 1024", {"step": "gpt2-small"}, recorded_step(RECORD, record, "gpt2-small")["config"], 8, 1024)]
    rows = []
    for name, given, config, batch, seq in cases:
        outcome = step_time(record=RECORD, calibrate_on="gpt-tiny", **given)
        measured_ms, predicted_ms = float(outcome.measured) * 1e3, float(outcome.quantities["predicted_step_sec"]) * 1e3
        estimated_ms = runtime_estimator_ms(config, batch, seq)
        rows.append({"step": name, "resacct_ms": predicted_ms, "runtime_estimator_ms": estimated_ms, "recorded_ms": measured_ms,
                     "resacct_ratio": predicted_ms / measured_ms, "runtime_estimator_ratio": estimated_ms / measured_ms})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    memory, times = memory_rows(), time_rows()
    if args.json:
        print(json.dumps({"record": RECORD, "memory": memory, "time": times}, indent=1))
        return 0
    print(f"record: {RECORD} (NVIDIA H100 80GB HBM3, torch 2.11.0+cu130); this run: torch {torch.__version__}")
    print("\nmax_memory_allocated above the step's start (bytes; ratio = predicted ÷ recorded)")
    print(f"{'step':40} {'resacct':>15} {'ratio':>7} {'MemTracker':>15} {'ratio':>7} {'recorded':>15}")
    for row in memory:
        print(f"{row['step']:40} {row['resacct_bytes']:>15,} {row['resacct_ratio']:>7.4f} {row['memtracker_bytes']:>15,} "
              f"{row['memtracker_ratio']:>7.4f} {row['recorded_bytes']:>15,}")
    print("\nstep time (ms; ratio = predicted ÷ recorded median)")
    print(f"{'step':40} {'resacct':>10} {'ratio':>7} {'RuntimeEstimator':>17} {'ratio':>7} {'recorded':>10}")
    for row in times:
        print(f"{row['step']:40} {row['resacct_ms']:>10.2f} {row['resacct_ratio']:>7.3f} {row['runtime_estimator_ms']:>17.2f} "
              f"{row['runtime_estimator_ratio']:>7.3f} {row['recorded_ms']:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
