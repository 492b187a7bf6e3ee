"""A command answered from the trace cache never imports torch (issue 34, "fast answers"): ``account``, ``fit``, ``lora``,
``infer`` and ``shard --hf-config`` asked the same question twice in fresh processes — the first traces
(torch imported), the second reads the answer back and prints the same thing without importing torch or
transformers (the classes an answer is pickled as, and what renders it, load without them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 1, "vocab_size": 128, "max_position_embeddings": 64}

_PROBE = """
import json, sys
from resacct.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}), file=sys.stderr)
"""

COMMANDS = {
    "fit": ["fit", "--seq", "16", "--no-progress", "--device", "h100"],
    "lora": ["lora", "--seq", "16", "--base", "fp32", "--memory-gb", "0.002"],
    "infer": ["infer", "--batch", "2", "--device", "h100"],
    "shard": ["shard", "--devices", "2", "--seq", "16", "--device", "h100"],
    "account": ["account", "--batch", "2", "--seq", "16", "--device", "h100"],
}


def _run(argv: list[str], cache: Path) -> tuple[dict, str]:
    env = {**os.environ, "RESACCT_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    env.pop("RESACCT_NO_CACHE", None)  # tests/conftest.py turns the commands' cache off
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=300, env=env)
    return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout


@pytest.mark.slow  # five commands traced cold in fresh processes: ~45 s on 2 cores
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_cached_answer_is_printed_without_importing_torch(command: str, tmp_path: Path) -> None:
    if command == "shard":
        from resacct.account.peak.sharded import engine_gap

        if (gap := engine_gap("fsdp2")) is not None:  # resacct shard refuses that torch in one line
            pytest.skip(gap)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    name, *flags = COMMANDS[command]
    argv = [name, "--hf-config", str(config), *flags]
    cold, cold_out = _run(argv, tmp_path / "cache")
    assert cold["code"] == 0 and cold["torch"], cold
    warm, warm_out = _run(argv, tmp_path / "cache")
    assert warm == {"code": 0, "torch": False, "transformers": False}, warm
    assert warm_out == cold_out and warm_out.strip()
