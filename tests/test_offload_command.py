"""``resacct offload``: DeepSpeed's ZeRO-2/ZeRO-3 model-state estimates per GPU and per host
(resacct/formulas/offload.py) for every option its ``..._all_cold`` functions print; the docs'
example in GiB; which options fit a GPU and a host; one-line errors with exit status 2; napkin
math without torch. The figures are claims in resacct/specs/offload.claims.yaml;
benchmarks/offload_deepspeed.py compares them with DeepSpeed's functions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from resacct.cli import main
from resacct.formulas.offload import deepspeed_options, largest_module_parameters
from resacct.formulas.hf_formulas import HfArchitecture

DOCS = ["offload", "--params", "2851M", "--largest-layer", "32M", "--gpus-per-node", "8"]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_docs_example_rows_in_gib(capsys: pytest.CaptureFixture[str]) -> None:
    fields = _json(capsys, *DOCS, "--estimator", "docs")
    gib = [(round(o["host_bytes"] / 2**30, 2), round(o["gpu_bytes"] / 2**30, 2)) for o in fields["options"]]
    # DeepSpeed's docs (memory.rst): ZeRO-2 then ZeRO-3, in the order its _all_cold functions print them
    assert gib == [(127.45, 5.31), (127.45, 15.93), (71.69, 0.12), (127.45, 0.12), (63.72, 0.78), (127.45, 0.78), (1.43, 6.09), (127.45, 6.09)]
    assert _json(capsys, *DOCS)["options"][1]["gpu_bytes"] == 2 * 2851e6 + int(18 * 2851e6 / 8)      # DeepSpeed ≥ 0.14.3
    assert [o["stage"] for o in _json(capsys, *DOCS, "--stage", "3")["options"]] == [3] * 6


def test_fits_on_gpu_and_host(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    fields = _json(capsys, "offload", "--hf-config", "llama-2-70b", "--gpus-per-node", "8", "--nodes", "4", "--device", "h100",
                   "--host-memory-gb", "2048")
    assert fields["largest_layer_parameters"] == 32000 * 8192 and fields["device_memory_bytes"] == 80e9
    by_option = {(o["stage"], o["offload_optimizer"], o["offload_param"], o["zero_init"]): o for o in fields["options"]}
    assert by_option[(2, "none", "none", None)]["fits_gpu"] is False
    assert by_option[(3, "cpu", "cpu", True)]["fits_gpu"] is True and by_option[(3, "cpu", "cpu", True)]["fits_host"] is True
    assert main(["offload", "--params", "7B", "--stage", "2", "--nvme"]) == 0
    assert "per NVMe (host)" in capsys.readouterr().out


def test_largest_module_of_each_family() -> None:
    gpt2 = HfArchitecture(family="gpt2", vocab=50257, hidden=768, layers=12, heads=12, kv_heads=12, head_dim=64, mlp=3072, positions=1024, tied_head=True)
    assert largest_module_parameters(gpt2) == 50257 * 768
    mixtral = HfArchitecture(family="mixtral", vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, mlp=14336, positions=4096,
                             experts=8, experts_per_token=2)
    assert largest_module_parameters(mixtral) == 8 * 3 * 4096 * 14336
    rows = deepspeed_options(1e9, 1e8, gpus_per_node=8)
    assert len(rows) == 8 and rows[2].gpu_bytes == 4e8


@pytest.mark.parametrize("argv, message", [
    (["offload", "--params", "7B"], "give --largest-layer N"),
    (["offload"], "give --params N"),
    (["offload", "--hf-config", "llama-2-7b", "--params", "7B"], "give the model by one of them, not both"),
    (["offload", "--params", "7B", "--stage", "2", "--estimator", "old"], "'old' is not an estimator; choose current"),
    (["offload", "--params", "7B", "--stage", "4"], "invalid choice: 4"),
    (["offload", "--params", "7B", "--stage", "2", "--device", "h100", "--gpu-memory-gb", "80"], "not both"),
    (["offload", "--params", "7B", "--largest-layer", "8B"], "largest layer 8e+09 parameters is more than the model's 7e+09"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


_PROBE = """
import json, sys
from resacct.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["offload", *DOCS[1:], "--units", "binary"],
    ["lora", "--layers", "32", "--hidden", "4096", "--heads", "32", "--mlp", "11008", "--vocab", "32000", "--memory-gb", "24"],
    ["devices", "--units", "binary"],
    ["memory", "--params", "7B", "--units", "binary"],
], ids=lambda argv: argv[0])
def test_napkin_paths_never_import_torch(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    probe = json.loads(done.stderr.strip().splitlines()[-1])
    assert probe == {"code": 0, "torch": False}
