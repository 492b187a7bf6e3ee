"""The probe lines of ``fit`` and ``lora`` (resacct/cli/_search_progress.py): on stderr only, always with
--progress, never with --no-progress, by default only once the command has run 2 s; ``lora`` reports
the batches its search traces (not the command's own batch, already traced)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.account.fit.lines import FitProbe  # noqa: E402
from resacct.cli import main  # noqa: E402
from resacct.cli._search_progress import QUIET_SECONDS, probe_progress  # noqa: E402

TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 1, "vocab_size": 128, "max_position_embeddings": 64}


@pytest.mark.parametrize(("progress", "ran_seconds", "printed"), [
    (None, 0.0, False), (None, QUIET_SECONDS + 1, True), (True, 0.0, True), (False, QUIET_SECONDS + 60, False)])
def test_a_probe_is_reported_when_asked_or_once_the_search_is_slow(progress, ran_seconds, printed, capsys) -> None:
    on_probe = probe_progress("fit", "batch", progress, time.perf_counter() - ran_seconds, lambda value: f"{value:.0f} B")
    on_probe(FitProbe(size=1234, peak_bytes=5000, fits=False, seconds=0.25))
    captured = capsys.readouterr()
    assert captured.out == ""
    if printed:
        assert captured.err.startswith("resacct fit: batch 1,234: predicted 5000 B does not fit (0.2 s; ") and captured.err.endswith(" in all)\n")
    else:
        assert captured.err == ""


@pytest.mark.slow  # a tiny LoRA step traced three times per run, twice
def test_lora_reports_the_batches_its_search_traces_on_stderr(tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    argv = ["lora", "--hf-config", str(config), "--seq", "16", "--base", "fp32", "--batch", "2", "--memory-gb", "0.002", "--json"]
    assert main([*argv, "--progress"]) == 0
    loud = capsys.readouterr()
    search = json.loads(loud.out)["largest_batch_search"]
    traced = [probe["batch"] for probe in search["probes"] if probe["batch"] != 2]
    lines = loud.err.splitlines()
    assert [int(line.split("batch ")[1].split(":")[0].replace(",", "")) for line in lines] == traced and len(traced) == search["traces"] >= 2
    assert all(line.startswith("resacct lora: batch ") and " in all)" in line for line in lines)
    assert main([*argv, "--no-progress"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and json.loads(quiet.out) == json.loads(loud.out)
