"""``resacct lora`` on a deep stack of identical layers: the LoRA step traced at depths 3, 4 and 5 and
extrapolated (resacct.account.trace.lora_layers) equals the step with every layer traced — parameters,
adapters, FLOPs, saved bytes, the step's peak, what is live at it and each phase's peak — and so does
the largest-batch search built on it; a stack that does not repeat is traced whole, and says why."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from resacct.account.fit.search import phase_peaks_bytes  # noqa: E402
from resacct.account.trace.lora_layers import ShallowLoraModels  # noqa: E402
from resacct.account.trace.lora_step import trace_lora_step  # noqa: E402
from resacct.cli import main  # noqa: E402

_DECODER = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 160,
            "max_position_embeddings": 128, "num_hidden_layers": 7}
TINY = {
    "llama": {"model_type": "llama", **_DECODER, "tie_word_embeddings": False},
    "mixtral": {"model_type": "mixtral", **_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {"model_type": "qwen2", **_DECODER},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 160, "n_positions": 128, "n_layer": 7},
}
TARGETS = {"gpt2": ("c_attn",), "llama": ("q_proj", "v_proj"), "mixtral": ("q_proj", "v_proj"), "qwen2": ("all-linear",)}


def _config(values: dict):  # type: ignore[no-untyped-def]
    from resacct.account.load.hf_models import HfConfigSpec, transformers_config

    return transformers_config(HfConfigSpec(name="tiny", source="tests", values=dict(values)))


def _numbers(step) -> dict:  # type: ignore[no-untyped-def]
    """Everything a LoRA step answers, the peak's moment, start, phases and ops included."""
    peak = step.peak
    return {"targets": step.targets, "base_parameters": step.base_parameters, "base_bytes": step.base_bytes,
            "adapter_parameters": step.adapter_parameters, "adapter_tensors": step.adapter_tensors, "adapter_bytes": step.adapter_bytes,
            "forward_flops": step.forward_flops, "backward_flops": step.backward_flops, "saved_activation_bytes": step.saved_activation_bytes,
            "peak": peak.peak, "start_bytes": peak.timeline.start_bytes, "phases": phase_peaks_bytes(peak), "ops_seen": peak.ops_seen}


@pytest.mark.slow  # 4 LoRA steps traced (3 shallow, 1 whole) each: 2-6 s loaded
@pytest.mark.parametrize("model_type, base, checkpointing, dropout", [
    ("llama", "bf16", False, 0.0), ("llama", "fp32", True, 0.1), ("mixtral", "bf16", False, 0.0), ("qwen2", "fp32", False, 0.05),
    ("gpt2", "bf16", False, 0.0),
])
def test_the_step_from_three_depths_equals_every_layer_traced(model_type: str, base: str, checkpointing: bool, dropout: float) -> None:
    config = _config(TINY[model_type])
    question = {"rank": 4, "targets": TARGETS[model_type], "base": base, "batch": 2, "seq": 16, "dropout": dropout,
                "gradient_checkpointing": checkpointing}
    sampled = trace_lora_step(config, layers="sampled", **question)
    whole = trace_lora_step(config, layers="all", **question)
    assert isinstance(sampled.model, ShallowLoraModels) and sampled.layers_note.startswith("its 7 layers are one layer repeated")
    assert whole.layers_note is None and not isinstance(whole.model, ShallowLoraModels)
    assert _numbers(sampled) == _numbers(whole)


@pytest.mark.slow  # the search on both: ~10 traced steps loaded
def test_the_largest_batch_from_three_depths_is_every_layer_traced() -> None:
    from resacct.account.fit.lora_batch import largest_lora_batch

    config = _config(TINY["llama"])
    question = {"rank": 4, "targets": ("q_proj", "v_proj"), "base": "fp32", "seq": 16}
    first = trace_lora_step(config, layers="all", batch=1, **question)
    budget = first.peak_bytes + 5 * (first.peak_bytes - first.start_bytes)  # about six sequences
    sampled = largest_lora_batch(config, budget_bytes=budget, layers="sampled", **question)
    whole = largest_lora_batch(config, budget_bytes=budget, layers="all", **question)
    assert sampled.largest == whole.largest > 1 and sampled.checked
    assert sampled.to_dict() == whole.to_dict() and sampled.layers_note is None


@pytest.mark.slow  # the three shallow steps, then the whole one
def test_layers_that_differ_are_traced_whole_and_it_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSeek-V3 with 4 dense layers first, not known as a prefix: at depths 3, 4 and 5 the last layer is dense, dense, then not."""
    import resacct.account.load.hf_models as hf_models

    monkeypatch.setattr(hf_models, "PREFIX_FIELDS", ())
    config = _config({**_DEEPSEEK, "num_hidden_layers": 7, "first_k_dense_replace": 4})
    step = trace_lora_step(config, rank=4, targets=("q_a_proj", "kv_a_proj_with_mqa"), base="fp32", batch=1, seq=8, layers="sampled")
    assert step.layers_note.startswith("all 7 layers traced:") and not isinstance(step.model, ShallowLoraModels)


@pytest.mark.slow  # the three shallow steps and the whole one
def test_layers_that_alternate_kinds_are_sampled_by_units_and_equal_every_layer_traced() -> None:
    """Gemma-2's sliding and full attention layers alternate: the step at 3, 4 and 5 units of two layers (6, 8, 10)
    extrapolates to what its 12 layers traced give."""
    config = _config({"model_type": "gemma2", "vocab_size": 160, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8, "max_position_embeddings": 128, "num_hidden_layers": 12})
    question = {"rank": 4, "targets": ("q_proj", "v_proj"), "base": "bf16", "batch": 2, "seq": 16}
    sampled = trace_lora_step(config, layers="sampled", **question)
    whole = trace_lora_step(config, layers="all", **question)
    assert isinstance(sampled.model, ShallowLoraModels) and sampled.model.period == 2
    assert sampled.layers_note.startswith("its 12 layers are a unit of 2 layers repeated: the step traced at depths 6, 8, 10")
    assert _numbers(sampled) == _numbers(whole)


_DEEPSEEK = {"model_type": "deepseek_v3", "vocab_size": 160, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
             "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
             "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 1,
             "topk_group": 1, "max_position_embeddings": 128}


@pytest.mark.slow  # the three shallow steps and the whole one, then two searches
def test_a_prefix_built_apart_is_kept_in_each_depth_and_equals_every_layer_traced() -> None:
    """DeepSeek-V3's first dense layers (2 of 9 here) are a prefix: the step at 5, 6 and 7 layers extrapolates to what
    every layer traced gives, and so does the largest-batch search."""
    from resacct.account.fit.lora_batch import largest_lora_batch

    config = _config({**_DEEPSEEK, "num_hidden_layers": 9, "first_k_dense_replace": 2})
    question = {"rank": 4, "targets": ("q_a_proj", "kv_a_proj_with_mqa"), "base": "fp32", "seq": 8}
    sampled = trace_lora_step(config, batch=1, layers="sampled", **question)
    whole = trace_lora_step(config, batch=1, layers="all", **question)
    assert isinstance(sampled.model, ShallowLoraModels) and sampled.model.prefix == 2
    assert sampled.layers_note.startswith("its 9 layers are 2 built apart, then one layer repeated: the step traced at depths 5, 6, 7")
    assert _numbers(sampled) == _numbers(whole)
    budget = whole.peak_bytes + 5 * (whole.peak_bytes - whole.start_bytes)  # about six sequences
    searched = [largest_lora_batch(config, budget_bytes=budget, layers=layers, **question) for layers in ("sampled", "all")]
    assert searched[0].largest == searched[1].largest > 1 and searched[0].to_dict() == searched[1].to_dict()


def test_a_model_type_not_checked_to_repeat_is_traced_whole() -> None:
    from resacct.account.trace.lora_layers import lora_layer_plan

    plan = lora_layer_plan(_config({"model_type": "codegen", "vocab_size": 160, "n_embd": 64, "n_head": 4, "n_layer": 24, "rotary_dim": 8}))
    assert plan.depth == 24 and not plan.sample and "model_type 'codegen' is not among those checked to repeat" in plan.why_whole
    deep = dict(TINY["llama"], num_hidden_layers=24)
    assert lora_layer_plan(_config(deep)).sample and not lora_layer_plan(_config(deep), "all").sample
    assert not lora_layer_plan(_config(TINY["llama"])).sample and lora_layer_plan(_config(TINY["llama"]), "sampled").sample


def test_trace_all_layers_needs_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lora", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--mlp", "256", "--trace-all-layers"]) == 2
    err = capsys.readouterr().err
    assert "--trace-all-layers applies to --hf-config" in err and err.count("\n") == 1


@pytest.mark.slow  # a 24-layer Llama's step: 3 shallow traces, then every layer for the comparison
def test_the_command_says_how_it_traced_and_answers_the_same(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(TINY["llama"], num_hidden_layers=24)))
    argv = ["lora", "--hf-config", str(path), "--rank", "4", "--seq", "16", "--base", "fp32", "--memory-gb", "0.01"]
    assert main(argv) == 0
    assert "  layers: its 24 layers are one layer repeated: the step traced at depths 3, 4, 5 (12 layers, not 24)" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    sampled = json.loads(capsys.readouterr().out)
    assert main([*argv, "--json", "--trace-all-layers"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert sampled["traced"].pop("layers_note").startswith("its 24 layers") and whole["traced"].pop("layers_note") is None
    assert sampled == whole and sampled["largest_batch"] > 1


@pytest.mark.slow  # three shallow steps at batch 1, then the whole step at batches 2 and 3
def test_a_later_batch_that_does_not_repeat_falls_back_to_whole_for_it_and_every_batch_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """lora_batch_peaks: the first batch is sampled; a batch whose depths do not repeat is traced with
    every layer (the same peak as a whole trace), says why, and the batches after it stay whole."""
    import resacct.account.trace.lora_layers as lora_layers
    from resacct.account.fit.lora_batch import lora_batch_peaks
    from resacct.account.peak.layer_segments import NotRepeating

    real = lora_layers.lora_step_peak
    seen: list[tuple[int, bool]] = []

    def not_repeating_at_batch_2(model, inputs_of, loss, optimizer, batch):  # type: ignore[no-untyped-def]
        seen.append((batch, isinstance(model, ShallowLoraModels)))
        if isinstance(model, ShallowLoraModels) and batch == 2:
            raise NotRepeating("a test's step that is not a line")
        return real(model, inputs_of, loss, optimizer, batch)

    monkeypatch.setattr(lora_layers, "lora_step_peak", not_repeating_at_batch_2)
    config = _config(TINY["llama"])
    question = {"rank": 4, "targets": ("q_proj", "v_proj"), "base": "fp32", "seq": 16}
    said: dict[str, str] = {}
    peak_of = lora_batch_peaks(config, layers="sampled", said=said, **question)
    peaks = {batch: peak_of(batch).peak_bytes for batch in (1, 2, 3)}
    assert seen == [(1, True), (2, True), (2, False), (3, False)]
    assert said["how"] == "every layer traced: at batch 2 the layers did not repeat (a test's step that is not a line)"
    whole = lora_batch_peaks(config, layers="all", **question)
    assert peaks == {batch: whole(batch).peak_bytes for batch in (1, 2, 3)}
