"""``resacct account --hf-config``: shipped configs and config.json files built on the meta device,
resacct's closed forms (resacct.formulas.hf_formulas) beside torch's measurements. Needs transformers."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.cli import main  # noqa: E402
from resacct.formulas.hf_formulas import HfArchitecture, predict_active_parameters, predict_parameter_tensors, predict_parameters  # noqa: E402
from resacct.account.load.hf_models import known_hf_configs, load_hf_config  # noqa: E402

_SHIPPED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3-405b",
            "llama-3.1-8b", "llama-3.2-1b", "llama-3.2-3b", "mistral-7b", "mixtral-8x7b", "qwen2-7b-instruct", "qwen3-8b", "qwen3-30b-a3b", "gemma-2-9b", "gemma-3-12b", "phi-3-mini-4k",
            "olmo-2-0425-1b", "falcon-7b", "gpt-neox-20b", "bloom-560m", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b")


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


@pytest.mark.slow  # 1.10 s idle on 2026-11-28
def test_a_config_json_file_predicted_equals_measured(tmp_path, capsys):
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32, "architectures": ["LlamaForCausalLM"]}))
    report = _json(capsys, "--hf-config", str(path), "--batch", "2", "--seq", "8", "--recipe", "bf16-fp32-master", "--per-module")
    assert report["model_class"] == "LlamaForCausalLM" and report["device"] == "meta" and report["tokens"] == 16
    for section in ("parameter_counts", "flops", "training_state", "activations", "checkpoint"):
        for row in report[section]:
            if row["ratio"] is not None and "6N" not in row["quantity"]:   # the 6N convention is a reference, not resacct's formula
                assert row["ratio"] == 1.0, (section, row)
    assert {row["quantity"] for row in report["flops"]} >= {"forward", "backward", "step"}
    saved, layer = report["activations"][0], report["activations"][1]
    assert saved["measured_bytes"] > 0 and saved["predicted_bytes"] == saved["measured_bytes"] and saved["ratio"] == 1.0
    assert layer["quantity"] == "one layer (the first)" and layer["predicted_bytes"] == layer["measured_bytes"]
    modules = [row for row in report["per_module"] if row["predicted_saved_bytes"] or row["measured_saved_bytes"]]
    assert modules and all(row["predicted_saved_bytes"] == row["measured_saved_bytes"] for row in modules)


@pytest.mark.slow
def test_the_cli_table_shows_predicted_beside_measured_activations(capsys):
    pytest.importorskip("transformers")
    assert main(["account", "--hf-config", "gpt2", "--batch", "1", "--seq", "8"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "saved for backward" in line)
    assert "1.000" in line and "predicted" in out and "measured only" not in line, line


def test_a_formula_with_a_term_removed_fails_against_the_measurement(monkeypatch):
    """The check measures with saved_tensors_hooks: drop one term from resacct's formula (the
    float32 softmax of eager Llama attention) and the prediction no longer agrees."""
    pytest.importorskip("transformers")
    import resacct.formulas.hf_activation_formulas as formulas
    from resacct.checks.hf import saved_activations
    from resacct.harness.evaluate import agrees
    from resacct.harness.schema import Tolerance

    inputs = dict(model_type="llama", attention="eager", device="cpu", hidden=32, layers=2, heads=4, kv_heads=2, mlp=48, vocab=96, batch=2, seq=8)
    right = saved_activations(**inputs)
    assert right.predicted == right.measured == 83012   # measured on transformers 5.23 / torch 2.13
    original = formulas.hf_saved_terms
    monkeypatch.setattr(formulas, "hf_saved_terms", lambda *args, **kw: tuple(t for t in original(*args, **kw) if "softmax output" not in t.what))
    wrong = saved_activations(**inputs)
    assert wrong.measured == right.measured and wrong.predicted == right.predicted - 2 * 2 * 4 * 8 * 8 * 4  # 2 layers · b·h·s² float32
    assert agrees(right.predicted, right.measured, Tolerance()) and not agrees(wrong.predicted, wrong.measured, Tolerance())


def test_the_activation_formula_refuses_what_it_does_not_model():
    from resacct.errors import ResacctError
    from resacct.formulas.hf_activation_formulas import predict_hf_saved_bytes

    llama = HfArchitecture(family="llama", vocab=96, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, mlp=48, positions=64, sliding_window=4)
    with pytest.raises(ResacctError, match="resacct predicts Hugging Face activations on cpu and meta"):
        predict_hf_saved_bytes(llama, 2, 4, device_type="cuda")
    for seq in (4, 8):  # from seq = window on (measured: tests/test_hf_raw_predicted.py)
        with pytest.raises(ResacctError, match=f"seq {seq} is not shorter than the sliding window 4"):
            predict_hf_saved_bytes(llama, 2, seq, attention="sdpa", device_type="cpu")
    assert predict_hf_saved_bytes(llama, 2, 3, attention="sdpa", device_type="cpu") > 0
    assert predict_hf_saved_bytes(llama, 2, 8, attention="sdpa", device_type="meta") > 0   # the mask is added, not saved
    with pytest.raises(ResacctError, match="activation 'relu'"):
        predict_hf_saved_bytes(HfArchitecture(family="llama", vocab=96, hidden=32, layers=1, heads=4, kv_heads=4, head_dim=8, mlp=48, positions=64,
                                              activation="relu"), 1, 4)


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
    from resacct.checks.hf_any import any_architecture
    from resacct.checks.inference import generate_kv_cache
    from resacct.checks.plan import hf_config_parameters, llama_mlp_saved_bytes, parameter_breakdown
    from resacct.harness.registry import NotMeasurable

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers → ImportError
    monkeypatch.setattr("resacct.measurement.torch_limits.transformers_unusable", lambda: None)  # as where none is installed
    for call in (lambda: shipped_parameters("gpt2"), lambda: small_model("llama", "parameters", 8, 1, 2, 8, 16),
                 lambda: any_architecture("qwen2", "parameters"), lambda: hf_config_parameters("gpt2"),
                 lambda: parameter_breakdown("gpt2", "total"), lambda: llama_mlp_saved_bytes(1, 8),
                 lambda: generate_kv_cache(2, 2, 2, 8, 1, 4, 2)):
        with pytest.raises(NotMeasurable, match=r"transformers is not installed \(the optional extra: pip install 'resacct\[hf\]'\)"):
            call()
