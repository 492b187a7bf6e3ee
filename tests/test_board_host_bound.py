"""benchmarks/board_host_bound.py: host or GPU, per step of the committed H200 record (docs/gpu.md "Where the host binds")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
