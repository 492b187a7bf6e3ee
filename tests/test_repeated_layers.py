"""A deep transformers config accounted from its step traced at depths 3, 4 and 5
(resacct.account.trace.repeated_layers, resacct.account.peak.layer_segments) equals the account of
every layer traced — FLOPs per module and op, the state, every saved tensor, the step's peak, what is
live at it, when, and each phase's peak — and anything that does not repeat is traced whole."""

from __future__ import annotations

import pytest

from resacct.account.peak.layer_segments import NotRepeating, _affine, _plane
from resacct.errors import ResacctError

pytest.importorskip("transformers")

from resacct.account.answers.hf import account_hf_config  # noqa: E402
from resacct.account.trace.repeated_layers import SAMPLED_ABOVE_LAYERS  # noqa: E402
from resacct.account.load.hf_models import REPEATING_MODEL_TYPES, HfConfigSpec  # noqa: E402

_DECODER = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 160,
            "max_position_embeddings": 128}
TINY = {
    "llama": {"model_type": "llama", **_DECODER},
    "mistral": {"model_type": "mistral", **_DECODER, "sliding_window": 16},
    "mixtral": {"model_type": "mixtral", **_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {"model_type": "qwen2", **_DECODER},
    "qwen3": {"model_type": "qwen3", **_DECODER, "head_dim": 16},
    "phi3": {"model_type": "phi3", **_DECODER, "pad_token_id": 0},
    "olmo2": {"model_type": "olmo2", **_DECODER, "pad_token_id": 0},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "vocab_size": 160,
                 "max_position_embeddings": 128},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 160, "n_positions": 128},
    "qwen3_moe": {"model_type": "qwen3_moe", **_DECODER, "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 4,
                  "num_experts_per_tok": 2},
    "falcon": {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 160, "multi_query": True,
               "parallel_attn": True, "bias": False, "alibi": False, "new_decoder_architecture": False},
    "bloom": {"model_type": "bloom", "n_embed": 64, "n_head": 4, "vocab_size": 160},
    # two dense layers, then mixture-of-experts ones: a prefix built apart, kept in every sampled depth
    "deepseek_v3": {"model_type": "deepseek_v3", "vocab_size": 160, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
                    "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                    "first_k_dense_replace": 2, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                    "v_head_dim": 16, "n_group": 1, "topk_group": 1, "max_position_embeddings": 128},
}
_MOE = {"moe_intermediate_size": 32, "num_experts_per_tok": 2}
_PREFIXED = {"n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 2, "n_group": 1, "topk_group": 1}
TINY.update({  # round four, session 13
    "gemma": {"model_type": "gemma", **_DECODER, "head_dim": 16},
    "granite": {"model_type": "granite", **_DECODER},
    "granitemoe": {"model_type": "granitemoe", **_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
    "starcoder2": {"model_type": "starcoder2", **_DECODER},
    "cohere": {"model_type": "cohere", **_DECODER},
    "stablelm": {"model_type": "stablelm", **_DECODER},
    # Qwen1.5-MoE's shape: a shared expert beside the routed ones (its config writes sliding_window 0: no window)
    "qwen2_moe": {"model_type": "qwen2_moe", **_DECODER, **_MOE, "num_experts": 4, "shared_expert_intermediate_size": 48},
    "olmo": {"model_type": "olmo", **_DECODER, "pad_token_id": 0},
    "olmoe": {"model_type": "olmoe", **_DECODER, "num_experts": 4, "num_experts_per_tok": 2},
    "gpt_bigcode": {"model_type": "gpt_bigcode", "n_embd": 64, "n_head": 4, "vocab_size": 160, "n_positions": 128},
    "gptj": {"model_type": "gptj", "n_embd": 64, "n_head": 4, "vocab_size": 160, "n_positions": 128, "rotary_dim": 8},
    "phimoe": {"model_type": "phimoe", **_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
    "glm": {"model_type": "glm", **_DECODER, "head_dim": 16, "pad_token_id": 0},
    "glm4": {"model_type": "glm4", **_DECODER, "head_dim": 16, "pad_token_id": 0},
    "glm4_moe": {"model_type": "glm4_moe", **_DECODER, **_MOE, **_PREFIXED, "head_dim": 16},
    "ernie4_5": {"model_type": "ernie4_5", **_DECODER, "head_dim": 16},
    "helium": {"model_type": "helium", **_DECODER, "head_dim": 16},
    "deepseek_v2": {"model_type": "deepseek_v2", **_DECODER, **_MOE, **_PREFIXED, "num_key_value_heads": 4, "kv_lora_rank": 16, "q_lora_rank": 24,
                    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16},
    "seed_oss": {"model_type": "seed_oss", **_DECODER, "head_dim": 16},
    "apertus": {"model_type": "apertus", **_DECODER},
    "arcee": {"model_type": "arcee", **_DECODER},
    "hunyuan_v1_dense": {"model_type": "hunyuan_v1_dense", **_DECODER, "head_dim": 16},
    # sliding and full attention layers alternating: a unit of two layers (a window of 16 of the 24 tokens)
    "gemma2": {"model_type": "gemma2", **_DECODER, "head_dim": 16, "sliding_window": 16},
    "gpt_oss": {"model_type": "gpt_oss", **_DECODER, "head_dim": 16, "sliding_window": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
})
#: the layers each tiny config is traced whole at, against its sampled account: two more than the deepest sample
_DEPTH = {"deepseek_v3": 9, "deepseek_v2": 9, "glm4_moe": 9, "gemma2": 12, "gpt_oss": 12}
#: the depths each is sampled at, where not 3, 4 and 5 layers: a prefix of 2 kept, or units of 2 layers
_SAMPLED_AT = {"deepseek_v3": "5, 6, 7", "deepseek_v2": "5, 6, 7", "glm4_moe": "5, 6, 7", "gemma2": "6, 8, 10", "gpt_oss": "6, 8, 10"}
_DEPTH_KEY = {"gpt2": "n_layer", "bloom": "n_layer", "gpt_bigcode": "n_layer", "gptj": "n_layer"}


def _spec(model_type: str, layers: int) -> HfConfigSpec:
    values = dict(TINY[model_type])
    values[_DEPTH_KEY.get(model_type, "num_hidden_layers")] = layers
    return HfConfigSpec(name=f"tiny {model_type}", source="tests", values=values)


def _equal_but_notes(extrapolated, whole, depths: str = "3, 4, 5") -> None:  # noqa: ANN001
    a, b = extrapolated.to_dict(), whole.to_dict()
    assert a.keys() == b.keys()
    for key in a:
        if key != "notes":
            assert a[key] == b[key], key
    assert f"traced at depths {depths}" in extrapolated.notes[-1]
    assert not any("traced at depths" in note for note in whole.notes)


def test_every_repeating_type_is_checked_here() -> None:
    assert set(TINY) == set(REPEATING_MODEL_TYPES)


@pytest.mark.slow  # 3-12 s each: four models built and traced
@pytest.mark.parametrize("model_type", sorted(TINY))
def test_extrapolated_account_equals_every_layer_traced(model_type: str) -> None:
    spec = _spec(model_type, _DEPTH.get(model_type, 7))
    depths = _SAMPLED_AT.get(model_type, "3, 4, 5")
    _equal_but_notes(account_hf_config(spec, batch=2, seq=24, layers="sampled"), account_hf_config(spec, batch=2, seq=24, layers="all"), depths)


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "recipe", "batch", "seq", "layers"), [
    ("gpt2", "fp32", 2, 32, 12),              # the peak moves from backward (depths 3-7) to the loss's forward at 12
    ("llama", "bf16", 1, 4, 9),               # the peak in the optimizer step
    ("llama", "bf16-fp32-master", 1, 8, 8),
    ("mixtral", "bf16-autocast", 2, 16, 6),
])
def test_extrapolated_peak_follows_the_phase_that_wins_at_depth(model_type: str, recipe: str, batch: int, seq: int, layers: int) -> None:
    spec = _spec(model_type, layers)
    _equal_but_notes(account_hf_config(spec, batch=batch, seq=seq, recipe=recipe, layers="sampled"),
                     account_hf_config(spec, batch=batch, seq=seq, recipe=recipe, layers="all"))


@pytest.mark.slow
def test_llama_2_7b_extrapolated_equals_its_32_layers_traced() -> None:
    _equal_but_notes(account_hf_config("llama-2-7b", batch=1, seq=256, layers="sampled"), account_hf_config("llama-2-7b", batch=1, seq=256, layers="all"))


@pytest.mark.slow
def test_shallow_models_are_traced_whole() -> None:
    """At 5 layers there is nothing to sample; by default, up to 16 layers one whole trace is cheaper than three builds."""
    for layers, asked in ((5, "sampled"), (SAMPLED_ABOVE_LAYERS, "auto")):
        account = account_hf_config(_spec("llama", layers), batch=1, seq=8, layers=asked)
        assert not any("traced at depths" in note for note in account.notes)
    deeper = account_hf_config(_spec("llama", SAMPLED_ABOVE_LAYERS + 1), batch=1, seq=8)
    assert "traced at depths 3, 4, 5" in deeper.notes[-1]


def test_an_unknown_layers_choice_is_refused() -> None:
    with pytest.raises(ResacctError, match="layers 'some': expected one of auto, sampled, all"):
        account_hf_config(_spec("llama", 7), batch=1, seq=8, layers="some")


@pytest.mark.slow
def test_layers_that_alternate_kinds_repeat_a_unit_of_their_period() -> None:
    """``layer_types`` alternating (Gemma-2, gpt-oss: sliding, full) make a unit of two layers: sampled at 3, 4 and 5 units
    where that traces fewer layers (auto: 24 of them, from 30 layers on, as 12 from 17 for one layer); a pattern that does not repeat whole units,
    or kinds in no pattern, is traced whole and says why."""
    from resacct.account.load.hf_models import StackShape, _period, config_layer_stack, transformers_config
    from resacct.account.trace.repeated_layers import layer_plan, plan_for_depth, sampled_note

    assert [_period(list(kinds)) for kinds in ("", "s", "sf" * 21, "sssssf" * 8, "ssff" * 5, "sf", "sfs", "ssf" + "sf" * 10)] == [1, 1, 2, 6, 4, None, None, None]
    assert config_layer_stack(transformers_config(_spec("gemma2", 42))) == StackShape(42, 0, 2, None)
    plan = layer_plan(_spec("gemma2", 42))
    assert (plan.sample, plan.period, plan.sample_layers()) == (True, 2, (6, 8, 10))
    assert not layer_plan(_spec("gemma2", 28)).sample and layer_plan(_spec("gemma2", 28), "sampled").sample and layer_plan(_spec("gemma2", 30)).sample
    assert plan_for_depth(43, None, "sampled", 0, 2).why_whole == "its 43 layers after the first 0 are not whole units of 2"
    assert sampled_note(42, period=2).startswith("its 42 layers are a unit of 2 layers repeated: traced at depths 6, 8, 10 (24 layers, not 42)")
    mixed = HfConfigSpec(name="t", source="tests", values={**TINY["gemma2"], "num_hidden_layers": 12, "layer_types": ["sliding_attention"] * 11 + ["full_attention"]})
    assert config_layer_stack(transformers_config(mixed)).why_not == "its layers are of 2 kinds (full_attention, sliding_attention), in no repeating pattern"


@pytest.mark.slow  # 2.6 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_a_type_not_checked_to_repeat_is_traced_whole_and_says_why() -> None:
    spec = HfConfigSpec(name="tiny gemma3", source="tests", values={"model_type": "gemma3_text", **_DECODER, "num_hidden_layers": 6, "head_dim": 16})
    account = account_hf_config(spec, batch=1, seq=8, layers="sampled")
    assert any(note.startswith("all 6 layers traced: model_type 'gemma3_text' is not among") for note in account.notes)


@pytest.mark.slow
@pytest.mark.parametrize(("field", "value"), [("mlp_only_layers", [1]), ("decoder_sparse_step", 2)])
def test_a_moe_that_builds_layers_by_index_is_traced_whole_and_says_why(field: str, value: object) -> None:
    """Qwen3-MoE makes a layer dense by its index (in ``mlp_only_layers``, or (index + 1) not a multiple of
    ``decoder_sparse_step``): such a config is not one layer repeated, whatever its model type."""
    values = {**TINY["qwen3_moe"], "num_hidden_layers": 7, field: value}
    account = account_hf_config(HfConfigSpec(name="tiny qwen3-moe", source="tests", values=values), batch=1, seq=8, layers="sampled")
    assert any(note.startswith(f"all 7 layers traced: it builds a layer by its index ({field}={value!r})") for note in account.notes), account.notes


@pytest.mark.slow
def test_layers_that_differ_fall_back_to_every_layer_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSeek-V3's first dense layers, not known as a prefix: at depths 3, 4, 5 with 4 dense layers, the last layer is
    dense at 3 and 4 but not at 5 — the check catches it and the whole model is traced."""
    import resacct.account.load.hf_models as hf_models

    monkeypatch.setattr(hf_models, "PREFIX_FIELDS", ())
    values = {**TINY["deepseek_v3"], "num_hidden_layers": 7, "first_k_dense_replace": 4}
    account = account_hf_config(HfConfigSpec(name="tiny deepseek", source="tests", values=values), batch=1, seq=8, layers="sampled")
    assert any(note.startswith("all 7 layers traced:") for note in account.notes), account.notes


def test_a_prefix_built_apart_is_planned_into_every_sample() -> None:
    """The plan keeps a prefix in each sampled depth and samples by default only where that traces fewer layers; the
    stack's shape reads the prefix from the config."""
    from resacct.account.load.hf_models import StackShape, config_layer_stack, transformers_config
    from resacct.account.trace.repeated_layers import layer_plan, plan_for_depth, sampled_note

    plan = layer_plan(_spec("deepseek_v3", 61))
    assert (plan.sample, plan.prefix, plan.sample_layers()) == (True, 2, (5, 6, 7))
    assert plan_for_depth(61, None, "auto", 3).sample_layers() == (6, 7, 8)
    assert not plan_for_depth(16 + 3 * 3, None, "auto", 3).sample and plan_for_depth(17 + 3 * 3, None, "auto", 3).sample
    assert not plan_for_depth(8, None, "sampled", 3).sample and plan_for_depth(9, None, "sampled", 3).sample
    assert plan_for_depth(61, "its layers are of 2 kinds", "auto", 3).prefix == 0
    assert sampled_note(61, prefix=3).startswith("its 61 layers are 3 built apart, then one layer repeated: traced at depths 6, 7, 8 (21 layers, not 61)")
    assert layer_plan(_spec("deepseek_v3", 61)).prefix == 2
    every_dense = layer_plan(HfConfigSpec(name="t", source="tests", values={**TINY["deepseek_v3"], "num_hidden_layers": 20, "first_k_dense_replace": 20}))
    assert (every_dense.sample, every_dense.prefix) == (True, 0)  # every layer dense: one layer repeated
    assert config_layer_stack(transformers_config(_spec("deepseek_v3", 61))) == StackShape(61, 2, 1, None)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["fp32", "bf16-fp32-master"])
def test_a_prefix_built_apart_extrapolates_to_every_layer_traced(recipe: str) -> None:
    """Three dense layers before the experts ones (DeepSeek-V3's 3 of 61): at 10 layers, the account from depths 6, 7
    and 8 equals every layer traced, in the recipes that trace once and those that do not."""
    spec = HfConfigSpec(name="tiny deepseek", source="tests", values={**TINY["deepseek_v3"], "num_hidden_layers": 10, "first_k_dense_replace": 3})
    _equal_but_notes(account_hf_config(spec, batch=1, seq=16, recipe=recipe, layers="sampled"),
                     account_hf_config(spec, batch=1, seq=16, recipe=recipe, layers="all"), "6, 7, 8")


def test_a_number_off_the_line_is_refused() -> None:
    assert _affine({3: 10, 4: 14, 5: 18}, 80, "x") == 18 + 75 * 4
    with pytest.raises(NotRepeating, match="not a line"):
        _affine({3: 10, 4: 14, 5: 19}, 80, "x")
    plane = {(d, i): 100 + 7 * i + 30 * d for d in (3, 4, 5) for i in range(1, d - 1)}
    assert _plane(plane, 80, 78, "y") == 100 + 7 * 78 + 30 * 80
    plane[(5, 3)] += 1
    with pytest.raises(NotRepeating, match="middle layer 3 at depth 5"):
        _plane(plane, 80, 78, "y")


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "memory_bytes"), [("fp32", 40e6), ("bf16", 9e6)])
def test_fit_probes_sampled_find_what_every_layer_traced_finds(tmp_path, recipe: str, memory_bytes: float) -> None:  # noqa: ANN001
    """``fit``'s search over a 17-layer Llama: each probe from depths 3, 4, 5 gives the same answer and the same
    peak at every probed batch as each probe tracing all 17 layers."""
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY["llama"], "num_hidden_layers": SAMPLED_ABOVE_LAYERS + 1}))
    _same_search(path, memory_bytes, recipe, "each probe the step at depths 3, 4, 5 (12 of 17 layers)")


@pytest.mark.slow
def test_fit_probes_of_a_stack_with_a_prefix_find_what_every_layer_traced_finds(tmp_path) -> None:  # noqa: ANN001
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY["deepseek_v3"], "num_hidden_layers": 9}))  # sampled when asked (auto: from 23 layers)
    _same_search(path, 12e6, "fp32", "each probe the step at depths 5, 6, 7 (18 of 9 layers; its first 2 layers, built apart, in each)", "sampled")


@pytest.mark.slow
def test_fit_probes_of_layers_that_alternate_kinds_find_what_every_layer_traced_finds(tmp_path) -> None:  # noqa: ANN001
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY["gemma2"], "num_hidden_layers": 12}))  # sampled when asked (auto: from 30 layers)
    _same_search(path, 8e6, "bf16", "each probe the step at depths 6, 8, 10 (24 of 12 layers)", "sampled")


def _same_search(path, memory_bytes: float, recipe: str, how: str, layers: str = "auto") -> None:  # noqa: ANN001
    from resacct.account.fit.search import fit_step, hf_config_target

    sampled = fit_step(hf_config_target(str(path), layers=layers), memory_bytes=memory_bytes, seq=32, recipe=recipe)
    whole = fit_step(hf_config_target(str(path), layers="all"), memory_bytes=memory_bytes, seq=32, recipe=recipe)
    assert sampled.sampled is not None and sampled.sampled.startswith(how), sampled.sampled
    assert whole.sampled is None
    assert sampled.largest == whole.largest and sampled.largest > 1
    assert [(p.size, p.peak_bytes) for p in sampled.probes] == [(p.size, p.peak_bytes) for p in whole.probes]
    assert (sampled.peak_phase, sampled.peak_op, sampled.live_at_peak_bytes) == (whole.peak_phase, whole.peak_op, whole.live_at_peak_bytes)


@pytest.mark.slow  # 2-4 accounts of a 7-layer Llama: 4-8 s loaded
@pytest.mark.parametrize("layers", ["all", "sampled"])
def test_an_account_without_the_peak_is_the_same_account_less_the_peak(layers: str) -> None:
    """``peak=False`` (the hf claims' small models: no claim there reads the peak) skips the pass on
    fake tensors and changes nothing else — whole or extrapolated."""
    spec = _spec("llama", 7)
    with_peak = account_hf_config(spec, batch=2, seq=24, layers=layers).to_dict()
    without = account_hf_config(spec, batch=2, seq=24, layers=layers, peak=False)
    assert without.step_peak is None and "step_peak" in with_peak
    assert without.to_dict() == {key: value for key, value in with_peak.items() if key != "step_peak"}


@pytest.mark.slow  # two searches over a 17-layer Llama: ~10 s loaded
def test_fit_trace_all_layers_traces_every_layer_and_answers_the_same(tmp_path, capsys) -> None:  # noqa: ANN001
    import json

    from resacct.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY["llama"], "num_hidden_layers": SAMPLED_ABOVE_LAYERS + 1}))
    argv = ["fit", "--hf-config", str(path), "--seq", "32", "--memory-gb", "0.04", "--no-cache", "--json"]
    answers = []
    for extra in ([], ["--trace-all-layers"]):
        assert main([*argv, *extra]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    sampled, whole = answers
    assert sampled["sampled_layers"].startswith("each probe the step at depths 3, 4, 5") and whole["sampled_layers"] is None
    assert sampled["largest"] == whole["largest"] > 1
    assert [(p["size"], p["predicted_peak_bytes"]) for p in sampled["probes"]] == [(p["size"], p["predicted_peak_bytes"]) for p in whole["probes"]]


@pytest.mark.parametrize("argv", [
    ["fit", "--memory-gb", "80", "--trace-all-layers"],
    ["fit", "--model", "resacct.training.models:Cruncher", "--memory-gb", "1", "--trace-all-layers"],
    ["account", "--model", "resacct.training.models:Cruncher", "--trace-all-layers"],
])
def test_trace_all_layers_without_a_config_is_one_line(capsys, argv: list[str]) -> None:  # noqa: ANN001
    from resacct.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--trace-all-layers" in err and err.count("\n") == 1 and "Traceback" not in err
