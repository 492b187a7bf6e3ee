"""``resacct account --hf-config``: shipped configs and config.json files built on the meta device,
resacct's closed forms (resacct.hf_formulas) beside torch's measurements. Needs transformers."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.cli import main  # noqa: E402
from resacct.hf_formulas import HfArchitecture, predict_active_parameters, predict_parameter_tensors, predict_parameters  # noqa: E402
from resacct.hf_models import known_hf_configs, load_hf_config  # noqa: E402

_SHIPPED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3-405b",
            "mistral-7b", "mixtral-8x7b")


def test_every_shipped_config_names_its_model_card_config_json():
    assert tuple(known_hf_configs()) == _SHIPPED
    for spec in known_hf_configs().values():
        assert spec.source.startswith("https://huggingface.co/") and spec.source.endswith("/config.json") and spec.model_type in spec.values.values()


def test_the_closed_forms_without_torch():
    mixtral = HfArchitecture(family="mixtral", vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, mlp=14336, positions=32768,
                             experts=8, experts_per_token=2)
    assert predict_parameters(mixtral) == 46_702_792_704 and predict_active_parameters(mixtral) == 12_879_925_248  # 46.7B, 12.9B
    assert predict_parameter_tensors(mixtral) == 291


def _json(capsys, *argv: str) -> dict:
    assert main(["account", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_config_json_file_predicted_equals_measured(tmp_path, capsys):
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32, "architectures": ["LlamaForCausalLM"]}))
    report = _json(capsys, "--hf-config", str(path), "--batch", "2", "--seq", "8", "--recipe", "bf16-fp32-master")
    assert report["model_class"] == "LlamaForCausalLM" and report["device"] == "meta" and report["tokens"] == 16
    for section in ("parameter_counts", "flops", "training_state", "checkpoint"):
        for row in report[section]:
            if row["ratio"] is not None and "6N" not in row["quantity"]:   # the 6N convention is a reference, not resacct's formula
                assert row["ratio"] == 1.0, (section, row)
    assert {row["quantity"] for row in report["flops"]} >= {"forward", "backward", "step"}
    assert report["activations"][0]["measured_bytes"] > 0 and report["activations"][0]["predicted_bytes"] is None


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--hf-config", "llama-2-7"], "unknown hf config 'llama-2-7'; did you mean 'llama-2-7b'"),
        (["--hf-config", "/no/such/config.json"], "cannot read the config file '/no/such/config.json'"),
        (["--hf-config", "gpt2", "--attention", "sdpa"], "--attention do not apply to --hf-config"),
        (["--hf-config", "gpt2", "--seq", "2048"], "seq 2048 is longer than the model's context length 1024"),
    ],
)
def test_bad_hf_config_input_is_one_line(capsys, argv, fragment):
    pytest.importorskip("transformers")
    assert main(["account", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_a_config_file_without_model_type_is_one_line(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{\"hidden_size\": 8}")
    assert main(["account", "--hf-config", str(path)]) == 2
    assert "has no \"model_type\"" in capsys.readouterr().err
    assert load_hf_config("gpt2").values["n_layer"] == 12


def test_hf_claims_skip_with_the_reason_without_transformers(monkeypatch):
    """Without the resacct[hf] extra every hf check says so (the harness turns NotMeasurable into a skip)."""
    import sys

    from resacct.checks.hf import shipped_parameters, small_model
    from resacct.harness.registry import NotMeasurable

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers → ImportError
    for call in (lambda: shipped_parameters("gpt2"), lambda: small_model("llama", "parameters", 8, 1, 2, 8, 16)):
        with pytest.raises(NotMeasurable, match=r"transformers is not installed \(the optional extra: pip install 'resacct\[hf\]'\)"):
            call()
