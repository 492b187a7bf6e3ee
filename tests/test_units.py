"""``--units decimal|binary`` (resacct/cli/_units.py) in every command that prints bytes — memory,
devices, infer, lora, offload, the napkin fit and plan: one shared option, GB (10^9) by default,
GiB (2^30) with ``binary``; ``--json`` gives the same bytes either way; a bad value is one line
naming it, exit status 2. ``account``'s table and ``fit``'s model form follow it too (below)."""

from __future__ import annotations

import json
import re

import pytest

from resacct.cli import main
from tests.trace_memo import memoized_infer_gpu_answer, memoized_lora_trace  # noqa: F401  (fixtures)

# lora and infer --device trace the model they are given (a 7B's LoRA step: ~13 CPU s, an 8B's prefill); what they
# print in either system is the same for a two-layer Llama, whose config each module run writes once (issue 34)
TINY_CONFIG = "<a two-layer Llama's config.json>"
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
COMMANDS = {
    "memory": ["memory", "--params", "7.5B", "--recipe", "mixed-adam", "--zero", "1", "--devices", "64", "--device", "h100"],
    "devices": ["devices", "h100"],
    "infer": ["infer", "--hf-config", TINY_CONFIG, "--batch", "8", "--context", "64", "--device", "h100"],
    "lora": ["lora", "--hf-config", TINY_CONFIG, "--rank", "16", "--seq", "16", "--memory-gb", "24"],
    "offload": ["offload", "--params", "2851M", "--largest-layer", "32M", "--gpus-per-node", "8", "--device", "h100"],
    "fit": ["fit", "--devices", "8", "--memory-gb", "80", "--zero", "3"],
    "plan": ["plan", "--hf-config", "llama-3-8b", "--seq", "4096", "--memory-gb", "80"],
}
# what each prints for the device's 80 GB (or the 24 GB given) in either system
MEMORY_TEXT = {"memory": ("80.00 GB", "74.51 GiB"), "devices": ("80", "74.5058"), "infer": ("80.00 GB", "74.51 GiB"),
               "lora": ("24.00 GB", "22.35 GiB"), "offload": ("80.00 GB", "74.51 GiB"), "fit": ("80.00 GB", "74.51 GiB"),
               "plan": ("80 GB", "74.51 GiB")}


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("units") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


def _argv(command: str, tiny_config: str) -> list[str]:
    return [tiny_config if word == TINY_CONFIG else word for word in COMMANDS[command]]


def _commands() -> list:  # type: ignore[type-arg]
    """The commands as parameters; lora's and infer's two tests each ask one traced question, answered from memory
    the second time where they share a process (tests/trace_memo.py): one xdist group."""
    return [pytest.param(name, marks=pytest.mark.xdist_group("units-traced")) if name in ("lora", "infer") else name
            for name in sorted(COMMANDS)]


def _memoized_if_traced(request: pytest.FixtureRequest, command: str) -> None:
    fixture = {"lora": "memoized_lora_trace", "infer": "memoized_infer_gpu_answer"}.get(command)
    if fixture is not None:
        request.getfixturevalue(fixture)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", _commands())
def test_binary_units_print_gib_only(capsys: pytest.CaptureFixture[str], command: str, request: pytest.FixtureRequest, tiny_config: str) -> None:
    _memoized_if_traced(request, command)
    if "--hf-config" in COMMANDS[command]:
        pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    decimal, binary = MEMORY_TEXT[command]
    argv = _argv(command, tiny_config)
    text = _run(capsys, [*argv, "--units", "binary"])
    assert "GiB" in text and not re.search(r"\bGB\b", text.replace("80GB", "")), text   # a board's display name may say 80GB
    assert binary in text
    default = _run(capsys, argv)
    assert decimal in default and "GiB" not in default


@pytest.mark.parametrize("command", _commands())
def test_json_is_bytes_whatever_the_units(capsys: pytest.CaptureFixture[str], command: str, request: pytest.FixtureRequest, tiny_config: str) -> None:
    _memoized_if_traced(request, command)
    if "--hf-config" in COMMANDS[command]:
        pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    plain = json.loads(_run(capsys, [*_argv(command, tiny_config), "--json"]))
    binary = json.loads(_run(capsys, [*_argv(command, tiny_config), "--json", "--units", "binary"]))
    assert plain == binary


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_units_one_line_exit_2(capsys: pytest.CaptureFixture[str], command: str) -> None:
    assert main([*COMMANDS[command], "--units", "gibi"]) == 2
    err = capsys.readouterr().err
    assert "'gibi' is not a unit system; choose decimal (GB = 10^9 bytes, the default) or binary (GiB = 2^30 bytes)" in err
    assert err.count("\n") == 1


@pytest.mark.slow
def test_account_and_a_models_fit_print_binary_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24: --units binary in every command that prints bytes, the account's table included."""
    account = ["account", "--model", "resacct.account.answers.generic:mlp", "--no-time"]
    binary = _run(capsys, [*account, "--units", "binary"])
    assert "KiB" in binary and not re.search(r"\d kB\b", binary), binary
    assert " kB" in _run(capsys, account)
    fit = ["fit", "--model", "resacct.account.answers.generic:mlp", "--memory-gb", "0.0008", "--no-progress"]
    assert "781.25 KiB" in _run(capsys, [*fit, "--units", "binary"]) and "800.00 kB" in _run(capsys, fit)
