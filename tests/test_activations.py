"""resacct.measurement.activations: saved tensors by module and storage, the allocator trace, checkpointed
forwards, and the predictions of held bytes, peaks and recomputation against torch."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from resacct.measurement.activations import (
    MODEL_SCOPE,
    OUTSIDE_SCOPE,
    best_segment_count,
    gpt_forward,
    gpt_loss,
    measure_checkpointing,
    measure_grad_accumulation,
    module_stack,
    predict_gpt_held_after_forward_bytes,
    predict_gpt_recompute_flops,
    predict_gpt_step_peak_bytes,
    record_saved_activations,
    rng_state_bytes,
    run_in_segments,
    segment_bounds,
    trace_allocations,
)
from resacct.measurement.memory import distinct_storage_bytes, storage_key
from resacct.errors import ResacctError
from resacct.training.gpt import GPTConfig, build_gpt, get_gpt_config
from resacct.formulas.gpt_formulas import gpt_layer_saved_bytes, gpt_saved_terms


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


# torch 2.4 cannot run torch.utils.checkpoint on meta tensors, and stops recomputation at a
# different point; resacct's checkpointing predictions follow torch >= 2.6.
NEEDS_TORCH_2_6 = pytest.mark.skipif(_torch_version() < (2, 6), reason="checkpointing behaviour predicted for torch >= 2.6")


def _batch(config: GPTConfig, batch: int, seq: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    return tokens.to(device), torch.roll(tokens, 1, dims=1).to(device)


# ── storages ─────────────────────────────────────────────────────────────────────────────


def test_storage_key_tells_views_from_copies_on_cpu_and_meta():
    x = torch.zeros(4, 4)
    assert storage_key(x) == storage_key(x.t()) == storage_key(x[2:])
    assert storage_key(x) != storage_key(x.clone())
    a, b = torch.zeros(3, device="meta"), torch.zeros(3, device="meta")
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() == 0  # why meta needs another key
    assert storage_key(a) != storage_key(b) and storage_key(a) == storage_key(a.view(3, 1))


def test_distinct_storage_bytes_counts_each_storage_once():
    x = torch.zeros(10)  # 40 bytes
    assert distinct_storage_bytes([x, x[:5], x.view(2, 5), None, torch.zeros(2, dtype=torch.float64)]) == 40 + 16


# ── saved tensors ────────────────────────────────────────────────────────────────────────


def test_saved_activations_flag_weights_and_dedupe_storages():
    layer = nn.Linear(3, 2)
    x = torch.ones(4, 3, requires_grad=True)
    with record_saved_activations(layer) as saved:
        y = layer(x)
        z = (y * y).sum()  # mul saves y twice: one storage
    del z
    assert saved.parameter_bytes == 2 * 3 * 4  # the weight, kept for the input's gradient
    assert saved.activation_bytes == 4 * 3 * 4 + 4 * 2 * 4  # x, then y once
    assert saved.saves > len(saved.entries)  # repeats were seen and folded
    assert saved.by_module() == {MODEL_SCOPE: 48, OUTSIDE_SCOPE: 32}


def test_gpt_saved_tensors_are_attributed_to_the_module_that_saved_them():
    config = get_gpt_config("gpt-nano")
    model = build_gpt(config)
    tokens, targets = _batch(config, 2, 16)
    with record_saved_activations(model) as saved:
        gpt_loss(model, tokens, targets)
    shapes = {(entry.module, entry.shape) for entry in saved.entries if not entry.is_parameter}
    assert ("blocks.1.mlp", (2, 16, 256)) in shapes  # GELU's input, r·d wide
    assert ("blocks.0.attention", (2, 2, 16, 16)) in shapes  # softmax output
    assert ("blocks.0.attention", (16, 16)) in shapes  # the bool causal mask
    assert ("token_embedding", (2, 16)) in shapes and ("(loss)", (32, 256)) in shapes
    predicted = {}
    for term in gpt_saved_terms(config, 2, 16):
        predicted[term.module] = predicted.get(term.module, 0) + term.bytes
    assert saved.by_module() == predicted
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())  # hooks removed


def test_module_stack_unwinds_when_a_forward_raises():
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model = nn.Sequential(nn.Linear(2, 2), Boom())
    with module_stack(model) as stack:
        with pytest.raises(RuntimeError):
            model(torch.ones(1, 2))
        assert stack == [OUTSIDE_SCOPE]


def test_meta_forward_saves_what_a_cpu_forward_saves_in_float32():
    config = get_gpt_config("gpt-nano")
    measured = {}
    for device in ("cpu", "meta"):
        model = build_gpt(config, device=device)
        tokens, targets = _batch(config, 3, 20, device)
        with record_saved_activations(model) as saved:
            gpt_loss(model, tokens, targets)
        measured[device] = saved.activation_bytes
    assert measured["cpu"] == measured["meta"] == sum(term.bytes for term in gpt_saved_terms(config, 3, 20))


# ── the allocator ────────────────────────────────────────────────────────────────────────


def test_trace_allocations_sees_kept_and_temporary_tensors():
    with trace_allocations() as trace:
        kept = torch.ones(1000)  # 4000 bytes, kept
        total = (kept * 2).sum()  # a 4000-byte temporary, freed
    assert trace.end_bytes == 4000 + total.numel() * 4
    assert trace.peak_bytes >= 8000 and trace.allocations >= 3


def test_trace_allocations_refuses_a_block_without_allocations():
    with pytest.raises(ResacctError, match="no CPU allocations"):
        with trace_allocations():
            pass


# ── checkpointing ────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("layers", "segments", "bounds"), [(16, 4, [(0, 4), (4, 8), (8, 12), (12, 16)]), (5, 2, [(0, 2), (2, 5)]), (3, 3, [(0, 1), (1, 2), (2, 3)])])
def test_segment_bounds_cover_every_layer_once(layers, segments, bounds):
    assert segment_bounds(layers, segments) == bounds


@pytest.mark.parametrize("segments", [0, 17, -1, True])
def test_segment_bounds_refuse_impossible_counts(segments):
    with pytest.raises(ResacctError, match="from 1 to the 16 layers"):
        segment_bounds(16, segments)


def test_checkpointed_forward_gives_the_same_loss_and_gradients():
    config = get_gpt_config("gpt-nano")
    model = build_gpt(config)
    tokens, targets = _batch(config, 2, 16)
    grads = []
    for segments in (0, 1, 2):
        model.zero_grad(set_to_none=True)
        loss = gpt_loss(model, tokens, targets, checkpoint_segments=segments)
        loss.backward()
        grads.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    for loss_value, gradients in grads[1:]:
        assert loss_value == pytest.approx(grads[0][0])
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(gradients, grads[0][1]))
    assert torch.equal(gpt_forward(model, tokens), model(tokens))
    assert "forward" not in vars(model)  # the swapped-in forward is gone again


def test_run_in_segments_on_a_plain_chain():
    layers = [nn.Linear(4, 4) for _ in range(6)]
    x = torch.randn(3, 4)
    assert torch.allclose(run_in_segments(layers, x, 3), run_in_segments(layers, x, 0))


@pytest.mark.slow
@NEEDS_TORCH_2_6
def test_checkpointed_gpt_holds_and_recomputes_what_resacct_predicts():
    config = GPTConfig(vocab_size=64, context_length=32, n_layers=4, n_heads=2, d_model=32)
    torch.manual_seed(0)
    model = build_gpt(config)
    tokens, targets = _batch(config, 2, 32)
    points = measure_checkpointing(model, tokens, targets, [0, 1, 2, 4])
    assert [p.held_after_forward_bytes for p in points] == [p.predicted_held_after_forward_bytes for p in points]
    assert points[0].held_after_forward_bytes > points[1].held_after_forward_bytes
    assert points[0].peak_bytes == points[0].predicted_peak_bytes
    for point in points[1:]:
        assert 0.95 < point.peak_bytes / point.predicted_peak_bytes < 1.05  # the schedule model: within a few %
        assert point.backward_flops - points[0].backward_flops == predict_gpt_recompute_flops(config, 2, 32, point.segments)
    boundary = 2 * 32 * 32 * 4
    assert points[2].held_after_forward_bytes - points[1].held_after_forward_bytes == boundary + rng_state_bytes()


@NEEDS_TORCH_2_6
def test_recomputation_stops_before_each_segments_last_down_projection():
    config = GPTConfig(vocab_size=64, context_length=32, n_layers=4, n_heads=2, d_model=32)
    model = build_gpt(config, device="meta")
    tokens, targets = _batch(config, 2, 32, "meta")
    backward = {}
    for segments in (0, 4):
        with FlopCounterMode(display=False) as forward_counter:
            loss = gpt_loss(model, tokens, targets, checkpoint_segments=segments)
        with FlopCounterMode(display=False) as backward_counter:
            loss.backward()
        backward[segments] = backward_counter.get_total_flops()
    layer_forward = sum(forward_counter.get_flop_counts()["GPT.blocks.0"].values())
    down = sum(forward_counter.get_flop_counts()["GPT.blocks.0.mlp.down"].values())
    assert backward[4] - backward[0] == 4 * layer_forward - 4 * down


@pytest.mark.parametrize(("layers", "layer_bytes", "best"), [(16, 1.0, 4), (9, 1.0, 3), (16, 18.0, 16), (16, 0.0, 1)])
def test_best_segment_count(layers, layer_bytes, best):
    assert best_segment_count(layers, layer_bytes=layer_bytes, boundary_bytes=1.0) == best


def test_held_bytes_prediction_is_affine_in_batch_without_checkpointing():
    config = get_gpt_config("gpt-tiny")
    one, two, four = (predict_gpt_held_after_forward_bytes(config, b, 64) for b in (1, 2, 4))
    assert two - one == (four - two) / 2 > 0
    assert predict_gpt_step_peak_bytes(config, 4, 64) > predict_gpt_held_after_forward_bytes(config, 4, 64)
    assert gpt_layer_saved_bytes(config, 4, 64) * config.n_layers < predict_gpt_held_after_forward_bytes(config, 4, 64)


# ── gradient accumulation ────────────────────────────────────────────────────────────────


def test_accumulated_micro_batches_hold_a_quarter_and_give_the_full_batch_gradient():
    config = get_gpt_config("gpt-nano")
    model = build_gpt(config)
    tokens, targets = _batch(config, 4, 32)
    result = measure_grad_accumulation(model, tokens, targets, 4)
    assert len(set(result.micro_held_bytes)) == 1 and result.micro_batch == 1
    assert result.max_micro_held_bytes == pytest.approx(predict_gpt_held_after_forward_bytes(config, 1, 32), abs=16)
    assert result.effective_batch_held_bytes == pytest.approx(4 * result.max_micro_held_bytes, rel=0.01)
    model.zero_grad(set_to_none=True)
    for index in range(4):
        (gpt_loss(model, tokens[index:index + 1], targets[index:index + 1]) / 4).backward()
    accumulated = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    gpt_loss(model, tokens, targets).backward()
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(accumulated, model.parameters()))


def test_accumulation_steps_must_divide_the_batch():
    config = get_gpt_config("gpt-nano")
    tokens, targets = _batch(config, 4, 8)
    with pytest.raises(ResacctError, match="dividing the batch of 4"):
        measure_grad_accumulation(build_gpt(config), tokens, targets, 3)


# ── resacct's formulas for Linear / activation stacks ───────────────────────────────────


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh", "sigmoid", "silu"])
@pytest.mark.parametrize("loss", ["mean", "sum", "mse", "cross-entropy"])
def test_stack_formula_matches_what_autograd_saves(activation, loss):
    from resacct.formulas.account_formulas import mlp_saved_bytes, predict_stack_step
    from resacct.account.answers.generic import mlp
    from resacct.account.load.model_io import loss_of_output

    model, x = mlp(dim=6, hidden=10, depth=2, outputs=5, activation=activation), torch.randn(3, 6)
    with record_saved_activations(model) as saved:
        loss_of_output(model(x), loss)
    predicted = predict_stack_step(model, (3, 6), element_bytes=4, loss=loss)
    assert saved.by_module() == predicted.saved_by_module
    if loss == "mean":
        assert saved.activation_bytes == mlp_saved_bytes(3, 6, 10, 2, activation=activation)


def test_stack_formula_for_the_cruncher_is_b_d_layers_plus_input():
    from resacct.formulas.account_formulas import predict_stack_step
    from resacct.training.models import Cruncher

    model, x = Cruncher(dim=8, num_layers=5), torch.randn(4, 8)
    with record_saved_activations(model) as saved:
        model(x).mean()
    assert saved.activation_bytes == predict_stack_step(model, (4, 8), element_bytes=4).saved_bytes == 4 * 4 * 8 * (5 + 1)


def test_stack_formula_declines_what_it_does_not_know():
    from resacct.formulas.account_formulas import predict_stack_step

    assert predict_stack_step(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout()), (2, 3), element_bytes=4) is None
    frozen = torch.nn.Linear(3, 3).requires_grad_(False)
    assert predict_stack_step(frozen, (2, 3), element_bytes=4) is None
    with pytest.raises(ResacctError, match="loss 'hinge'"):
        predict_stack_step(frozen, (2, 3), element_bytes=4, loss="hinge")
