"""``resacct lora``'s step of a deep stack of identical layers, from the step at depths 3, 4 and 5.

As ``account --hf-config`` and ``fit`` do (:mod:`resacct.account.trace.repeated_layers`): the peft
model is built at depths 3, 4 and 5 (on meta, the same adapters on the same kinds of layer), each
step is traced (parameters, FlopCounterMode's FLOPs, the saved tensors, the step's peak with its
segments marked layer by layer: :mod:`resacct.account.peak.layer_segments`), and every number of
the :class:`~resacct.account.trace.lora_step.LoraStep` is fitted through two depths and checked on
the third. Anything that does not repeat raises
:class:`~resacct.account.peak.layer_segments.NotRepeating`, and the caller traces every layer.

The largest-batch search (:mod:`resacct.account.fit.lora_batch`) prices each batch the same way, on
the three shallow models built once (:class:`ShallowLoraModels`, :func:`lora_step_peak`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from resacct.account.peak.layer_segments import SAMPLE_DEPTHS, extrapolate_peak, segmenting
from resacct.account.trace.repeated_layers import LayerPlan

__all__ = ["ShallowLoraModels", "lora_layer_plan", "lora_step_peak"]


@dataclass(frozen=True)
class ShallowLoraModels:
    """The peft models with ``prefix`` + :data:`~resacct.account.peak.layer_segments.SAMPLE_DEPTHS` layers (on meta;
    ``prefix``: the first layers, built apart, 0 for most) of a config ``depth`` layers deep."""

    depth: int
    models: tuple[nn.Module, ...]
    prefix: int = 0
    period: int = 1  # the layers of a repeated unit


def lora_layer_plan(config: Any, layers: str = "auto") -> LayerPlan:
    """Whether ``config``'s (a transformers config object) step is traced at three depths or whole
    (``layers``: :data:`~resacct.account.trace.repeated_layers.LAYER_CHOICES`)."""
    from resacct.account.load.hf_models import config_layer_stack
    from resacct.account.trace.repeated_layers import plan_for_depth

    depth, prefix, period, why_not = config_layer_stack(config)
    return plan_for_depth(depth, why_not, layers, prefix, period)


def lora_step_peak(model: nn.Module | ShallowLoraModels, inputs_of: Any, loss_fn: Any, optimizer_fn: Any, batch: int) -> Any:
    """The predicted peak (:class:`~resacct.account.peak.models.PredictedStepPeak`) of the LoRA step at
    ``batch`` on ``model`` — one peft model, traced whole, or :class:`ShallowLoraModels`, each traced
    with its layers' segments marked and the peak extrapolated (checked on the third depth).
    ``inputs_of(batch)``: the step's inputs on meta."""
    from resacct.account.peak.step_peak import predict_step_peak

    if not isinstance(model, ShallowLoraModels):
        return predict_step_peak(model, inputs_of(batch), loss_fn, optimizer_fn)
    samples = []
    for repeated, shallow in zip(SAMPLE_DEPTHS, model.models):
        with segmenting(repeated, model.prefix, model.period):
            samples.append(predict_step_peak(shallow, inputs_of(batch), loss_fn, optimizer_fn))
    return extrapolate_peak(samples, model.depth)
