"""A model built from a shipped config as the first thing a fresh process does (as a user's
``resacct account --hf-config gpt2`` does): on torch 2.8 transformers' lazy model import under
``torch.device("meta")`` failed as a circular import of ``torch._dynamo`` (tox's torch28 env runs this); on torch 2.6 a
user's factory building a Mixtral under it failed the same way ("Could not import module 'MixtralForCausalLM'": tox's
torch26 env runs this)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROGRAM = """
from resacct.account.load.hf_models import build_hf_model, load_hf_config
model = build_hf_model(load_hf_config("gpt2"), device="meta")
print(type(model).__name__, sum(p.numel() for p in model.parameters()))
"""


@pytest.mark.slow  # 4.11 s idle on 2026-11-28: a fresh process
def test_a_fresh_process_builds_gpt2_on_meta() -> None:
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["GPT2LMHeadModel", "124439808"]


FACTORY_PROGRAM = """
from resacct.cli import main
raise SystemExit(main(["account", "--model", "tests.fixtures_hf_models:tiny_mixtral", "--batch", "2", "--seq", "8", "--json"]))
"""


@pytest.mark.slow  # a fresh process
def test_a_fresh_process_accounts_a_user_factory_that_builds_a_transformers_model() -> None:
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-c", FACTORY_PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["model_class"] == "MixtralForCausalLM" and report["hf_model_type"] == "mixtral"
    step = {row["quantity"]: row for row in report["flops"]}["step"]
    assert step["measured_flops"] == step["predicted_flops"] > 0  # the step ran, and was counted
