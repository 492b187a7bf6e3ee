"""``resacct lora``: a target the model lacks is refused before the step is traced, and a GPT-2
(Conv1D layers) LoRA prints no peft warning."""

from __future__ import annotations

import pytest

from resacct.cli import main

pytest.importorskip("peft")  # both build the model with transformers and peft (torch 2.4: transformers 5.x cannot)


def test_a_target_the_model_lacks_is_refused_before_tracing(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import resacct.account.trace.lora_step as lora_step

    def traced(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the step was traced before the targets were checked")

    monkeypatch.setattr(lora_step, "trace_lora_step", traced)
    assert main(["lora", "--hf-config", "gpt2", "--targets", "c_attn,qkv", "--seq", "16"]) == 2
    err = capsys.readouterr().err
    assert "qkv is not a linear layer of gpt2" in err and "(c_attn, c_fc, c_proj)" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.filterwarnings("error::UserWarning")
def test_gpt2_conv1d_lora_warns_nothing() -> None:
    """peft set fan_in_fan_out itself for Conv1D with a UserWarning that reached every lora --hf-config gpt2."""
    from resacct.account.load.hf_models import load_hf_config, transformers_config
    from resacct.account.trace.lora_step import build_lora_model

    model = build_lora_model(transformers_config(load_hf_config("gpt2")), rank=4, targets=("c_attn",), base="bf16")
    adapted = [module for module in model.modules() if hasattr(module, "lora_A")]
    assert len(adapted) == 12 and all(module.fan_in_fan_out for module in adapted)
