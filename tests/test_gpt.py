"""The GPT model: parameter counts against known figures, shapes, causality, meta-device builds."""

from __future__ import annotations

import pytest
import torch

from resacct.errors import ResacctError
from resacct.training.gpt import GPT_CONFIGS, GPTConfig, build_gpt, gpt_parameter_count, parameter_count


@pytest.mark.parametrize(
    ("name", "known_parameters"),
    [
        ("gpt2-small", 124_439_808),   # GPT-2 small with tied embeddings (HF GPT2LMHeadModel)
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
    ],
)
def test_gpt2_parameter_counts_match_the_known_figures(name, known_parameters):
    model = build_gpt(name, device="meta")
    assert parameter_count(model) == known_parameters
    assert gpt_parameter_count(GPT_CONFIGS[name]) == known_parameters


def test_meta_build_allocates_nothing():
    model = build_gpt("gpt2-small", device="meta")
    assert all(parameter.device.type == "meta" for parameter in model.parameters())


def test_lm_head_is_tied_to_the_token_embedding():
    model = build_gpt("gpt-nano")
    assert model.lm_head.weight is model.token_embedding.weight


def test_output_shape_and_causality():
    model = build_gpt("gpt-nano").eval()
    tokens = torch.randint(0, 256, (2, 10))
    logits = model(tokens)
    assert logits.shape == (2, 10, 256)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256  # changing the last token cannot change earlier outputs
    assert torch.allclose(model(changed)[:, :-1], logits[:, :-1], atol=1e-6)
    assert not torch.allclose(model(changed)[:, -1], logits[:, -1])


def test_math_and_sdpa_attention_agree():
    tokens = torch.randint(0, 256, (2, 12))
    math_model = build_gpt("gpt-nano", attention="math", seed=3).eval()
    sdpa_model = build_gpt("gpt-nano", attention="sdpa", seed=3).eval()
    assert torch.allclose(math_model(tokens), sdpa_model(tokens), atol=1e-5)


def test_sequence_longer_than_context_is_refused():
    model = build_gpt("gpt-nano")
    with pytest.raises(ResacctError, match="longer than the context length 64"):
        model(torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("d_model", 0, "d_model must be a whole number > 0, got 0"), ("n_heads", 5, "d_model 64 is not divisible by n_heads 5")],
)
def test_bad_configs_are_refused(field, value, message):
    arguments = dict(vocab_size=256, context_length=64, n_layers=2, n_heads=2, d_model=64)
    arguments[field] = value
    with pytest.raises(ResacctError, match=message):
        GPTConfig(**arguments)


def test_unknown_config_name_suggests_close_matches():
    with pytest.raises(ResacctError, match="did you mean 'gpt2-small'"):
        build_gpt("gpt2-smal", device="meta")
