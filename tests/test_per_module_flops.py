"""FLOPs per module (``resacct account --per-module``): each op counted under one module, the
backward's under the module whose forward made it (:mod:`resacct.account.trace.module_flops`).

torch's ModuleTracker keeps a module called with keyword arguments only "running" until its
backward ends, and siblings fed one tensor (q/k/v_proj, gate/up_proj) until the last one's backward
is done: their counts overlapped, and llama-3-8b's ``model.layers.0.self_attn`` showed a negative
backward. The checks here are torch's own measurements: FlopCounterMode's totals over the whole
step, and over each module's forward and backward run alone on the inputs it got in the model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.account.trace.module_flops import inclusive_by_module, tree_order  # noqa: E402
from resacct.account.trace.step_measurements import StepFlopTrace, sdpa_gap_formulas, trace_step_flops  # noqa: E402
from resacct.measurement.activations import MODEL_SCOPE, OUTSIDE_SCOPE  # noqa: E402


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a module's output (tuples, lists, dicts and transformers' ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


def _detached(value: Any) -> Any:
    """``value`` with each tensor a new leaf that requires grad as the original did."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    if isinstance(value, tuple):
        return tuple(_detached(item) for item in value)
    if isinstance(value, list):
        return [_detached(item) for item in value]
    if isinstance(value, dict):
        return {key: _detached(item) for key, item in value.items()}
    return value


def _measured_alone(model: nn.Module, run: Callable[[], Any], mapping: dict) -> dict[str, tuple[int, int]]:
    """Each module's (forward, backward) FLOPs, its children's included, as stock FlopCounterMode
    counts them when the module runs alone on every input it got during ``run()`` — the backward from
    all its outputs to its parameters and the inputs that required grad."""
    calls: dict[str, list[tuple[tuple, dict]]] = {}
    handles = [module.register_forward_pre_hook(lambda m, args, kwargs, name=name: calls.setdefault(name, []).append((args, kwargs)), with_kwargs=True)
               for name, module in model.named_modules() if name]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    modules, measured = dict(model.named_modules()), {}
    for name, module_calls in calls.items():
        forward = backward = 0
        for args, kwargs in module_calls:
            # a rerun must not attend to the keys the first run left in the model's cache
            args, kwargs = _detached(args), {key: None if type(value).__name__.endswith("Cache") else _detached(value) for key, value in kwargs.items()}
            with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
                outputs = [t for t in _tensors(modules[name](*args, **kwargs)) if t.requires_grad]
            forward += counter.get_total_flops()
            leaves = [p for p in modules[name].parameters() if p.requires_grad] + [t for t in _tensors((args, kwargs)) if t.requires_grad]
            if outputs:
                with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
                    try:
                        torch.autograd.grad(outputs, leaves, [torch.ones_like(t) for t in outputs], allow_unused=True)
                    except RuntimeError as error:  # torch 2.4: FlopCounterMode's module hooks refuse autograd.grad to leaves
                        if "_will_engine_execute_node" not in str(error):
                            raise
                        pytest.skip(f"torch {torch.__version__}'s FlopCounterMode cannot count autograd.grad to leaf tensors (the reference "
                                    f"measurement): {error}")
                backward += counter.get_total_flops()
        measured[name] = (forward, backward)
    return measured


def _step_totals(loss_fn: Callable[[], torch.Tensor], mapping: dict) -> tuple[int, int]:
    """(forward, backward) FLOPs of one step, stock FlopCounterMode's totals."""
    with FlopCounterMode(display=False, custom_mapping=mapping) as step:
        with FlopCounterMode(display=False, custom_mapping=dict(mapping)) as forward:
            loss = loss_fn()
        loss.backward()
    return forward.get_total_flops(), step.get_total_flops() - forward.get_total_flops()


def _assert_consistent(trace: StepFlopTrace, totals: tuple[int, int]) -> None:
    """No figure negative; each pass's own figures sum to torch's total; a module's figure with
    descendants is its own plus its children's (the root's: the pass's total, the loss outside apart)."""
    for direction, exclusive, total in (("forward", trace.forward_by_module, totals[0]), ("backward", trace.backward_by_module, totals[1])):
        inclusive = trace.inclusive_by_module(direction)
        assert min([*exclusive.values(), *inclusive.values()], default=0) >= 0, (direction, exclusive)
        assert sum(exclusive.values()) == total == (trace.forward_flops if direction == "forward" else trace.backward_flops), direction
        assert inclusive.get(MODEL_SCOPE, 0) + inclusive.get(OUTSIDE_SCOPE, 0) == total
        for name, flops in inclusive.items():
            children = [other for other in inclusive if other not in (MODEL_SCOPE, OUTSIDE_SCOPE) and other != name
                        and (other.rsplit(".", 1)[0] == name if "." in other else name == MODEL_SCOPE)]
            assert flops == exclusive.get(name, 0) + sum(inclusive[child] for child in children), (direction, name)
        assert list(exclusive) == sorted(exclusive, key=tree_order) and list(inclusive) == sorted(inclusive, key=tree_order)


# ───────────────────────────── the cause, on a model of a few lines ─────────────────────────────


class _Attention(nn.Module):
    """Three projections of one tensor, called with a keyword argument: what HF attention does."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width) for _ in range(4))

    def forward(self, *, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        return self.o_proj(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)


class _Stack(nn.Module):
    def __init__(self, width: int = 16, layers: int = 2, checkpointed: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.layers = nn.ModuleList(_Attention(width) for _ in range(layers))
        self.head = nn.Linear(width, 4)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = x + (checkpoint(lambda h, layer=layer: layer(hidden_states=h), x, use_reentrant=False) if self.checkpointed
                     else layer(hidden_states=x))
        return self.head(x)


def test_backward_of_keyword_called_modules_and_shared_inputs_goes_to_the_module_that_made_it():
    with torch.device("meta"):
        model, x = _Stack(), torch.randn(3, 5, 16)
    loss_fn = lambda: model(x).square().mean()  # noqa: E731
    trace = trace_step_flops(model, loss_fn)
    _assert_consistent(trace, _step_totals(loss_fn, {}))
    forward, backward = trace.inclusive_by_module("forward"), trace.inclusive_by_module("backward")
    alone = _measured_alone(model, loss_fn, {})
    assert len(alone) == 12
    for name, (forward_flops, backward_flops) in alone.items():
        assert (forward.get(name, 0), backward.get(name, 0)) == (forward_flops, backward_flops), name
    assert backward["layers.1"] > 0 and backward["layers.1.k_proj"] == backward["layers.1.q_proj"]


def _checkpoints_meta_tensors() -> bool:
    """torch 2.4's torch.utils.checkpoint looks up a ``torch.meta`` device module, which it lacks."""
    try:
        checkpoint(torch.sin, torch.empty(2, device="meta", requires_grad=True), use_reentrant=False)
    except AttributeError:
        return False
    return True


@pytest.mark.skipif(not _checkpoints_meta_tensors(), reason=f"torch {torch.__version__} cannot checkpoint meta tensors "
                    "(torch.utils.checkpoint looks up a torch.meta device module it lacks)")
def test_a_checkpoints_recomputation_counts_under_the_modules_it_reruns():
    with torch.device("meta"):
        model, x = _Stack(checkpointed=True), torch.randn(3, 5, 16)
    loss_fn = lambda: model(x).square().mean()  # noqa: E731
    trace = trace_step_flops(model, loss_fn)
    _assert_consistent(trace, _step_totals(loss_fn, {}))
    plain = _Stack().to("meta")
    plain_loss_fn = lambda: plain(x).square().mean()  # noqa: E731
    recomputed_flops = trace.backward_flops - _step_totals(plain_loss_fn, {})[1]  # torch's count, checkpointed less plain
    alone = _measured_alone(plain, plain_loss_fn, {})
    backward = trace.inclusive_by_module("backward")
    extra = {name: backward.get(name, 0) - alone[name][1] for name in alone}  # each module's backward beyond its own
    assert recomputed_flops > 0 and extra["layers.0"] + extra["layers.1"] == recomputed_flops
    assert all(0 <= extra[name] <= alone[name][0] for name in alone), extra  # at most its forward once more
    assert extra["embed"] == extra["head"] == 0 and extra["layers.0.q_proj"] == alone["layers.0.q_proj"][0]


# ───────────────────────────── a transformers Llama, the account's model ─────────────────────────────


def _tiny_llama(device: str = "meta", attention: str = "sdpa"):
    pytest.importorskip("transformers")
    from tests.fixtures_hf_models import tiny_llama

    with torch.device(device):
        model = tiny_llama(attention)
    model.train()
    ids = torch.zeros(2, 16, dtype=torch.long, device=device)
    return model, lambda: model(input_ids=ids, labels=ids).loss


@pytest.mark.slow
@pytest.mark.parametrize(("device", "fill"), [("meta", False), ("cpu", True)])
def test_llama_modules_forward_and_backward_are_what_torch_counts_for_each_module_alone(device, fill):
    model, loss_fn = _tiny_llama(device)
    mapping = sdpa_gap_formulas() if fill else {}
    trace = trace_step_flops(model, loss_fn, fill_tracer_gaps=fill)
    _assert_consistent(trace, _step_totals(loss_fn, sdpa_gap_formulas() if fill else {}))
    forward, backward = trace.inclusive_by_module("forward"), trace.inclusive_by_module("backward")
    alone = _measured_alone(model, loss_fn, mapping)
    assert {"model.layers.0.self_attn", "model.layers.1.self_attn.v_proj", "model.layers.0.mlp.up_proj", "lm_head"} <= set(alone)
    for name, (forward_flops, backward_flops) in alone.items():
        assert (forward.get(name, 0), backward.get(name, 0)) == (forward_flops, backward_flops), name
    assert backward["model.layers.0.self_attn"] > backward["model.layers.0.self_attn.q_proj"] > 0


@pytest.mark.slow
def test_the_hf_account_per_module_rows_add_up_to_the_step():
    """``resacct account --hf-config … --per-module``'s rows: none negative, each pass's sum its traced total."""
    pytest.importorskip("transformers")
    from resacct.account.answers.hf import account_hf_config
    from resacct.account.load.hf_models import HfConfigSpec

    spec = HfConfigSpec(name="tiny", source="tests", values={"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
                                                             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                                             "max_position_embeddings": 32})
    account = account_hf_config(spec, batch=2, seq=16)
    rows = account.per_module_rows()
    assert all(row.traced_forward_flops >= 0 and row.traced_backward_flops >= 0 for row in rows)
    assert sum(row.traced_forward_flops for row in rows) == account.flops.forward_flops
    assert sum(row.traced_backward_flops for row in rows) == account.flops.backward_flops
    attention = next(row for row in rows if row.module == "model.layers.0.self_attn")
    assert attention.traced_backward_flops > 0
    _assert_consistent(account.flops, (account.flops.forward_flops, account.flops.backward_flops))


def test_inclusive_figures_add_up_the_module_tree():
    exclusive = {"(model)": 1, "(loss)": 2, "layers.10.mlp.up": 1, "layers.1.mlp": 5, "layers.1": 4, "head": 3}
    assert inclusive_by_module(exclusive) == {"(model)": 14, "(loss)": 2, "head": 3, "layers": 10, "layers.1": 9, "layers.1.mlp": 5,
                                              "layers.10": 1, "layers.10.mlp": 1, "layers.10.mlp.up": 1}
    assert list(inclusive_by_module(exclusive))[3:6] == ["layers", "layers.1", "layers.1.mlp"]  # indices numerically
    with pytest.raises(Exception, match="direction"):
        StepFlopTrace(1, 2, {}, {}).inclusive_by_module("sideways")
