"""Issue 26: hostile ``--hf-config`` files. 22 of 43 used to end in tracebacks (ZeroDivisionError,
RuntimeError, KeyError, RecursionError, ValueError …), a FIFO hung and ``/dev/zero`` read until
MemoryError, 100,000 layers ran for hours in silence. Now each is refused before anything is
built, or transformers' own refusal is passed on: exit status 2, one line naming the file.

The corpus is written to ``tmp_path`` and run through the real CLI entry (``resacct.cli.main``)
in-process, one case per file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.test_input_files import within

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.cli import main  # noqa: E402
from resacct.errors import ResacctError  # noqa: E402
from resacct.account.load.hf_models import MAX_CONFIG_BYTES, MAX_LAYERS, check_sizes, load_hf_config  # noqa: E402

LLAMA = {"model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32}
MIXTRAL = {**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
MISTRAL = {**LLAMA, "model_type": "mistral"}
GPT2 = {"model_type": "gpt2", "vocab_size": 96, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32}
WHOLE = "expected a whole number ≥ 1 (a JSON integer)"
IN_RANGE = "expected a whole number in 1..2147483647"


def config(base: dict, **changes: object) -> str:
    return json.dumps({**base, **changes})


# name: (file text, a fragment of the one-line message, whether transformers is needed to get there)
CORPUS: dict[str, tuple[str, str, bool]] = {
    "hidden-0": (config(LLAMA, hidden_size=0), f'"hidden_size" is 0; {IN_RANGE}', False),
    "hidden-string": (config(LLAMA, hidden_size="32"), f'"hidden_size" is "32"; {WHOLE}', False),
    "hidden-float": (config(LLAMA, hidden_size=32.0), f'"hidden_size" is 32.0; {WHOLE}', False),
    "hidden-nan": (config(LLAMA, hidden_size=float("nan")), f'"hidden_size" is NaN; {WHOLE}', False),
    "hidden-infinity": (config(LLAMA, hidden_size=float("inf")), f'"hidden_size" is Infinity; {WHOLE}', False),
    "hidden-negative": (config(LLAMA, hidden_size=-32), f'"hidden_size" is -32; {IN_RANGE}', False),
    "hidden-bool": (config(LLAMA, hidden_size=True), f'"hidden_size" is true; {WHOLE}', False),
    "hidden-null": (config(LLAMA, hidden_size=None), f'"hidden_size" is null; {WHOLE}', False),
    "hidden-10e12": (config(LLAMA, hidden_size=10**12), f'"hidden_size" is 1000000000000; {IN_RANGE}', False),
    "hidden-40-digits": (config(LLAMA, hidden_size=10**40), f'"hidden_size" is a 41-digit integer; {IN_RANGE}', False),
    "heads-do-not-divide-hidden": (config(LLAMA, num_attention_heads=5, num_key_value_heads=5),
                                   "5 attention heads do not divide the hidden size 32; expected a divisor of 32", False),
    "heads-0": (config(LLAMA, num_attention_heads=0), f'"num_attention_heads" is 0; {IN_RANGE}', False),
    "heads-string": (config(LLAMA, num_attention_heads="4"), f'"num_attention_heads" is "4"; {WHOLE}', False),
    "kv-heads-0": (config(LLAMA, num_key_value_heads=0), f'"num_key_value_heads" is 0; {IN_RANGE}', False),
    "kv-heads-3-of-4": (config(LLAMA, num_key_value_heads=3), "3 key/value heads do not divide the 4 attention heads", False),
    "kv-heads-8-of-4": (config(LLAMA, num_key_value_heads=8), "8 key/value heads do not divide the 4 attention heads", False),
    "layers-minus-1": (config(LLAMA, num_hidden_layers=-1), f'"num_hidden_layers" is -1; {IN_RANGE}', False),
    "layers-0": (config(LLAMA, num_hidden_layers=0), f'"num_hidden_layers" is 0; {IN_RANGE}', False),
    "layers-100000": (config(LLAMA, num_hidden_layers=100_000), f'"num_hidden_layers" is 100000; expected at most {MAX_LAYERS} layers', False),
    "vocab-0": (config(LLAMA, vocab_size=0), f'"vocab_size" is 0; {IN_RANGE}', False),
    "vocab-negative": (config(LLAMA, vocab_size=-5), f'"vocab_size" is -5; {IN_RANGE}', False),
    "intermediate-0": (config(LLAMA, intermediate_size=0), f'"intermediate_size" is 0; {IN_RANGE}', False),
    "intermediate-string": (config(LLAMA, intermediate_size="big"), f'"intermediate_size" is "big"; {WHOLE}', False),
    "positions-0": (config(LLAMA, max_position_embeddings=0), f'"max_position_embeddings" is 0; {IN_RANGE}', False),
    "head-dim-0": (config(LLAMA, head_dim=0), f'"head_dim" is 0; {IN_RANGE}', False),
    "head-dim-negative": (config(LLAMA, head_dim=-8), f'"head_dim" is -8; {IN_RANGE}', False),
    "top-k-8-of-4-experts": (config(MIXTRAL, num_experts_per_tok=8), '"num_experts_per_tok" 8 is more than the 4 experts', False),
    "experts-0": (config(MIXTRAL, num_local_experts=0), f'"num_local_experts" is 0; {IN_RANGE}', False),
    "top-k-0": (config(MIXTRAL, num_experts_per_tok=0), f'"num_experts_per_tok" is 0; {IN_RANGE}', False),
    "sliding-window-negative": (config(MISTRAL, sliding_window=-1), f'"sliding_window" is -1; {IN_RANGE}', False),
    "gpt2-embd-0": (config(GPT2, n_embd=0), f'"n_embd" is 0; {IN_RANGE}', False),
    "gpt2-heads-0": (config(GPT2, n_head=0), f'"n_head" is 0; {IN_RANGE}', False),
    "gpt2-layers-minus-1": (config(GPT2, n_layer=-1), f'"n_layer" is -1; {IN_RANGE}', False),
    "gpt2-heads-5-of-32": (config(GPT2, n_head=5), "5 attention heads do not divide the hidden size 32", False),
    "gpt2-positions-0": (config(GPT2, n_positions=0), f'"n_positions" is 0; {IN_RANGE}', False),
    "gpt2-inner-negative": (config(GPT2, n_inner=-1), f'"n_inner" is -1; {IN_RANGE}', False),
    "json-100000-deep": ('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                         "is not a config: its JSON is nested deeper than Python's parser allows", False),
    "integer-5001-digits": ('{"model_type": "llama", "vocab_size": ' + "9" * 5001 + "}",
                            "is not a config: Exceeds the limit (4300 digits) for integer string conversion", False),
    "not-an-object": ("[1, 2]", 'has no "model_type"', False),
    "model-type-a-number": (config(LLAMA, model_type=5), 'has no "model_type"', False),
    "empty": ("", "is not JSON (Expecting value", False),
    "truncated": (config(LLAMA)[:40], "is not JSON (", False),
    # past resacct's checks: transformers' own refusal, named and passed on in one line
    "rope-type-bogus": (config(LLAMA, rope_scaling={"rope_type": "bogus", "factor": 2.0}), "(KeyError: 'bogus')", True),
    "rope-scaling-a-string": (config(LLAMA, rope_scaling="yes"), "transformers refused it (", True),
    "rope-theta-a-string": (config(LLAMA, rope_theta="fast"), "TypeError: unsupported operand type(s) for ** or pow()", True),
    "activation-bogus": (config(LLAMA, hidden_act="nonexistent"), "transformers cannot build a model from it (KeyError: 'nonexistent')", True),
    "norm-eps-a-string": (config(LLAMA, rms_norm_eps="x"), "transformers refused it (", True),
    "tie-embeddings-a-string": (config(LLAMA, tie_word_embeddings="maybe"), "transformers refused it (", True),
    "model-type-unknown": (config(LLAMA, model_type="nosuch"), "transformers refused it (ValueError: Unrecognized model identifier: nosuch", True),
}


def refused_in_one_line(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(arguments) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out and lines[0].startswith("resacct account: error: ")
    return lines[0]


def test_the_corpus_has_at_least_40_files():
    assert len(CORPUS) >= 40


@pytest.mark.parametrize("name", list(CORPUS))
def test_a_hostile_config_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str):
    text, fragment, needs_transformers = CORPUS[name]
    if needs_transformers:
        pytest.importorskip("transformers")
    path = tmp_path / f"{name}.json"
    path.write_text(text, encoding="utf-8")
    line = refused_in_one_line(["account", "--hf-config", str(path), "--seq", "8"], capsys)
    assert f"config file '{path}'" in line and fragment in line, line


def test_the_sizes_are_checked_before_transformers_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """resacct's own checks need no transformers: a hostile file is refused the same way without it."""
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)
    path = tmp_path / "config.json"
    path.write_text(config(LLAMA, hidden_size=0))
    with pytest.raises(ResacctError, match=r'"hidden_size" is 0'):
        load_hf_config(str(path))


def test_defaults_are_checked_once_transformers_fills_them_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """32 heads is LlamaConfig's default: 3 key/value heads do not divide it, although the file
    names no heads (transformers builds it, and the first forward fails on a shape mismatch)."""
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    values = {key: value for key, value in LLAMA.items() if key != "num_attention_heads"}
    path.write_text(config(values, hidden_size=64, num_key_value_heads=3))
    line = refused_in_one_line(["account", "--hf-config", str(path), "--seq", "8"], capsys)
    assert "3 key/value heads do not divide the 32 attention heads" in line


def test_the_shipped_configs_pass_the_checks():
    from resacct.account.load.hf_models import known_hf_configs

    for spec in known_hf_configs().values():
        check_sizes(spec)


def run_with_deadline(arguments: list[str], seconds: float, unblock: Path | None = None) -> int:
    """``main(arguments)`` within ``seconds`` (:func:`tests.test_input_files.within`)."""
    return within(seconds, lambda: main(arguments), unblock)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_as_config_is_refused_not_waited_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert run_with_deadline(["account", "--hf-config", str(fifo)], 20, unblock=fifo) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config file '{fifo}' is a FIFO (named pipe), not a regular file" in err, err


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_a_character_device_as_config_is_refused_not_read(capsys: pytest.CaptureFixture[str]):
    """/dev/zero used to be read until MemoryError. Named through a path ending in .json
    (a symlink) as well as directly."""
    assert run_with_deadline(["account", "--hf-config", "/dev/zero"], 20) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config file '/dev/zero' is a character device, not a regular file" in err, err


def test_a_symlink_to_a_device_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    link = tmp_path / "config.json"
    link.symlink_to("/dev/zero")
    assert run_with_deadline(["account", "--hf-config", str(link)], 20) == 2
    assert "is a character device, not a regular file" in capsys.readouterr().err


def test_a_config_larger_than_the_cap_is_refused_before_it_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "config.json"
    with open(path, "wb") as file:
        file.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk used
    line = refused_in_one_line(["account", "--hf-config", str(path)], capsys)
    assert f"config file '{path}' is {MAX_CONFIG_BYTES + 1} bytes; expected at most {MAX_CONFIG_BYTES} bytes" in line


def test_a_directory_named_like_a_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "config.json"
    path.mkdir()
    line = refused_in_one_line(["account", "--hf-config", str(path)], capsys)
    assert f"config file '{path}' is a directory; expected a config.json file" in line


def test_a_model_that_fails_in_its_first_step_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """What resacct's checks and transformers' constructors let through can still fail when the
    model first runs (a shape mismatch deep in transformers): one line naming the file and why."""
    pytest.importorskip("transformers")
    from resacct.account.answers import hf as hf_account

    def mismatch(*args: object, **kwargs: object) -> object:
        raise RuntimeError("The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 1\nmore detail")

    monkeypatch.setattr(hf_account, "measure_step_once", mismatch)
    path = tmp_path / "config.json"
    path.write_text(config(LLAMA))
    line = refused_in_one_line(["account", "--hf-config", str(path), "--seq", "8"], capsys)
    assert f"config.json ({path}): the model transformers built from it fails in its first step (RuntimeError: The size of tensor a (4)" in line


def test_a_window_transformers_itself_writes_as_0_is_no_window_but_a_users_0_is_refused() -> None:
    """Qwen1.5-MoE-A2.7B's card (``use_sliding_window: false``, ``sliding_window: 32768``): transformers' Qwen2-MoE
    config writes ``sliding_window`` 0 for no window, which the built config's check must not refuse; a 0 the user
    wrote still is."""
    pytest.importorskip("transformers")
    from resacct.account.load.hf_models import HfConfigSpec, transformers_config

    card = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_hidden_layers": 24,
            "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
            "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21,
            "vocab_size": 151936, "max_position_embeddings": 8192}
    assert transformers_config(HfConfigSpec(name="qwen1.5-moe", source="tests", values=card)).sliding_window == 0
    with pytest.raises(ResacctError, match=f'"sliding_window" is 0; {IN_RANGE}'):
        transformers_config(HfConfigSpec(name="qwen1.5-moe", source="tests", values={**card, "sliding_window": 0}))
