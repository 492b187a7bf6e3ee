"""A deep account from three shallow ones: every number of a step of ``L`` identical layers is
affine in ``L``, so the step traced at depths 3, 4 and 5 gives it at any depth — **checked**, not
assumed: each number is fitted through two depths and must land on the third.

:func:`extrapolate_account` walks an account's dataclasses (FLOPs per module and op, the training
state, every saved tensor, the step's peak) in step:

- a whole number (bytes, FLOPs, calls, parameters): the line through depths 4 and 5, which must
  pass through depth 3;
- anything else (a name, a dtype, a recipe, a ratio): equal at the three depths;
- a mapping or a sequence that names modules (``model.layers.3.mlp``): the entries outside the
  layer list as above; the layers' own are the same for every middle layer (checked within and
  across depths), and the first and the last layer keep theirs, laid out for ``L`` layers in order;
- the step's peak: :func:`resacct.account.peak.layer_segments.extrapolate_peak`.

Anything that does not repeat raises :class:`~resacct.account.peak.layer_segments.NotRepeating`
and the caller traces the whole model. At Llama-2-70B's 80 layers this traces 12 instead of 80.

A stack that begins with layers built apart (DeepSeek-V3's ``first_k_dense_replace`` dense layers,
:func:`resacct.account.load.hf_models.config_layer_stack`) keeps them as a **prefix**: the depths
traced are the prefix and 3, 4 and 5 layers of the rest, and the prefix layers' entries are named and
checked as anything else outside the repeated layers (the same at every depth but for whole numbers
on a line). DeepSeek-V3's 61 layers: 21 traced. A stack whose layers alternate kinds with a **period**
(Gemma-2: sliding, full) repeats a unit of that many layers: the depths count units, a module keeps its
place in its unit (:func:`resacct.account.load.hf_models.config_layer_stack` finds the period).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resacct.account.peak.layer_segments import SAMPLE_DEPTHS, NotRepeating, extrapolate_peak

__all__ = ["LAYER_CHOICES", "SAMPLED_ABOVE_LAYERS", "LayerPlan", "extrapolate_account", "extrapolate_dataclass", "layer_path_of", "layer_plan", "plan_for_depth", "sampled_note"]

#: ``layers="auto"`` samples depths 3, 4 and 5 of a stack deeper than this: at 16 layers the two ways
#: cost the same (4.9 CPU s each, ``account --hf-config olmo-2-0425-1b --seq 512``), at 32 sampling saves
#: 1.4 s (mistral-7b: 4.2 against 5.6 CPU s), at 80 about 5 s.
SAMPLED_ABOVE_LAYERS = 16
#: ``auto``: sample above :data:`SAMPLED_ABOVE_LAYERS` layers; ``sampled``: above 5; ``all``: trace every layer.
LAYER_CHOICES = ("auto", "sampled", "all")


@dataclass(frozen=True)
class LayerPlan:
    """How a config's step is traced: ``sample`` (``prefix`` + 3, 4, 5 layers, extrapolated to ``depth``) or whole;
    ``why_whole``: what to tell the user when a stack deep enough to sample is traced whole (None: nothing);
    ``prefix``: the first layers, built apart, kept in every sample; ``period``: the layers of a repeated unit."""

    depth: int
    sample: bool
    why_whole: str | None = None
    prefix: int = 0
    period: int = 1

    def sample_layers(self) -> tuple[int, ...]:
        """The depths built to sample: the prefix and 3, 4, 5 repeated units."""
        return tuple(self.prefix + repeated * self.period for repeated in SAMPLE_DEPTHS)


def layer_plan(spec: Any, layers: str = "auto") -> LayerPlan:
    """The :class:`LayerPlan` for an :class:`~resacct.account.load.hf_models.HfConfigSpec` and a
    :data:`LAYER_CHOICES` choice (anything else: a :class:`~resacct.errors.ResacctError`)."""
    from resacct.account.load.hf_models import layer_stack
    from resacct.errors import ResacctError

    if layers not in LAYER_CHOICES:
        raise ResacctError(f"layers {layers!r}: expected one of {', '.join(LAYER_CHOICES)}")
    depth, prefix, period, why_not = layer_stack(spec)
    return plan_for_depth(depth, why_not, layers, prefix, period)


def plan_for_depth(depth: int, why_not: str | None, layers: str, prefix: int = 0, period: int = 1) -> LayerPlan:
    """The :class:`LayerPlan` of a stack of ``depth`` layers (``why_not``: why they may not repeat, None: they
    may; ``prefix``: how many of the first are built apart; ``period``: the layers of a repeated unit) under a
    :data:`LAYER_CHOICES` choice (see :func:`layer_plan`). ``auto`` samples where the layers traced (the prefix
    three times, 12 units) are fewer than the stack's by more than :data:`SAMPLED_ABOVE_LAYERS` - 12."""
    from resacct.errors import ResacctError

    if layers not in LAYER_CHOICES:
        raise ResacctError(f"layers {layers!r}: expected one of {', '.join(LAYER_CHOICES)}")
    traced = 3 * prefix + sum(SAMPLE_DEPTHS) * period
    if (layers == "all" or (depth - prefix) // period <= SAMPLE_DEPTHS[-1]
            or (layers == "auto" and depth - traced <= SAMPLED_ABOVE_LAYERS - sum(SAMPLE_DEPTHS))):
        return LayerPlan(depth=depth, sample=False)
    if why_not is None and (depth - prefix) % period:
        why_not = f"its {depth - prefix} layers after the first {prefix} are not whole units of {period}"
    return (LayerPlan(depth=depth, sample=True, prefix=prefix, period=period) if why_not is None
            else LayerPlan(depth=depth, sample=False, why_whole=why_not))


def sampled_note(depth: int, traced: str = "", prefix: int = 0, period: int = 1) -> str:
    """What a command says of an answer extrapolated from the sample depths (``traced``: what was
    traced, "the step", "each rank's step"; "" for the whole account; ``prefix``: the first layers, built apart;
    ``period``: the layers of a repeated unit)."""
    what = f"{traced} traced" if traced else "traced"
    depths = [prefix + repeated * period for repeated in SAMPLE_DEPTHS]
    unit = "one layer" if period == 1 else f"a unit of {period} layers"
    stack = (f"its {depth} layers are {unit} repeated" if not prefix else
             f"its {depth} layers are {prefix} built apart, then {unit} repeated")
    return (f"{stack}: {what} at depths {', '.join(map(str, depths))} ({sum(depths)} layers, "
            f"not {depth}) and extrapolated, every number fitted through two depths and checked on the third (--trace-all-layers traces them all)")


def layer_path_of(names: Sequence[str], depth: int) -> str:
    """The module path whose children ``0`` … ``depth - 1`` appear among ``names`` (``model.layers``)."""
    found: dict[str, set[int]] = {}
    for name in names:
        for match in re.finditer(r"(?:^|\.)(\d+)(?=\.|$)", name):
            found.setdefault(name[: match.start(1)].rstrip("."), set()).add(int(match.group(1)))
    paths = [path for path, indices in found.items() if indices == set(range(depth))]
    if not paths:
        raise NotRepeating(f"no module path with layers 0 … {depth - 1}")
    return min(paths, key=len)


class _Walk:
    """One extrapolation: the three samples' layer list (``path``), the target ``depth`` of repeated units of
    ``period`` layers and the ``prefix`` of layers built apart before them (named as they are: outside the
    repeated ones). ``special``'s handlers get the whole depth in layers, the prefix's included."""

    def __init__(self, path: str, depth: int, special: Mapping[type, Callable[[Sequence[Any], int], Any]], prefix: int = 0,
                 period: int = 1) -> None:
        self.depth, self.special, self.prefix, self.period = depth, special, prefix, period
        self.pattern = re.compile(rf"^{re.escape(path)}\.(\d+)(?=\.|$)")
        self.path = path

    def layer_of(self, name: Any) -> tuple[int, str] | None:
        """(its unit's place among the repeated ones, the rest of the name) of a repeated layer's entry; else None."""
        match = self.pattern.match(name) if isinstance(name, str) else None
        if match is None or int(match.group(1)) < self.prefix:
            return None
        return (int(match.group(1)) - self.prefix) // self.period, name[match.end():]

    def rename(self, name: str, index: int) -> str:
        """``name`` moved to the ``index``-th repeated unit, at its place in its unit."""
        within = (int(self.pattern.match(name).group(1)) - self.prefix) % self.period  # type: ignore[union-attr]
        return self.pattern.sub(f"{self.path}.{self.prefix + index * self.period + within}", name, count=1)

    def value(self, samples: Sequence[Any], what: str) -> Any:
        first = samples[0]
        for kind, handler in self.special.items():
            if isinstance(first, kind):
                return handler(samples, self.prefix + self.depth * self.period)
        if any(type(sample) is not type(first) for sample in samples):
            raise NotRepeating(f"{what}: of different types at different depths")
        if isinstance(first, int) and not isinstance(first, bool):
            v3, v4, v5 = samples
            if v4 - v3 != v5 - v4:
                raise NotRepeating(f"{what}: {v3}, {v4}, {v5} at depths {SAMPLE_DEPTHS} is not a line")
            return v5 + (self.depth - SAMPLE_DEPTHS[-1]) * (v5 - v4)
        if dataclasses.is_dataclass(first) and not isinstance(first, type):
            made = copy.copy(samples[-1])
            for field in dataclasses.fields(first):
                object.__setattr__(made, field.name, self.value([getattr(s, field.name) for s in samples], f"{what}.{field.name}"))
            return made
        if isinstance(first, Mapping):
            return self.mapping(samples, what)
        if isinstance(first, (list, tuple)):
            return type(first)(self.sequence(samples, what))
        if isinstance(first, str) and any(sample != first for sample in samples):
            return _affine_text(samples, self.depth, what)
        if any(sample != first for sample in samples):
            raise NotRepeating(f"{what}: {samples!r} differ between depths")
        return samples[-1]

    # ── module-keyed collections ──────────────────────────────────────────────────────────
    def _parts(self, items: Sequence[tuple[Any, Any]], depth: int, what: str) -> tuple[list, dict[int, list], list]:
        """Split ``(name, value)`` items into those before the layers, per layer (renamed to layer 0), after."""
        before: list = []
        layers: dict[int, list] = {}
        after: list = []
        for name, value in items:
            place = self.layer_of(name)
            if place is None:
                if layers and len(layers) != depth:
                    raise NotRepeating(f"{what}: {name!r} comes between the layers")
                (after if layers else before).append((name, value))
            elif after:
                raise NotRepeating(f"{what}: layer {place[0]} comes after {after[0][0]!r}")
            else:
                layers.setdefault(place[0], []).append((self.rename(name, 0), value))
        if layers and sorted(layers) != list(range(depth)):
            raise NotRepeating(f"{what}: layers {sorted(layers)} of {depth}")
        return before, layers, after

    def _laid_out(self, samples_items: Sequence[Sequence[tuple[Any, Any]]], what: str) -> list[tuple[Any, Any]]:
        parts = [self._parts(items, depth, what) for items, depth in zip(samples_items, SAMPLE_DEPTHS)]
        if not any(layers for _, layers, _ in parts):
            return self._outside([items for items in samples_items], what)
        roles: dict[str, list] = {}
        for (_, layers, _), depth in zip(parts, SAMPLE_DEPTHS):
            for index, entries in layers.items():
                role = "first" if index == 0 else "last" if index == depth - 1 else "middle"
                if roles.setdefault(role, entries) != entries:
                    raise NotRepeating(f"{what}: layer {index} of {depth} differs from another {role} layer")
        laid = self._outside([before for before, _, _ in parts], what)
        for index in range(self.depth):
            role = "first" if index == 0 else "last" if index == self.depth - 1 else "middle"
            laid += [(self.rename(name, index), value) for name, value in roles[role]]
        return laid + self._outside([after for _, _, after in parts], what)

    def _outside(self, samples_items: Sequence[Sequence[tuple[Any, Any]]], what: str) -> list[tuple[Any, Any]]:
        names = [[name for name, _ in items] for items in samples_items]
        if any(n != names[0] for n in names):
            raise NotRepeating(f"{what}: entries {names} differ between depths")
        return [(name, self.value([items[position][1] for items in samples_items], f"{what}[{name!r}]"))
                for position, name in enumerate(names[0])]

    def mapping(self, samples: Sequence[Mapping[Any, Any]], what: str) -> dict[Any, Any]:
        return dict(self._laid_out([list(sample.items()) for sample in samples], what))

    def sequence(self, samples: Sequence[Sequence[Any]], what: str) -> list[Any]:
        named = [[(getattr(item, "module", None), item) for item in sample] for sample in samples]
        if all(name is None for sample in named for name, _ in sample):
            if len({len(sample) for sample in samples}) != 1:
                raise NotRepeating(f"{what}: {[len(s) for s in samples]} items at depths {SAMPLE_DEPTHS}")
            return [self.value(list(items), f"{what}[{position}]") for position, items in enumerate(zip(*samples))]
        renamed = [[(name, dataclasses.replace(item, module=self.rename(name, 0)) if self.layer_of(name) else item) for name, item in sample]
                   for sample in named]
        return [dataclasses.replace(item, module=name) if self.layer_of(name) else item for name, item in self._laid_out(renamed, what)]


_NUMBER = re.compile(r"\d[\d,]*")


def _affine_text(samples: Sequence[str], depth: int, what: str) -> str:
    """A text (a note) whose numbers change with depth: the same words at the three depths, each number
    that changes on a line through them (``30, 39, 48 matmul call(s)`` → ``246`` at 27 layers), written at
    ``depth`` as the deepest sample writes it (thousands separated by commas or not)."""
    words = [_NUMBER.split(sample) for sample in samples]
    numbers = [_NUMBER.findall(sample) for sample in samples]
    if any(w != words[0] for w in words) or len({len(n) for n in numbers}) != 1:
        raise NotRepeating(f"{what}: {list(samples)!r} differ between depths")
    made = []
    for texts in zip(*numbers):
        v3, v4, v5 = (int(text.replace(",", "")) for text in texts)
        if v4 - v3 != v5 - v4:
            raise NotRepeating(f"{what}: {v3}, {v4}, {v5} in {samples[-1]!r} at depths {SAMPLE_DEPTHS} is not a line")
        value = v5 + (depth - SAMPLE_DEPTHS[-1]) * (v5 - v4)
        made.append(texts[-1] if v3 == v5 else f"{value:,}" if "," in texts[-1] else str(value))
    return "".join(part for pair in zip(words[-1], [*made, ""]) for part in pair)


def extrapolate_account(samples: Sequence[Any], depth: int, path: str, prefix: int = 0, period: int = 1) -> Any:
    """The account of ``depth`` layers from the three of ``prefix`` + :data:`~resacct.account.peak.layer_segments.SAMPLE_DEPTHS`
    units of ``period`` layers (``path``: the layer list's module path, ``model.layers``; ``prefix``: its first layers, built apart)."""
    from resacct.account.peak.step_peak import PredictedStepPeak

    walk = _Walk(path, (depth - prefix) // period, {PredictedStepPeak: extrapolate_peak}, prefix, period)
    return walk.value(list(samples), type(samples[0]).__name__)


def extrapolate_dataclass(samples: Sequence[Any], depth: int, prefix: int = 0, period: int = 1) -> Any:
    """A dataclass of whole numbers, names and a step peak (no module-keyed collections: ``resacct lora``'s
    :class:`~resacct.account.trace.lora_step.LoraStep`), or one whole number (``run``'s step FLOPs), at ``depth`` from the
    three at the sample depths (after ``prefix``,
    in units of ``period`` layers)."""
    from resacct.account.peak.step_peak import PredictedStepPeak

    walk = _Walk("", (depth - prefix) // period, {PredictedStepPeak: extrapolate_peak}, prefix, period)
    return walk.value(list(samples), type(samples[0]).__name__)
