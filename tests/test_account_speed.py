"""``resacct account --hf-config`` made faster (issue 22's speed bar) without changing a number:
every shortcut here is checked against the slower way it replaced, to the byte. Timings live in
``benchmarks/account_speed_70b.py``, never in a test.

- one FlopCounterMode whose forward counts are copied when the forward ends, instead of a second
  counter around the forward (:func:`resacct.account.trace.step_measurements.trace_step_flops`);
- FLOPs, training state and saved tensors in one forward and backward
  (:func:`resacct.account.trace.step_measurements.measure_step_once`) instead of four forwards and
  three backwards (``trace_step_flops``, ``measure_training_state``, ``record_saved_activations``);
- the predicted step's optimizer state made with the tracker off (it is named afterwards);
- the live-storage tracker's per-op bookkeeping: op names computed once, Python numbers looked for
  before the op's schema is read (:mod:`resacct.account.peak.kernel_workspace`).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.account.peak.kernel_workspace import WRAPPED_NUMBER_BYTES, wrapped_number_bytes  # noqa: E402
from resacct.account.trace.step_measurements import StepFlopTrace, measure_step_once, measure_training_state, trace_step_flops  # noqa: E402
from resacct.facts.dtypes import parse_dtype  # noqa: E402
from resacct.formulas.attention_flops import FusedAttentionCount  # noqa: E402
from resacct.formulas.flops import DispatchedOps, uncounted_ops  # noqa: E402
from resacct.measurement.activations import record_saved_activations  # noqa: E402
from resacct.measurement.memory import get_state_recipe  # noqa: E402


# ───────────────────────────── the ways they replaced ─────────────────────────────


def _two_counter_trace(model, loss_fn, *, fill_tracer_gaps: bool = True) -> StepFlopTrace:
    """``trace_step_flops`` as it was: a second FlopCounterMode around the forward alone."""
    from resacct.account.trace.module_flops import in_tree_order, module_flop_counter, module_flops

    step_attention, forward_attention = FusedAttentionCount(), FusedAttentionCount()
    mapping = step_attention.custom_mapping() if fill_tracer_gaps else {}
    filled = {str(op) for op in mapping} | {str(getattr(op, "overloadpacket", op)) for op in mapping}
    for parameter in model.parameters():
        parameter.grad = None
    with module_flop_counter(model, mapping) as step_counter:
        forward_mapping = forward_attention.custom_mapping() if fill_tracer_gaps else {}
        with module_flop_counter(model, forward_mapping) as forward_counter, DispatchedOps() as forward_ops:
            loss = loss_fn()
        with DispatchedOps() as backward_ops:
            loss.backward()
    for parameter in model.parameters():
        parameter.grad = None
    step_modules, forward_modules = module_flops(step_counter.get_flop_counts()), module_flops(forward_counter.get_flop_counts())
    backward_modules = {name: total - forward_modules.get(name, 0) for name, total in step_modules.items()}
    forward_total = int(forward_counter.get_total_flops())
    return StepFlopTrace(
        forward_flops=forward_total, backward_flops=int(step_counter.get_total_flops()) - forward_total,
        forward_by_module=in_tree_order(forward_modules), backward_by_module=in_tree_order(backward_modules),
        uncounted_ops=tuple(uncounted_ops("forward", forward_ops.calls, frozenset(filled)) + uncounted_ops("backward", backward_ops.calls, frozenset(filled))),
        gap_filled_flops=step_attention.filled_flops, attention_recompute_flops=step_attention.recompute_flops,
    )


def _wrapped_number_bytes_reading_every_schema(func, args, out) -> int:
    """``wrapped_number_bytes`` as it was: the op's schema read on every call."""
    from torch.utils._pytree import tree_flatten

    from resacct.account.peak.kernel_workspace import _DIVIDES_BY_COUNT, _WRAPPED_DTYPE, _WRAPS_SCALAR_OPERAND

    name = str(func)
    numbers = [value for argument, value in zip(func._schema.arguments, args)
               if isinstance(value, (bool, int, float, complex)) and
               (isinstance(argument.type, torch.TensorType) or (name in _WRAPS_SCALAR_OPERAND and argument.name == "other"))]
    if name in _DIVIDES_BY_COUNT:
        numbers.append(1)
    result = next((value for value in tree_flatten(out)[0] if isinstance(value, torch.Tensor)), None)
    total = 0
    for number in numbers:
        total += WRAPPED_NUMBER_BYTES[type(number)]
        if result is not None and result.dtype != _WRAPPED_DTYPE[type(number)]:
            total += result.element_size()
    return total


# ───────────────────────────── models ─────────────────────────────


def _tiny(name: str, device: str = "meta"):
    pytest.importorskip("transformers")
    import torch._dynamo  # noqa: F401  torch 2.8: first imported under torch.device(...) by transformers' lazy model import, it fails as a circular import
    from tests import fixtures_hf_models

    with torch.device(device):
        model = {"llama": fixtures_hf_models.tiny_llama, "gpt2": fixtures_hf_models.tiny_gpt2, "mixtral": fixtures_hf_models.tiny_mixtral,
                 "gpt2-eager": lambda: fixtures_hf_models.tiny_gpt2("eager")}[name]()
    model.train()
    ids = torch.zeros(2, 16, dtype=torch.long, device=device)
    return model, {"input_ids": ids, "labels": ids}


def _torch_at_least(version: str) -> bool:
    from packaging.version import Version

    return Version(torch.__version__.split("+")[0]) >= Version(version)


def _loss(inputs):
    return lambda module: module(**inputs).loss.float()


# ───────────────────────────── the tests ─────────────────────────────


@pytest.mark.parametrize(("name", "device", "fill"), [("llama", "meta", True), ("llama", "cpu", True), ("llama", "cpu", False),
                                                      ("gpt2-eager", "meta", True), ("mixtral", "meta", True)])
def test_one_flop_counter_counts_what_two_counted(name, device, fill):
    model, inputs = _tiny(name, device)
    new = trace_step_flops(model, lambda: _loss(inputs)(model), fill_tracer_gaps=fill)
    old = _two_counter_trace(model, lambda: _loss(inputs)(model), fill_tracer_gaps=fill)
    assert new == old
    assert new.forward_flops > 0 and new.backward_by_module
    if device == "cpu" and fill and _torch_at_least("2.11"):
        # the CPU flash kernel, filled from its shapes. torch 2.8 runs this grouped-query sdpa on the CPU
        # by the math path (counted op by op: nothing to fill); 2.11 and 2.13 by the flash kernel (seen 2026-11-28)
        assert new.gap_filled_flops > 0


@pytest.mark.parametrize(("name", "recipe", "optimizer"), [
    ("llama", "fp32", "adamw"), ("llama", "bf16-fp32-master", "adamw"), ("llama", "bf16-fp32-master-free-bf16-grads", "sgd-momentum"),
    ("llama", "bf16", "adagrad"), ("llama", "bf16-autocast", "rmsprop"), ("llama", "fp32", "sgd"), ("llama", "fp16-autocast-scaled", "adam"),
    ("gpt2", "fp32", "adamw"), ("gpt2", "bf16-fp32-master", "adam"), ("mixtral", "fp32", "adamw"), ("mixtral", "bf16-fp32-master", "adamw"),
])
@pytest.mark.slow  # 11 cases, 6.9 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_one_forward_and_backward_measure_what_the_separate_passes_measured(name, recipe, optimizer):
    """What ``account_hf_config`` measured before, on the meta device: FLOPs on the float32 model, the state by two
    steps of a copy in the recipe's dtype, the saved tensors by a third copy's forward — all equal to the one pass."""
    model, inputs = _tiny(name)
    chosen = get_state_recipe(recipe)
    once = measure_step_once(model, _loss(inputs), chosen, optimizer)
    assert once.flops == _two_counter_trace(model, lambda: _loss(inputs)(model))
    assert once.state == measure_training_state(model, _loss(inputs), chosen, optimizer)
    in_recipe_dtype = copy.deepcopy(model).to(parse_dtype(chosen.parameter_dtype))
    with record_saved_activations(in_recipe_dtype) as saved:
        _loss(inputs)(in_recipe_dtype)
    assert once.saved.entries == saved.entries and once.saved.saves == saved.saves
    assert [p.dtype for p in once.model.parameters()] == [p.dtype for p in in_recipe_dtype.parameters()]
    assert all(p.grad is None for p in [*model.parameters(), *once.model.parameters()])


@pytest.mark.slow  # ~1.3 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_the_hf_account_is_the_separate_measurements():
    pytest.importorskip("transformers")
    from resacct.account.answers.hf import account_hf_config
    from resacct.account.load.hf_models import HfConfigSpec

    spec = HfConfigSpec(name="tiny", source="tests", values={"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
                                                             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                                             "max_position_embeddings": 32})
    account = account_hf_config(spec, batch=2, seq=16, recipe="bf16-fp32-master")
    compared = [row for row in account.rows() if row.predicted is not None and row.measured is not None and "6N" not in row.quantity]
    assert len(compared) >= 10 and all(row.predicted == row.measured for row in compared), [row for row in compared if row.predicted != row.measured]
    assert account.checkpoint_weights_bytes == 2 * account.parameters  # bf16 weights, no buffer that persists
    assert account.step_peak.predicted is not None


@pytest.mark.parametrize(("name", "recipe"), [("llama", "fp32"), ("gpt2-eager", "fp32"), ("llama", "bf16-fp32-master-free-bf16-grads")])
@pytest.mark.slow  # 0.83 s idle on 2026-11-28
def test_the_predicted_step_is_the_same_with_the_optimizer_state_made_untracked(monkeypatch, name, recipe):
    """The first optimizer step (which makes the state of the steady step predicted) runs without the tracker: the same
    peak, breakdown and timeline as when the tracker watched it."""
    from resacct.account.peak import step_peak as peak_module
    from resacct.account.peak.step_peak import predict_step_peak
    from resacct.account.peak.recipes import recipe_step
    from resacct.facts.recipes import parse_recipe

    model, inputs = _tiny(name)
    step = recipe_step(parse_recipe(recipe), model, inputs, lambda module, step_inputs: module(**step_inputs).loss.float(), "adamw")
    untracked = predict_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer)
    monkeypatch.setattr(peak_module, "_state_is_torch_optims", lambda optimizer: False)
    tracked = predict_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer)
    assert untracked.peak == tracked.peak and untracked.timeline == tracked.timeline and untracked.attention_kernel == tracked.attention_kernel


def test_wrapped_numbers_are_counted_as_when_every_schema_was_read():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Compare(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = self.with_numbers = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            expected = _wrapped_number_bytes_reading_every_schema(func, args, out)
            assert wrapped_number_bytes(func, args, out) == expected, func
            self.calls += 1
            self.with_numbers += bool(expected)
            return out

    model, inputs = _tiny("gpt2-eager", "cpu")  # gelu_new: 0.5, 0.044715, √(2/π) per layer
    x = torch.ones(3, 4, requires_grad=True)
    with Compare() as seen:
        model(**inputs).loss.backward()
        ((x * 0.5 + 2).mean() / 3 - 1 + (x > 0).sum() * 2.0).backward()
        torch.add(x, 1, alpha=2).sum().backward()
    assert seen.calls > 100 and seen.with_numbers > 5


@pytest.mark.slow
def test_per_module_rows_come_in_one_order_whatever_the_hash_seed():
    """``--per-module``'s rows followed FlopCounterMode's set of modules, so their order changed
    with PYTHONHASHSEED; now the model first, then by path with indices numerically."""
    import subprocess
    import sys

    pytest.importorskip("transformers")
    probe = ("import json, torch; from resacct.account.answers.generic import account_module; from tests.fixtures_hf_models import tiny_llama; "
             "ids = torch.randint(0, 64, (2, 8)); a = account_module(tiny_llama(), {'input_ids': ids, 'labels': ids}); "
             "print(json.dumps([r.module for r in a.per_module_rows()]))")
    root = str(Path(__file__).resolve().parents[1])
    runs = [subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
                             env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2")]  # side by side: half the wall time
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    orders = {out for out, _ in outputs}
    assert len(orders) == 1, orders
