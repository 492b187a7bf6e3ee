"""The GPU step time calibrated on a board's record (resacct/account/gpu/timing/step_time_calibrated.py): what a traced op
says of itself (a kernel or not, a cuBLAS call's leading dimensions), the fits recovering a known board, and the
recorded claim blind to the judged step's own profile and time."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import resacct.checks.gpu_record_steps as record_steps
from resacct.account.gpu.tracing.op_costs import OpCost, OpCosts
from resacct.account.gpu.timing.step_time_calibrated import calibrate_step_times, matmul_class, predict_calibrated_seconds, profile_matmul_rows
from resacct.errors import ResacctError

RATE, PER_CALL = 500e12, 4e-6  # the synthetic board's aligned bf16 matmuls: t = FLOPs ÷ RATE + PER_CALL
SLOW = 100e12  # and its unaligned ones
BANDWIDTH = 4e12


def test_a_view_launches_no_kernel_and_a_matmul_knows_its_leading_dimensions() -> None:
    with OpCosts() as costs:
        odd = torch.randn(16, 50, dtype=torch.bfloat16)  # 50 columns: its leading dimension is not a multiple of 8
        weight = torch.randn(64, 16, dtype=torch.bfloat16)
        odd.t() @ torch.randn(16, 8, dtype=torch.bfloat16)  # a transposed operand: its leading dimension is its 50 rows
        torch.randn(8, 16, dtype=torch.bfloat16) @ weight.t()  # weight.t(): leading dimension 16 — aligned
    ops = {op.op: op for op in costs.ops if op.matmul is None}
    assert ops["aten.t.default"].kernel is False and ops["aten.randn.default"].kernel is True
    transposed, aligned = [op.matmul for op in costs.ops if op.matmul is not None]
    assert transposed == (50, 8, 16, "bfloat16", False) and aligned == (8, 64, 16, "bfloat16", True)
    assert matmul_class("float", False) == "fp32" and matmul_class("bfloat16", False) == "unaligned"


def _entry(rows: list[tuple[int, int, int, bool]], other_sec: float, idle_sec: float, ops: int) -> dict[str, Any]:
    """A recorded step of the synthetic board: its profile's matmul rows (m, n, k, aligned), one memory-bound row, its time."""
    profile = []
    for m, n, k, aligned in rows:
        seconds = 2 * m * n * k / (RATE if aligned else SLOW) + (PER_CALL if aligned else 0.0)
        profile.append({"name": "aten::mm", "shapes": [[m, k], [k, n]], "dtypes": ["c10::BFloat16", "c10::BFloat16"], "calls": 1,
                        "self_device_us": seconds * 1e6})
    profile.append({"name": "aten::mul", "shapes": [[1]], "dtypes": ["c10::BFloat16"], "calls": 1, "self_device_us": other_sec * 1e6})
    busy = sum(row["self_device_us"] for row in profile) * 1e-6
    return {"ops": profile, "step_time_sec": {"median": busy + idle_sec * ops}}


def _traced(rows: list[tuple[int, int, int, bool]], memory_bytes: list[int]) -> list[OpCost]:
    ops = [OpCost("aten.mm.default", 2 * m * n * k, 0, True, (m, n, k, "bfloat16", aligned)) for m, n, k, aligned in rows]
    return ops + [OpCost("aten.mul.Tensor", 0, size, True) for size in memory_bytes] + [OpCost("aten.view.default", 0, 10**9, False)]


def _board_step(rows: list[tuple[int, int, int, bool]], memory_bytes: list[int]) -> tuple[dict[str, Any], list[OpCost]]:
    """A step whose other kernels take 1.5 × their bytes ÷ the bandwidth + 2 µs each, its host idle 1 µs per traced op."""
    traced = _traced(rows, memory_bytes)
    other = sum(1.5 * size / BANDWIDTH + 2e-6 for size in memory_bytes)
    return _entry(rows, other, 1e-6, len(traced)), traced


STEPS = {"a": ([(4096, 4096, 1024, True), (2048, 2048, 2048, True), (2048, 50257, 768, False)], [10**8, 3 * 10**8, 10**6] * 5),
         "b": ([(1024, 8192, 4096, True), (256, 256, 256, True), (4096, 50257, 768, False)], [2 * 10**8, 10**7] * 9),
         "c": ([(8192, 1024, 1024, True), (512, 4096, 512, True), (4096, 768, 50257, False)], [5 * 10**7] * 30)}


def test_the_fits_recover_the_board_and_predict_a_step_they_never_saw() -> None:
    board = {name: _board_step(*shapes) for name, shapes in STEPS.items()}
    times = calibrate_step_times([(name, *board[name], RATE) for name in ("a", "b")], bandwidth_bytes_per_sec=BANDWIDTH)
    assert times.matmul["aligned"].flops_per_sec == pytest.approx(RATE, rel=1e-6)
    assert times.matmul["aligned"].sec_per_call == pytest.approx(PER_CALL, rel=1e-6)
    assert times.matmul["unaligned"].flops_per_sec == pytest.approx(SLOW, rel=1e-6)
    assert times.memory_factor == pytest.approx(1.5, rel=1e-6) and times.sec_per_kernel == pytest.approx(2e-6, rel=1e-6)
    assert times.idle_sec_per_op == pytest.approx(1e-6, rel=1e-6) and times.calibrated_on == ("a", "b")
    entry, traced = board["c"]
    gpu, step = predict_calibrated_seconds(traced, times, fallback_flops_per_sec=RATE)
    assert step == pytest.approx(entry["step_time_sec"]["median"], rel=1e-6)  # the view: no kernel, no seconds
    assert [row[0] for row in profile_matmul_rows(entry)] == ["aligned", "aligned", "unaligned"]
    with pytest.raises(ResacctError, match="expected at least two recorded steps"):
        calibrate_step_times([("a", *board["a"], RATE)], bandwidth_bytes_per_sec=BANDWIDTH)


def test_the_recorded_claim_never_reads_the_judged_steps_profile_or_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board = {name: _board_step(*shapes) for name, shapes in STEPS.items()}
    record = {"format": "resacct-gpu-record/1", "when": "2026-11-30T00:00:00+00:00", "board": "NVIDIA H200", "torch": "2.11.0+cu130",
              "capability": "9.0", "dry_run": False, "serving": [], "library_probe": {}, "allocator_settings": {},
              "ceilings": {"matmul": {"bf16": {"max_flops_per_sec": RATE}}, "copy": {"bandwidth_bytes_per_sec": BANDWIDTH},
                           "launch": {"per_launch_sec": 5e-6}},
              "steps": [{"name": name, "recipe": "bf16", "trace": [], "window_start": 0, "max_memory_allocated": 1, "max_memory_reserved": 1, **entry}
                        for name, (entry, _) in board.items()]}

    def write(path: Path, content: dict[str, Any]) -> str:
        with gzip.open(path, "wt") as handle:
            json.dump(content, handle)
        return str(path)

    monkeypatch.setattr(record_steps, "_prediction", lambda _record, step: (0, 0, board[step][1], "flash"))
    first = write(tmp_path / "one-record.json.gz", record)
    judged = record_steps.board_step_time_calibrated(first, "c", ["a", "b"])
    assert judged.quantities["predicted_step_sec"] == pytest.approx(judged.measured, rel=1e-6)
    assert judged.quantities["calibrated_on"] == "a, b" and "aligned" in judged.quantities["matmul_fits"]
    # every number a plain Python float: xdist and report.json serialise them (a numpy float64 crashed a worker)
    assert all(type(value) in (int, float, str, dict) for value in judged.quantities.values()), judged.quantities
    assert type(judged.quantities["predicted_step_sec"]) is float
    changed = json.loads(json.dumps(record))
    changed["steps"][2]["ops"] = changed["steps"][0]["ops"]  # the judged step's own profile and time, replaced
    changed["steps"][2]["step_time_sec"] = {"median": 9.0}
    again = record_steps.board_step_time_calibrated(write(tmp_path / "two-record.json.gz", changed), "c", ["a", "b"])
    assert again.quantities["predicted_step_sec"] == judged.quantities["predicted_step_sec"] and again.measured == 9.0
    with pytest.raises(ResacctError, match="calibrate_on names 'c', the step judged"):
        record_steps.board_step_time_calibrated(first, "c", ["a", "c"])


def test_attention_is_priced_at_its_familys_rate_in_its_precision_from_the_calibration_steps() -> None:
    """A fused attention call's FLOPs over the rate its family ran at, in its precision, in the calibration steps' profiles
    (the H200's bf16 flash ran ~305 TFLOP/s against a best matmul rate of 805, its fp32 efficient kernel ~49); a family or
    a precision the steps never ran keeps the best matmul rate in its format — a bf16 efficient call is never priced at
    the fp32 efficient kernel's rate (16x too slow)."""
    from resacct.account.gpu.timing.step_time_calibrated import CalibratedTimes, _attention_rates, predict_calibrated_seconds
    from resacct.account.gpu.tracing.op_costs import OpCost

    forward = OpCost("aten._scaled_dot_product_flash_attention.default", flops=int(3e11), bytes=1, dtype="bfloat16")
    backward = OpCost("aten._scaled_dot_product_flash_attention_backward.default", flops=int(6e11), bytes=1, dtype="bfloat16")
    efficient_fp32 = OpCost("aten._scaled_dot_product_efficient_attention.default", flops=int(5e10), bytes=1, dtype="float32")
    profile = {"ops": [{"name": "aten::_flash_attention_forward", "self_device_us": 1000.0, "calls": 1, "dtypes": ["c10::BFloat16"]},
                       {"name": "aten::_flash_attention_backward", "self_device_us": 2000.0, "calls": 1, "dtypes": ["c10::BFloat16"]},
                       {"name": "aten::_efficient_attention_forward", "self_device_us": 1000.0, "calls": 1, "dtypes": ["float"]},
                       {"name": "aten::_scaled_dot_product_flash_attention", "self_device_us": 0.0, "calls": 1, "dtypes": ["c10::BFloat16"]}]}
    rates = _attention_rates([("step", profile, [forward, backward, efficient_fp32], 8e14)])
    assert rates == {"flash/16-bit": 3e14, "efficient/fp32": 5e13}
    times = CalibratedTimes({}, 1.0, 0.0, 0.0, 1e12, ("step",), rates)
    efficient_bf16 = OpCost("aten._scaled_dot_product_efficient_attention.default", flops=int(8e11), bytes=1, dtype="bfloat16")
    kernels, _ = predict_calibrated_seconds([forward, efficient_bf16], times, fallback_flops_per_sec=8e14)
    assert kernels == pytest.approx(1e-3 + 1e-3)  # flash at its fitted rate, bf16 efficient at the fallback (only fp32 efficient fitted)
    kernels, _ = predict_calibrated_seconds([efficient_fp32], times, fallback_flops_per_sec=5.12e13)
    assert kernels == pytest.approx(1e-3)  # fp32 efficient at its own fitted rate


def test_a_traced_fused_attention_op_carries_its_dtype_and_no_other_op_does() -> None:
    import torch

    if torch.__version__ < "2.8":
        pytest.skip("flash attention's meta kernel needs torch >= 2.8")

    from resacct.account.gpu.tracing.cuda_step import sdpa_routing
    from resacct.account.gpu.tracing.op_costs import OpCosts

    query = torch.empty(2, 4, 64, 32, device="meta", dtype=torch.bfloat16, requires_grad=True)
    with OpCosts() as costs, sdpa_routing("flash", (9, 0)):
        out = torch.nn.functional.scaled_dot_product_attention(query, query, query, is_causal=True)
        (out.float() * 2).sum().backward()
    dtypes = {op.op: op.dtype for op in costs.ops}
    assert dtypes["aten._scaled_dot_product_flash_attention.default"] == "bfloat16"
    assert dtypes["aten._scaled_dot_product_flash_attention_backward.default"] == "bfloat16"
    assert all(dtype is None for name, dtype in dtypes.items() if "attention" not in name)


def test_a_matmul_that_moves_more_than_it_computes_is_priced_at_its_bytes() -> None:
    """The roofline's memory roof under every cuBLAS call: a mixture of experts' ``batched_mm`` outer products (512 tokens'
    4,096 × 1 by 1 × 1,024 each, one call) compute 4.3 GFLOP — 43 µs at an unaligned call's 100 TFLOP/s — but write 4.3 GB, ~1 ms at
    4 TB/s; FLOPs alone priced the H200 record's step at 0.89 of the board's (docs/gpu.md, session 30). Traced on meta,
    the op's bytes are its operands' and output's; a compute-bound call keeps its FLOPs' price."""
    from resacct.account.gpu.timing.step_time_calibrated import CalibratedTimes, MatmulFit

    with OpCosts() as costs:
        left = torch.empty(512, 4096, 1, dtype=torch.bfloat16, device="meta")
        right = torch.empty(512, 1, 1024, dtype=torch.bfloat16, device="meta")
        torch.bmm(left, right)
        torch.mm(torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta"), torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta"))
    outer, square = [op for op in costs.ops if op.matmul is not None]
    moved = 2 * (512 * 4096 + 512 * 1024 + 512 * 4096 * 1024)  # bf16 operands and output, counted from the shapes here
    assert outer.bytes == moved and outer.flops == 2 * 512 * 4096 * 1024
    fits = {"aligned": MatmulFit(RATE, PER_CALL), "unaligned": MatmulFit(SLOW, 0.0)}
    times = CalibratedTimes(fits, 1.5, 0.0, 0.0, BANDWIDTH, ("a", "b"))
    cls = matmul_class(outer.matmul[3], outer.matmul[4])
    kernels, _ = predict_calibrated_seconds([outer], times, fallback_flops_per_sec=RATE)
    assert kernels == pytest.approx(moved / BANDWIDTH + fits[cls].sec_per_call) and kernels > 20 * outer.flops / fits[cls].flops_per_sec
    kernels, _ = predict_calibrated_seconds([square], times, fallback_flops_per_sec=RATE)
    assert kernels == pytest.approx(2 * 4096**3 / RATE + PER_CALL)  # 275 µs of FLOPs against 25 µs of bytes: the FLOPs price it
    bare, _ = predict_calibrated_seconds([outer], CalibratedTimes({}, 1.5, 0.0, 0.0, BANDWIDTH, ("a", "b")), fallback_flops_per_sec=RATE)
    assert bare == pytest.approx(moved / BANDWIDTH)  # no fitted class: the fallback rate, under the same roof


def test_an_answer_says_which_of_its_ops_no_calibration_step_ran() -> None:
    """A step with grouped GEMMs (a mixture of experts grouped by expert) or ops that wait for the device is priced by a
    model fitted on dense steps only: the answer's lines say so, with the count, and point at the record's mixture-of-
    experts claims; a dense step's lines do not."""
    from resacct.account.gpu.timing.board_rates import step_seconds
    from resacct.account.gpu.timing.step_time_calibrated import outside_calibration
    from resacct.facts.hardware import get_accelerator

    dense = [OpCost("aten.mm.default", 2 * 256**3, 3 * 2 * 256**2, True, (256, 256, 256, "bfloat16", True)),
             OpCost("aten.add.Tensor", 0, 3 * 2 * 256**2, True)]
    grouped = [OpCost("aten._grouped_mm.default", 2 * 256**3, 3 * 2 * 256**2, True) for _ in range(3)]
    waiting = [OpCost("aten.nonzero.default", 0, 1024, True)]
    assert outside_calibration(dense) == []
    assert outside_calibration(dense + grouped + waiting) == [
        "grouped GEMM calls ×3 (experts grouped by expert; priced at the best matmul rate: no dense step ran one)",
        "ops that wait for the device ×1 (a routing's nonzero: the host stalls; not modelled)"]
    h200 = get_accelerator("h200-sxm")
    _, plain = step_seconds(dense, h200, "bf16")
    _, flagged = step_seconds(dense + grouped, h200, "bf16")
    assert not any("outside what it was fitted on" in line for line in plain)
    (line,) = [line for line in flagged if "outside what it was fitted on" in line]
    assert line.startswith("outside what it was fitted on: grouped GEMM calls ×3 (") and "-k mixtral-small" in line
    # a mixture of experts whose experts the trace ran as plain matmuls (transformers' fallback): said as one
    _, moe = step_seconds(dense, h200, "bf16", experts=True)
    assert [line for line in moe if "outside what it was fitted on" in line] == [
        "outside what it was fitted on: a mixture of experts' routing and experts (the model was fitted on dense steps only) — the record's "
        "mixture-of-experts steps test the model there: `resacct verify --area gpu_recorded -k mixtral-small` (docs/gpu.md)"]
