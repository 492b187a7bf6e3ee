"""A model built from a shipped config as the first thing a fresh process does (as a user's
``resacct account --hf-config gpt2`` does): on torch 2.8 transformers' lazy model import under
``torch.device("meta")`` failed as a circular import of ``torch._dynamo`` (tox's torch28 env runs this)."""

from __future__ import annotations

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
