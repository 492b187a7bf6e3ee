"""resacct.account and resacct.formulas.gpt_formulas: exact FLOPs per module against FlopCounterMode,
training state from a real AdamW under each recipe, the optimizer's scratch, and the account."""

from __future__ import annotations

import math

import pytest
import torch

from resacct.account import (
    account_gpt,
    measure_optimizer_step_transient,
    measure_training_state,
    predict_optimizer_step_transient_bytes,
    sdpa_gap_formulas,
    trace_step_flops,
)
from resacct.measurement.activations import gpt_loss
from resacct.errors import ResacctError, UnknownNameError
from resacct.training.gpt import GPT_CONFIGS, GPTConfig, build_gpt, get_gpt_config, parameter_count
from resacct.formulas.gpt_formulas import (
    gpt_layer_saved_bytes,
    gpt_matmul_parameter_count,
    korthikanti_differences,
    korthikanti_layer_activation_bytes,
    nanogpt_parameter_count,
    palm_step_flops,
    predict_gpt_step_flops,
    six_n_step_flops,
)


def _loss_fn(model, config: GPTConfig, batch: int, seq: int, device: str = "cpu"):
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(device)
    targets = torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(device)
    return lambda module=model: gpt_loss(module, tokens, targets)


# ── FLOPs ────────────────────────────────────────────────────────────────────────────────


@pytest.mark.slow
@pytest.mark.parametrize(("name", "batch", "seq"), [("gpt-nano", 1, 1), ("gpt-nano", 3, 64), ("gpt-tiny", 2, 100), ("gpt2-small", 1, 1024), ("gpt2-medium", 2, 128)])
def test_exact_formula_equals_flop_counter_mode_per_phase_and_module(name, batch, seq):
    config = get_gpt_config(name)
    model = build_gpt(config, device="meta")
    trace = trace_step_flops(model, _loss_fn(model, config, batch, seq, "meta"))
    predicted = predict_gpt_step_flops(config, batch, seq)
    assert (trace.forward_flops, trace.backward_flops) == (predicted.forward_flops, predicted.backward_flops)
    assert dict(trace.forward_by_module) == predicted.by_module("forward")
    assert dict(trace.backward_by_module) == predicted.by_module("backward")
    assert sum(trace.forward_by_module.values()) == trace.forward_flops
    assert trace.backward_flops == 2 * trace.forward_flops


def test_uncounted_ops_are_listed_and_the_trace_leaves_no_gradients():
    config = get_gpt_config("gpt-nano")
    model = build_gpt(config)
    trace = trace_step_flops(model, _loss_fn(model, config, 2, 8))
    names = {op.op for op in trace.uncounted_ops}
    assert "aten._softmax.default" in names and "aten.native_layer_norm.default" in names and "aten.gelu.default" in names
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.slow
def test_fused_cpu_attention_counts_zero_and_resacct_fills_it():
    config = get_gpt_config("gpt-tiny")
    model = build_gpt(config, attention="sdpa")
    raw = trace_step_flops(model, _loss_fn(model, config, 2, 32), fill_tracer_gaps=False)
    filled = trace_step_flops(model, _loss_fn(model, config, 2, 32))
    math_model = build_gpt(config, attention="math")
    math_trace = trace_step_flops(math_model, _loss_fn(math_model, config, 2, 32))
    assert any("flash_attention_for_cpu" in op.op and op.estimated_flops is None for op in raw.uncounted_ops)
    assert any("flash_attention_for_cpu" in warning for warning in raw.warnings)  # a matmul-class op counted 0: a warning
    assert not any("flash_attention" in op.op for op in filled.uncounted_ops) and not filled.warnings
    math_path = predict_gpt_step_flops(config, 2, 32)
    fused = predict_gpt_step_flops(config, 2, 32, fused_attention=True)
    assert raw.step_flops == math_path.step_flops - math_path.attention_flops == 6 * 64 * gpt_matmul_parameter_count(config)
    assert filled.step_flops == math_trace.step_flops == math_path.step_flops  # model FLOPs: the math twin's count
    assert (filled.forward_flops, filled.backward_flops) == (math_trace.forward_flops, math_trace.backward_flops)
    assert filled.attention_recompute_flops == fused.step_flops - math_path.step_flops == 2 * config.n_layers * 2 * 32 * 32 * config.d_model
    assert filled.gap_filled_flops == filled.step_flops - raw.step_flops
    assert len(sdpa_gap_formulas()) >= 2


def test_conventions_against_the_exact_count():
    config = get_gpt_config("gpt2-small")
    params = parameter_count(build_gpt(config, device="meta"))
    exact = predict_gpt_step_flops(config, 1, 1024).step_flops
    assert six_n_step_flops(params, 1024) == 6 * 124439808 * 1024
    assert exact / six_n_step_flops(params, 1024) == pytest.approx(1.1444, abs=1e-4)
    assert exact / palm_step_flops(params, config, 1, 1024) == pytest.approx(0.99915, abs=1e-5)
    assert nanogpt_parameter_count(params, config) == params - 1024 * 768
    assert gpt_matmul_parameter_count(config) == params - 1024 * 768 - 12 * 13 * 768 - 2 * 768


@pytest.mark.parametrize(("args", "match"), [((0, 8), "batch must be"), ((2, 0), "seq must be"), ((2, 65), "longer than the model's context length 64")])
def test_formulas_refuse_bad_sizes(args, match):
    with pytest.raises(ResacctError, match=match):
        predict_gpt_step_flops(get_gpt_config("gpt-nano"), *args)


# ── Korthikanti ──────────────────────────────────────────────────────────────────────────


def test_korthikanti_formula_and_where_this_model_differs():
    assert korthikanti_layer_activation_bytes(seq=2048, batch=1, hidden=12288, heads=96) == 2048 * 12288 * 34 + 5 * 96 * 2048**2
    for name in ("gpt-nano", "gpt-tiny", "gpt2-small"):
        config = get_gpt_config(name)
        for element, device in ((2, "cpu"), (4, "cpu"), (2, "meta")):
            published = korthikanti_layer_activation_bytes(64, 3, config.d_model, config.n_heads)
            differences = korthikanti_differences(config, 3, 64, element_bytes=element, device_type=device)
            assert published + sum(differences.values()) == gpt_layer_saved_bytes(config, 3, 64, element_bytes=element, device_type=device)
    with pytest.raises(ResacctError, match="heads must be"):
        korthikanti_layer_activation_bytes(8, 1, 64, 0)


# ── training state ───────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("recipe", "after_backward", "at_step"), [("fp32", 16, 16), ("bf16-autocast", 16, 16), ("bf16", 8, 8),
                                                                    ("bf16-fp32-master", 16, 20), ("bf16-fp32-master-free-bf16-grads", 16, 18)])
def test_real_adamw_state_per_recipe(recipe, after_backward, at_step):
    config = get_gpt_config("gpt-nano")
    model = build_gpt(config)
    state = measure_training_state(model, _loss_fn(model, config, 2, 8), recipe)
    counters = 4 * state.parameter_tensors
    assert state.parameters == parameter_count(model) == 120576
    assert state.after_backward_bytes == after_backward * state.parameters + counters == state.predicted_after_backward_bytes
    assert state.at_step_bytes == at_step * state.parameters + counters == state.predicted_at_step_bytes
    assert state.step_counter_bytes == counters
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the caller's model is untouched


def test_tied_lm_head_is_one_storage_in_the_state():
    config = get_gpt_config("gpt-nano")
    model = build_gpt(config)
    state = measure_training_state(model, _loss_fn(model, config, 2, 8), "fp32")
    assert state.parts_bytes["parameters"] == 4 * 120576  # not 4 · (120576 + 256·64)
    assert state.parts_bytes["optimizer moments"] == 8 * 120576


@pytest.mark.slow
def test_gpt2_small_state_on_meta_without_allocating():
    config = get_gpt_config("gpt2-small")
    model = build_gpt(config, device="meta")
    state = measure_training_state(model, _loss_fn(model, config, 1, 16, "meta"), "bf16-fp32-master")
    assert state.at_step_bytes == 20 * 124439808 + 4 * state.parameter_tensors


def test_optimizer_step_scratch_is_one_parameter_copy_with_foreach():
    config = get_gpt_config("gpt-nano")
    model = build_gpt(config)
    sizes = [p.numel() for p in model.parameters()]
    foreach = measure_optimizer_step_transient(model, _loss_fn(model, config, 2, 8), foreach=True)
    loop = measure_optimizer_step_transient(model, _loss_fn(model, config, 2, 8), foreach=False)
    assert foreach.peak_bytes == pytest.approx(predict_optimizer_step_transient_bytes(sizes, foreach=True), abs=64)
    assert loop.peak_bytes == pytest.approx(predict_optimizer_step_transient_bytes(sizes, foreach=False), abs=64)
    assert foreach.peak_bytes == pytest.approx(4 * sum(sizes), abs=64)
    with pytest.raises(ResacctError, match="traced on CPU"):
        meta = build_gpt(config, device="meta")
        measure_optimizer_step_transient(meta, _loss_fn(meta, config, 2, 8, "meta"))


# ── the account ──────────────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_account_of_a_small_model_measured_on_cpu():
    account = account_gpt("gpt-nano", batch=4, seq=32, checkpoint_segments=2, grad_accum=2, time_step=True, train_tokens=1e9)
    rows = {(row.section, row.quantity): row for row in account.rows()}
    for key in [("FLOPs", "step (exact per-matmul formula)"), ("training state", "at optimizer step (fp32, AdamW)"),
                ("activations", "saved for backward (resacct formula)"), ("checkpointing", "held after forward, k=2"),
                ("checkpointing", "recompute FLOPs, k=2")]:
        assert rows[key].ratio == 1.0, key
    assert rows[("peak", "AdamW step transient (foreach)")].ratio == pytest.approx(1.0, abs=1e-4)
    assert rows[("grad accumulation", "held per micro-batch of 2 (× 2)")].ratio == pytest.approx(1.0, abs=1e-4)
    assert rows[("FLOPs", "step, 6N rule (lecture)")].ratio != 1.0
    assert account.timing is not None and account.timing.median_sec > 0 and account.timing.mfu is None
    days = rows[("time", "1e+09 tokens on 1 such device(s)")].measured
    assert days == pytest.approx(account.flops.step_flops / account.tokens * 1e9 / account.timing.achieved_flops_per_sec / 86400)
    module_rows = {row.module: row for row in account.per_module_rows()}
    assert module_rows["blocks.1.mlp.up"].traced_backward_flops == module_rows["blocks.1.mlp.up"].predicted_backward_flops > 0
    assert module_rows["(loss)"].measured_saved_bytes == module_rows["(loss)"].predicted_saved_bytes > 0


@pytest.mark.slow
def test_account_of_gpt2_small_stays_on_meta_and_is_exact():
    account = account_gpt("gpt2-small", batch=1, seq=1024)
    assert account.device == "meta" and account.timing is None and account.step_peak_bytes is None
    assert account.parameters == 124439808
    assert account.flops.step_flops == account.predicted_flops.step_flops == 874944921600
    assert account.saved.activation_bytes == account.predicted_saved_bytes == 1432915972
    fields = account.to_json()
    assert fields["flops"][0] == {"quantity": "forward (exact per-matmul formula)", "predicted_flops": 291648307200,
                                  "measured_flops": 291648307200, "ratio": 1.0, "note": "FlopCounterMode"}
    assert any("meta device" in note for note in fields["notes"])
    assert math.isclose(fields["activations"][-1]["measured_bytes_per_parameter"], 27.5149, rel_tol=1e-4)


@pytest.mark.slow
def test_account_gives_mfu_with_a_peak():
    account = account_gpt("gpt-nano", batch=2, seq=16, peak_flops_per_sec=1e12, peak_source="test peak")
    assert account.timing.mfu == pytest.approx(account.timing.achieved_flops_per_sec / 1e12)
    assert any(row.quantity == "MFU" for row in account.rows())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model": "gpt2-smal"}, UnknownNameError, "did you mean 'gpt2-small'"),
        ({"model": "gpt-nano", "seq": 65}, ResacctError, "seq 65 is longer than the model's context length 64"),
        ({"model": "gpt-nano", "batch": 0}, ResacctError, "batch 0: expected a whole number ≥ 1"),
        ({"model": "gpt-nano", "checkpoint_segments": 3}, ResacctError, "exceed the 2 layers"),
        ({"model": "gpt-nano", "batch": 4, "grad_accum": 3}, ResacctError, "not divisible by 3"),
        ({"model": "gpt-nano", "recipe": "fp33"}, UnknownNameError, "did you mean 'fp32'"),
    ],
)
def test_account_refuses_bad_requests(kwargs, error, match):
    with pytest.raises(error, match=match):
        account_gpt(**kwargs, measure=False)


@pytest.mark.slow
def test_named_configs_account_on_meta():
    for name in ("gpt-nano", "gpt-tiny", "gpt-small-cpu"):  # GPT-2 sizes take seconds on meta: tested apart
        assert name in GPT_CONFIGS
        account = account_gpt(name, batch=1, seq=8, measure=False)
        assert account.flops.step_flops == account.predicted_flops.step_flops


# ── any nn.Module: optimizers, the generic account ──────────────────────────────────────


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "sgd-momentum", "adagrad", "rmsprop"])
@pytest.mark.parametrize("recipe", ["fp32", "bf16-fp32-master"])
def test_every_optimizers_real_state_equals_the_prediction(optimizer, recipe):
    from resacct.training.models import Cruncher

    model, x = Cruncher(dim=8, num_layers=2), torch.randn(3, 8)
    state = measure_training_state(model, lambda m: m(x.to(next(m.parameters()).dtype)).float().mean(), recipe, optimizer)
    per_param = {"sgd": 0, "sgd-momentum": 1, "adagrad": 1, "rmsprop": 1, "adam": 2, "adamw": 2}[optimizer]
    steps = 4 * 6 if optimizer in ("adagrad", "rmsprop", "adam", "adamw") else 0
    assert state.optimizer == optimizer and state.step_counter_bytes == steps
    assert (state.after_backward_bytes, state.at_step_bytes) == (state.predicted_after_backward_bytes, state.predicted_at_step_bytes)
    if recipe == "fp32":
        assert state.at_step_bytes == (8 + 4 * per_param) * model.parameter_count() + steps


def test_gpt_account_takes_the_optimizer_and_returns_a_dict():
    account = account_gpt("gpt-nano", batch=1, seq=8, measure=False, optimizer="rmsprop")
    assert account.state.at_step_bytes == account.state.predicted_at_step_bytes == 12 * account.parameters + 4 * account.state.parameter_tensors
    data = account.to_dict()
    assert data["optimizer"] == "rmsprop" and json_roundtrips(data)
    with pytest.raises(UnknownNameError, match="unknown optimizer 'adamx'"):
        account_gpt("gpt-nano", batch=1, seq=8, measure=False, optimizer="adamx")


def json_roundtrips(data) -> bool:
    import json

    return json.loads(json.dumps(data)) == data


def test_generic_account_of_an_mlp_is_predicted_exactly():
    from resacct.account.answers.generic import account_named_model

    account = account_named_model("resacct.account.answers.generic:mlp", model_args={"dim": 8, "hidden": 16, "depth": 2, "activation": "relu"}, batch=3, loss="mse")
    p = account.predicted
    assert (account.flops.forward_flops, account.flops.backward_flops) == (p.forward_flops, p.backward_flops)
    assert dict(account.flops.forward_by_module) == p.forward_by_module and dict(account.flops.backward_by_module) == p.backward_by_module
    assert account.saved.by_module() == p.saved_by_module and account.saved.activation_bytes == 4 * 3 * (8 + 16 * 2) + 2 * 4 * 3 * 8
    assert account.step_peak_bytes > 0 and account.optimizer_transient.peak_bytes >= account.predicted_optimizer_transient_bytes
    assert all(row.ratio in (None, 1.0) for row in account.rows() if row.section != "peak")
    assert json_roundtrips(account.to_dict())


def test_generic_account_without_a_formula_shows_measurements_only():
    from resacct.account.answers.generic import account_named_model

    account = account_named_model("tests.fixtures_user_model:build_conv", batch=2, optimizer="sgd")
    assert account.predicted is None and account.flops.forward_flops > 0 and account.saved.activation_bytes > 0
    assert {row.quantity: row.predicted for row in account.rows()}["forward"] is None
    assert account.state.at_step_bytes == account.state.predicted_at_step_bytes == 8 * account.parameters
    assert all(row.predicted_forward_flops is None for row in account.per_module_rows())


def test_generic_account_on_meta_and_with_a_factory_example():
    from resacct.account.answers.generic import account_named_model

    meta = account_named_model("resacct.training.models:Cruncher", model_args={"dim": 16, "num_layers": 3}, batch=4, measure=False, recipe="bf16")
    assert meta.device == "meta" and meta.step_peak_bytes is None
    assert meta.saved.activation_bytes == meta.predicted.saved_bytes == 2 * 4 * 16 * 4
    given = account_named_model("tests.fixtures_user_model:build_with_example", model_args={"width": 6})
    assert given.input_shape == (5, 6) and given.saved.activation_bytes == given.predicted.saved_bytes


@pytest.mark.parametrize(
    ("spec", "args", "match"),
    [
        ("no_such_module_xyz:build", {}, "cannot import 'no_such_module_xyz'"),
        ("resacct.training.models:Nope", {}, "has no attribute 'Nope'"),
        ("resacct.training.models", {}, "expected module:factory"),
        ("tests.fixtures_user_model:not_a_module", {}, "returned a str; expected an nn.Module"),
        ("tests.fixtures_user_model:NOT_CALLABLE", {}, "not callable"),
        ("resacct.training.models:Cruncher", {"width": 3}, "refused the model arguments"),
        ("tests.fixtures_user_model:build_embedding", {}, "cannot tell the sequence length of Sequential; expected seq=N"),
    ],
)
def test_generic_account_refuses_bad_factories(spec, args, match):
    from resacct.account.answers.generic import account_named_model

    with pytest.raises(ResacctError, match=match):
        account_named_model(spec, model_args=args, measure=True)
