"""Trace once (issue 34): the step peak's fake pass records the FLOPs, saved tensors and training
state too (:class:`~resacct.account.trace.fake_pass.FakeStepRecorder`), where it runs the step the
meta pass runs, so the meta pass of
:func:`~resacct.account.trace.step_measurements.measure_step_once` is not needed. Used by
:func:`resacct.account.answers.generic.account_module` and
:func:`resacct.account.answers.hf.account_hf_config`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from torch import nn

from resacct.account.peak.step_peak import FUSED_ATTENTION_KERNELS, StepPeakAccount, account_model_step_peak
from resacct.account.trace.fake_pass import FakeStepRecorder, fake_pass_runs_the_meta_step
from resacct.facts.recipes import Recipe
from resacct.measurement.memory import get_state_recipe

__all__ = ["TraceOnceHint", "trace_hf_step_once", "trace_once"]


def trace_once(model: nn.Module, inputs: Any, loss: str, recipe: Recipe, optimizer: str, parameters: list[nn.Parameter], where: str,
                user_step: Any) -> tuple[FakeStepRecorder | None, StepPeakAccount] | None:
    """Trace once (issue 34), where the recipe's copy runs as the model (:func:`resacct.account.answers.generic._copy_runs_as_the_model`):
    the step peak's fake pass also records the FLOPs, the saved tensors and
    the training state — where it runs the step the meta pass runs
    (:func:`~resacct.account.trace.fake_pass.fake_pass_runs_the_meta_step`) — and the peak. The
    recorder is None where the fake CPU step took a fused attention kernel (meta takes sdpa's math
    path, which saves other tensors: the meta pass runs, the peak is kept); None (nothing kept)
    where the recipe or inputs differ, or the fake pass could not run the step: all as before."""
    if not fake_pass_runs_the_meta_step(parameters, inputs, recipe, where, optimizer):
        return None
    recorder = FakeStepRecorder(model, get_state_recipe(recipe), optimizer)
    with user_step():
        peak = account_model_step_peak(model, inputs, loss=loss, recipe=recipe, optimizer=optimizer, measure=False, recorder=recorder)
    if peak.predicted is None or not recorder.done or recorder.resolved_loss is None:
        return None
    if any(op in FUSED_ATTENTION_KERNELS for op in peak.predicted.ops_seen):  # meta runs sdpa's math path: other saved tensors
        return None, peak
    return recorder, peak


@dataclass
class TraceOnceHint:
    """Whether the next build of one config should try to trace once: not after a build where it could
    not (a fused attention kernel on the fake CPU step, Llama's sdpa among them; a recipe or a step the
    fake pass does not run as the meta pass): the recording would be thrown away again, 0.1-0.5 CPU s of
    a 70B account traced at three depths (issue 34, session 8)."""

    worth_trying: bool = True


def trace_hf_step_once(model: nn.Module, inputs: Any, recipe: Recipe, optimizer: str,
                       hint: TraceOnceHint) -> tuple[FakeStepRecorder | None, StepPeakAccount] | None:
    """:func:`trace_once` for a transformers model built on meta with its own loss, where ``hint`` says
    it is worth trying (``hint`` then says whether it worked). None where it is not, or where the fake
    pass could not run the step: the meta pass then runs and names what broke, as before."""
    if not hint.worth_trying:
        return None
    try:
        once = trace_once(model, inputs, "model", recipe, optimizer, list(model.parameters()), "meta", contextlib.nullcontext)
    except Exception:  # the meta pass runs the step again: its error (or the peak's) is the account's
        once = None
    hint.worth_trying = once is not None and once[0] is not None
    return once
