"""tools/gpu_record.py --merge (tools/gpu_record_merge.py): records of one board from several device calls as one —
the last whole entry per step, the matrix's order, the failures kept as history, other machines refused."""

from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

from gpu_record_matrix import MATRIX, SERVING  # noqa: E402
from gpu_record_merge import MergeRefused, merge_records  # noqa: E402

H200 = REPO / "docs" / "gpu" / "2026-11-30-h200-record.json.gz"
FIRST, SECOND, THIRD = list(MATRIX)[:3]


def _record(when: str, steps: list[dict[str, Any]], **machine: Any) -> dict[str, Any]:
    return {"format": "resacct-gpu-record/1", "when": when, "board": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda_runtime": "13.0",
            "capability": "9.0", "total_memory_bytes": 150109880320, "dry_run": False, "allocator_settings": {}, "steps": steps,
            "serving": [], "ceilings": {"copy": {"bandwidth_bytes_per_sec": 4e12}, "launch": {"per_launch_sec": 5e-6}},
            "library_probe": {"stages": []}, **machine}


def _whole(name: str, peak: int) -> dict[str, Any]:
    return {"name": name, "max_memory_allocated": peak, "trace": []}


def _failed(name: str, why: str) -> dict[str, Any]:
    return {"name": name, "error": why}


def test_the_last_whole_entry_wins_and_the_matrix_order_is_kept() -> None:
    first = _record("t1", [_whole(FIRST, 1), _failed(SECOND, "failed (exit 1): RuntimeError: No available kernel."), _whole(THIRD, 3)])
    second = _record("t2", [_whole(THIRD, 33), _whole(SECOND, 2), _failed(FIRST, "timeout")])
    merged = merge_records([first, second])
    assert [step["name"] for step in merged["steps"]] == [FIRST, SECOND, THIRD]
    assert [step["max_memory_allocated"] for step in merged["steps"]] == [1, 2, 33]  # a later failure never replaces a whole entry
    assert merged["merged_from"][0]["steps"][SECOND] == "failed (exit 1): RuntimeError: No available kernel."
    assert merged["merged_from"][1]["steps"][FIRST] == "timeout"


def test_a_failed_step_the_matrix_no_longer_names_is_history_only() -> None:
    renamed = "llama-3.2-1b/bf16-autocast/efficient"
    assert renamed not in MATRIX
    merged = merge_records([_record("t1", [_failed(renamed, "No available kernel"), _failed(FIRST, "timeout")])])
    assert [step["name"] for step in merged["steps"]] == [FIRST]  # still named by the matrix: its failure stays
    assert merged["merged_from"][0]["steps"][renamed] == "No available kernel"


@pytest.mark.parametrize("field, other", [("board", "NVIDIA H100 80GB HBM3"), ("torch", "2.12.0+cu130"), ("dry_run", True),
                                          ("allocator_settings", {"expandable_segments": True})])
def test_records_of_another_machine_are_refused_naming_the_field(field: str, other: Any) -> None:
    first = _record("t1", [_whole(FIRST, 1)])
    with pytest.raises(MergeRefused, match=f"record 2 has {field}"):
        merge_records([first, _record("t2", [_whole(SECOND, 2)], **{field: other})])
    with pytest.raises(MergeRefused, match="no record"):
        merge_records([])


def test_the_committed_h200_record_is_whole_and_says_what_each_call_did() -> None:
    with gzip.open(H200, "rt") as handle:
        record = json.load(handle)
    names = [step["name"] for step in record["steps"]]
    assert names == [name for name in MATRIX if name in names]  # the recorder's steps, in its order
    assert set(MATRIX) - set(names) == {"hf-gpt2/bf16-autocast/efficient"}  # added to the matrix after this record (session 27)
    assert [entry["name"] for entry in record["serving"]] == list(SERVING)
    assert not [entry["name"] for entry in record["steps"] + record["serving"] if "error" in entry]
    assert len(record["merged_from"]) == 3
    assert "No available kernel" in record["merged_from"][0]["steps"]["llama-3.2-1b/bf16-autocast/efficient"]
    assert "out of memory" in record["merged_from"][1]["steps"]["mixtral-small/bf16-autocast/batched_mm-experts"]


@pytest.mark.slow  # 6.4 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_merge_on_the_command_line_gives_back_the_record_split_in_two(tmp_path: Path) -> None:
    """Split the committed record in two (one step recorded again by a second call) and merge them back: the merged
    record's steps are the committed record's, entry for entry (which replay exactly:
    tests/test_cuda_allocator_replay.py), and its summary names both calls."""
    with gzip.open(H200, "rt") as handle:
        record = json.load(handle)
    summary = json.loads(H200.with_name(H200.name.replace(".json.gz", "-summary.json")).read_text())
    small = next(step for step in record["steps"] if step["name"] == "gqa-llama/bf16/flash")
    first, second = copy.deepcopy(record), copy.deepcopy(record)
    first["steps"] = [step if step is not small else _failed(small["name"], "timeout") for step in record["steps"]]
    first["serving"], second["steps"], second["serving"] = [], [small], []
    paths = []
    for index, part in enumerate((first, second)):
        folder = tmp_path / f"call{index}"
        folder.mkdir()
        with gzip.open(folder / "gpu-record.json.gz", "wt") as handle:
            json.dump(part, handle)
        (folder / "gpu-record-summary.json").write_text(json.dumps({**summary, "serving": []}))
        paths.append(str(folder / "gpu-record.json.gz"))
    done = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_record.py"), "--merge", *paths, "--out", str(tmp_path / "merged")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    steps = len(record["steps"])
    assert f"{steps} of {steps} steps ok from 2 records" in done.stdout
    merged_summary = json.loads((tmp_path / "merged" / "gpu-record-summary.json").read_text())
    assert merged_summary["failed"] == [] and len(merged_summary["merged_from"]) == 2
    with gzip.open(tmp_path / "merged" / "gpu-record.json.gz", "rt") as handle:
        merged = json.load(handle)
    assert [step["name"] for step in merged["steps"]] == [step["name"] for step in record["steps"]]
    assert merged["steps"] == record["steps"]


def test_merge_without_out_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_record.py"), "--merge", str(H200)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "--merge needs --out" in done.stderr and "Traceback" not in done.stderr


def test_the_allocation_origins_are_the_first_whole_sources() -> None:
    origins = {"step": "hf-gpt2/fp32/efficient", "allocations": [{"size": 512, "frames": ["transformers/x.py:1 f"]}]}
    failed = _record("t1", [_whole(FIRST, 1)], allocation_origins={"error": "timeout"})
    whole = _record("t2", [_whole(SECOND, 2)], allocation_origins=origins)
    assert merge_records([failed, whole])["allocation_origins"] == origins
    assert "allocation_origins" not in merge_records([_record("t1", [_whole(FIRST, 1)])])  # a record from before the probe has none
