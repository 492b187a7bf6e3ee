"""``fit``'s probes of a deep stack of identical layers, each from the step at depths 3, 4 and 5
(:mod:`resacct.account.peak.layer_segments`): 12 layers traced per probe, whatever the depth, every
number of the extrapolated peak fitted through two depths and checked on the third. A probe that
does not repeat raises :class:`~resacct.account.peak.layer_segments.NotRepeating`, and the search
traces the whole model from then on (:func:`resacct.account.fit.search.step_peak_function`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from resacct.account.peak.layer_segments import SAMPLE_DEPTHS, extrapolate_peak, segmenting
from resacct.account.peak.recipes import model_in_dtype

__all__ = ["ShallowCopies", "shallow_copies", "sampled_step_peak"]


@dataclass
class ShallowCopies:
    """The model rebuilt with ``prefix`` + :data:`~resacct.account.peak.layer_segments.SAMPLE_DEPTHS` layers (on meta:
    ``prefix``, its first layers built apart, 0 for most) and its own depth. The copies are built when first asked for
    (``build(layers)`` one of them): an answer that turns out not to sample (``shard`` under ZeRO-1) builds none."""

    depth: int
    build: Any  # layers → the model with that many layers, on meta
    prefix: int = 0
    period: int = 1  # the layers of a repeated unit
    _models: tuple[nn.Module, ...] | None = field(default=None, repr=False)
    _in_dtype: dict[Any, tuple[nn.Module, ...]] = field(default_factory=dict, repr=False)

    @property
    def models(self) -> tuple[nn.Module, ...]:
        """The copies at the sample depths, in training mode (built once)."""
        if self._models is None:
            self._models = tuple(self.build(self.prefix + repeated * self.period) for repeated in SAMPLE_DEPTHS)
            for model in self._models:
                model.train()
        return self._models

    def describe(self) -> str:
        depths = [self.prefix + repeated * self.period for repeated in SAMPLE_DEPTHS]
        apart = f"; its first {self.prefix} layers, built apart, in each" if self.prefix else ""
        return (f"each probe the step at depths {', '.join(map(str, depths))} ({sum(depths)} of {self.depth} layers{apart}) "
                "extrapolated, every number checked on the third depth")

    def in_dtype(self, dtype: Any) -> tuple[nn.Module, ...]:
        """The copies with parameters in ``dtype`` (converted once)."""
        if dtype not in self._in_dtype:
            self._in_dtype[dtype] = tuple(model_in_dtype(model, dtype) for model in self.models)
        return self._in_dtype[dtype]


def shallow_copies(spec: Any, layers: str = "auto") -> ShallowCopies | None:
    """The config's model at depths 3, 4 and 5 when :func:`~resacct.account.trace.repeated_layers.layer_plan`
    samples it (``layers``: one of its choices); else None."""
    from resacct.account.load.hf_models import build_hf_model, with_depth
    from resacct.account.trace.repeated_layers import layer_plan

    plan = layer_plan(spec, layers)
    if not plan.sample:
        return None
    return ShallowCopies(depth=plan.depth, build=lambda depth: build_hf_model(with_depth(spec, depth), device="meta"), prefix=plan.prefix,
                         period=plan.period)


def sampled_step_peak(shallow: ShallowCopies, dtype: Any, inputs: Any, loss_fn: Any, *, recipe: Any, optimizer: str) -> Any:
    """The step's :class:`~resacct.account.peak.step_peak.PredictedStepPeak` at ``shallow.depth`` on ``inputs``."""
    from resacct.account.peak.step_peak import account_recipe_step_peak
    from resacct.errors import ResacctError

    samples = []
    for repeated, model in zip(SAMPLE_DEPTHS, shallow.in_dtype(dtype)):
        with segmenting(repeated, shallow.prefix, shallow.period):
            account = account_recipe_step_peak(model, inputs, loss_fn, recipe=recipe, optimizer=optimizer, measure=False)
        if account.predicted is None:
            raise ResacctError(f"no predicted peak at depth {shallow.prefix + repeated * shallow.period} ({account.gap})")
        samples.append(account.predicted)
    return extrapolate_peak(samples, shallow.depth)
