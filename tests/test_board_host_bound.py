"""benchmarks/board_host_bound.py: host or GPU, per step of the committed H200 record (docs/gpu.md "Where the host binds")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "board_host_bound.py"


def test_the_h200_records_moe_routing_steps_are_host_bound_and_batched_mm_is_gpu_bound() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[2:]}
    assert len(rows) == 13
    assert "  host " in rows["mixtral-small/bf16-autocast/eager-experts"] and "33 nonzero" in rows["mixtral-small/bf16-autocast/eager-experts"]
    assert "  host " in rows["mixtral-small/bf16/grouped_mm-experts"] and "4 cumsum" in rows["mixtral-small/bf16/grouped_mm-experts"]
    assert "  GPU " in rows["mixtral-small/bf16-autocast/batched_mm-experts"] and "  GPU " in rows["gpt2-small/fp32/math"]
    assert rows["mixtral-small/bf16-autocast/eager-experts"].split()[1:3] == ["69.82", "ms"]  # the record's median step


def test_a_file_that_is_not_a_record_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "nope.json.gz"
    bad.write_bytes(b"not gzip")
    done = subprocess.run([sys.executable, str(SCRIPT), "--record", str(bad)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and done.stderr.startswith("board_host_bound.py: ") and "Traceback" not in done.stderr


@pytest.mark.slow  # a Llama stepped 5 times and a second process stepping it 18: ~13 s
def test_local_steps_the_recorded_model_on_this_cpu_and_divides_the_boards_host_by_it() -> None:
    """``--local``: the model code stepped here (its own depth, widths shrunk), its CPU time beside the board's profiled host."""
    pytest.importorskip("transformers")  # a transformers model built and stepped (skipped where this torch cannot run it)
    sys.path.insert(0, str(REPO / "benchmarks"))
    import board_host_bound

    from resacct.account.gpu.records.board_record import read_board_record

    step = next(s for s in read_board_record(board_host_bound.DEFAULT_RECORD)["steps"] if s["name"] == "gqa-llama/bf16/flash")
    seconds = board_host_bound.local_step_cpu_sec(step, steps=2)
    assert 0 < seconds < 5
    done = subprocess.run([sys.executable, str(SCRIPT), "--local", "--only", "gqa-llama/bf16/flash"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    (row,) = done.stdout.splitlines()[2:]
    fields = row.split()
    host_ms, local_ms, ratio = float(fields[5]), float(fields[9]), float(fields[11])
    assert ratio == pytest.approx(host_ms / local_ms, abs=0.01) and fields[10] == "ms"
    wrong = subprocess.run([sys.executable, str(SCRIPT), "--only", "no-such-step"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert wrong.returncode == 2 and "no such step" in wrong.stderr and "gqa-llama/bf16/flash" in wrong.stderr


def test_a_record_with_the_hosts_unprofiled_time_shows_it() -> None:
    """Records made since session 30 keep each step's host time to its last launch (``host_enqueue_sec``): shown beside
    the profile's; the H200 record of 2026-11-30 has none, and its rows say nothing of it."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import board_host_bound

    step = {"name": "s", "step_time_sec": {"median": 0.02}, "host_enqueue_sec": {"median": 0.015, "all": [0.015]},
            "ops": [{"name": "aten::mm", "cpu_us": 30.0, "top_level": True, "calls": 2, "self_device_us": 10_000.0},
                    {"name": "aten::nonzero", "cpu_us": 20.0, "top_level": True, "calls": 1, "self_device_us": 5.0}]}
    row = board_host_bound.host_and_gpu(step)
    assert row["enqueue_ms"] == pytest.approx(15.0) and row["host_ms"] == pytest.approx(0.05) and row["waiting"] == {"nonzero": 1}
    without = {key: value for key, value in step.items() if key != "host_enqueue_sec"}
    assert board_host_bound.host_and_gpu(without)["enqueue_ms"] is None
