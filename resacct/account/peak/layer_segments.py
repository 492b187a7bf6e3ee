"""The step peak of a deep stack of identical layers, from traces of three shallow copies of it.

A transformer's step is periodic in its layers: what one layer's forward adds, and what its
backward frees and accumulates, is the same for every layer. So the tracker's timeline of a model
of depth ``L`` falls into **segments** — before the layers, each layer's forward, after them (the
head and the loss), the head's backward, each layer's backward, after them (the embedding's), the
optimizer step, zero_grad — and every number of a segment (its peak, what is live at it by kind,
the bytes held at its end) is

- for a segment outside the layers, and for the first and last layer's: an affine function of ``L``;
- for a middle layer ``i`` (``0 < i < L-1``): an affine function of ``i`` and ``L`` (the
  activations of the layers below it are still held, the gradients of those above it are made).

A stack may begin with a **fixed prefix** of layers built apart (DeepSeek-V3's three dense layers before
its 58 mixture-of-experts ones: :class:`LayerStack`). Its layers' segments are outside the repeated
ones (keyed ``("prefix forward", j)``, ``("prefix backward", j)``, affine in ``L``), and everything
above counts the repeated layers only: depths 3, 4 and 5 are ``prefix + 3`` … ``prefix + 5`` layers built.
And a stack whose layers alternate kinds with a **period** (Gemma-2's sliding and full attention: 2) repeats
not one layer but ``period`` of them: a segment then spans one such unit (its forward pre-hook on the unit's
first layer), the depths count units (3, 4 and 5 units: 6, 8 and 10 layers for Gemma-2), and a peak's
module inside a unit keeps its place in it (``{layer+1}``).

:func:`mark_layer_segments` puts the boundaries into the tracker (a forward pre-hook on each layer;
in backward, a hook on the gradient of each layer's input, which autograd computes once that layer's
backward is done), :func:`segments_of` reads them back, and :func:`extrapolate_peak` takes the
predictions at depths 3, 4 and 5 to depth ``L``: it fits each number from some of the points and
**checks it on the others** (any mismatch: :class:`NotRepeating`, and the caller traces the whole
model), then lays the ``L`` layers' segments out in order and takes the first largest, as the tracker
does. Within the middle layers a number is affine in ``i``, so its largest is at ``i = 1`` or
``i = L-2``: every segment is laid out anyway (a few hundred), which also gives the timeline.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from resacct.account.peak.tracker import LiveStorageTracker, PeakMoment

__all__ = ["LayerStack", "NotRepeating", "SAMPLE_DEPTHS", "Segment", "SegmentedTrace", "extrapolate_peak", "find_layer_list", "mark_layer_segments", "segmenting",
           "segmenting_layers", "segments_of"]

#: The depths traced: 3 gives one middle layer, 5 gives three, so every fit has points left over to check it.
SAMPLE_DEPTHS = (3, 4, 5)


@dataclass(frozen=True)
class LayerStack:
    """The layers of a traced stack: ``prefix`` layers built apart, then ``repeated`` alike units of ``period`` layers."""

    repeated: int
    prefix: int = 0
    period: int = 1

    @property
    def layers(self) -> int:
        """Every layer built: the prefix and the repeated units' layers."""
        return self.prefix + self.repeated * self.period


_LAYERS: ContextVar[LayerStack | None] = ContextVar("resacct_segment_layers", default=None)


class NotRepeating(Exception):
    """The traces at depths 3, 4 and 5 are not one periodic step: trace the whole model instead."""


@contextlib.contextmanager
def segmenting(layers: int, prefix: int = 0, period: int = 1) -> Iterator[None]:
    """Inside: :func:`resacct.account.peak.step_peak.predict_step_peak` marks the segments of the model's stack
    of ``layers`` identical units of ``period`` layers after ``prefix`` layers built apart (:func:`find_layer_list`)."""
    token = _LAYERS.set(LayerStack(repeated=layers, prefix=prefix, period=period))
    try:
        yield
    finally:
        _LAYERS.reset(token)


def segmenting_layers() -> LayerStack | None:
    """The stack :func:`segmenting` asks for (None: no segments)."""
    return _LAYERS.get()


def find_layer_list(model: nn.Module, layers: int) -> str:
    """The path of ``model``'s ``nn.ModuleList`` of ``layers`` modules of one class (the shallowest
    one, if several)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == layers and len({type(child) for child in module}) == 1:
            return name
    raise NotRepeating(f"no list of {layers} layers of one class in {type(model).__name__}")


def _first_tensor(value: Any) -> torch.Tensor | None:
    return next((item for item in tree_flatten(value)[0] if isinstance(item, torch.Tensor)), None)


def mark_layer_segments(model: nn.Module, tracker: LiveStorageTracker, layers: LayerStack) -> list[Any]:
    """Hooks (returned, to remove) that begin a tracker segment at each layer's forward and, in
    backward, when the gradient of each layer's input — and of the last layer's output — is ready.
    A repeated layer's segments are keyed by its unit's place among the repeated ones, a prefix layer's apart;
    a unit of several layers is one segment each way (hooks on its first layer)."""
    tracker.segment_path = find_layer_list(model, layers.layers)
    tracker.segment_prefix, tracker.segment_period = layers.prefix, layers.period
    stack = model.get_submodule(tracker.segment_path)
    tracker.segments = []
    last, prefix, period = len(stack) - 1, layers.prefix, layers.period

    def key(direction: str, index: int) -> tuple[Any, ...]:
        return (direction, (index - prefix) // period) if index >= prefix else (f"prefix {direction}", index)

    def on_gradient(key: tuple[Any, ...]) -> Any:
        def hook(grad: torch.Tensor) -> None:
            tracker.begin_segment(key)

        return hook

    def before(index: int) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            tracker.begin_segment(key("forward", index))
            hidden = _first_tensor((args, kwargs))
            if hidden is not None and hidden.requires_grad:
                hidden.register_hook(on_gradient(key("backward", index - 1) if index else ("after layers", "backward")))

        return hook

    def after_last(module: nn.Module, args: Any, output: Any) -> None:
        tracker.begin_segment(("after layers", "forward"))
        hidden = _first_tensor(output)
        if hidden is not None and hidden.requires_grad:
            hidden.register_hook(on_gradient(key("backward", last)))

    handles = [layer.register_forward_pre_hook(before(index), with_kwargs=True) for index, layer in enumerate(stack)
               if index < prefix or (index - prefix) % period == 0]
    handles.append(stack[last].register_forward_hook(after_last))
    return handles


@dataclass(frozen=True)
class SegmentedTrace:
    """A step's segments, the path of the layer list they follow (``model.layers``), how many of its
    first layers are a prefix built apart and how many layers a repeated unit holds (:class:`LayerStack`)."""

    path: str
    segments: tuple[Segment, ...]
    prefix: int = 0
    period: int = 1


@dataclass(frozen=True)
class Segment:
    """One segment of a traced step: its peak moment (None: no op ran in it), the most held in it and at its end."""

    key: tuple[Any, ...]
    phase: str
    peak: PeakMoment | None
    held_max_bytes: int
    end_bytes: int


def segments_of(tracker: LiveStorageTracker) -> SegmentedTrace:
    """The tracker's segments from the forward on (``end`` counted as zero_grad, as the timeline does)."""
    marks = tracker.segments or []
    first = next((index for index, mark in enumerate(marks) if mark[0] == ("phase", "forward")), None)
    if first is None:
        raise NotRepeating("the step marked no forward")
    timeline, kept, segments = tracker.timeline, marks[first:], []
    for position, (key, phase, start, moment) in enumerate(kept):
        stop = kept[position + 1][2] if position + 1 < len(kept) else len(timeline)
        held = [value for _, value in timeline[start:stop]]
        if not held:
            continue
        segments.append(Segment(key=key, phase="zero_grad" if phase == "end" else phase, peak=moment, held_max_bytes=max(held), end_bytes=held[-1]))
    return SegmentedTrace(path=tracker.segment_path, segments=tuple(segments), prefix=tracker.segment_prefix, period=tracker.segment_period)


# ───────────────────────────── extrapolation ─────────────────────────────


def _numbers(segment: Segment) -> dict[str, int | None]:
    numbers: dict[str, int | None] = {"held": segment.held_max_bytes, "end": segment.end_bytes,
                                      "peak": None if segment.peak is None else segment.peak.bytes}
    if segment.peak is not None:
        numbers.update({f"kind:{kind}": value for kind, value in segment.peak.bytes_by_kind.items()})
    return numbers


def _words(segment: Segment, path: str, prefix: int, period: int = 1) -> tuple[str, ...]:
    """The segment's phase, peak op and where, a repeated layer's index in ``where`` written ``{layer}``
    (``{layer+k}``: the unit's ``k``-th layer, where a unit holds several; a prefix layer's index stays: it
    is the same at every depth)."""
    def placeholder(match: re.Match[str]) -> str:
        index = int(match.group(1))
        if index < prefix:
            return match.group(0)
        return f"{path}.{{layer}}" if period == 1 else f"{path}.{{layer+{(index - prefix) % period}}}"

    where = "" if segment.peak is None else re.sub(rf"^{re.escape(path)}\.(\d+)(?=\.|$)", placeholder, segment.peak.where)
    return (segment.phase, "" if segment.peak is None else segment.peak.op, where)


def _affine(points: dict[int, int | None], depth: int, what: str) -> int | None:
    """``points``: depth → value at 3, 4, 5; the value at ``depth``, the line through 4 and 5 checked at 3."""
    v3, v4, v5 = (points.get(d) for d in SAMPLE_DEPTHS)
    if v3 is None or v4 is None or v5 is None:
        if v3 is v4 is v5 is None:
            return None
        raise NotRepeating(f"{what}: present at some depths only")
    if v4 - v3 != v5 - v4:
        raise NotRepeating(f"{what}: {v3}, {v4}, {v5} at depths 3, 4, 5 is not a line")
    return v5 + (depth - 5) * (v5 - v4)


def _plane(points: dict[tuple[int, int], int | None], depth: int, index: int, what: str) -> int | None:
    """``points``: (depth, middle layer) → value; the plane through (4,1), (4,2), (5,1), checked at (3,1), (5,2), (5,3)."""
    if all(value is None for value in points.values()):
        return None
    if any(value is None for value in points.values()):
        raise NotRepeating(f"{what}: present in some middle layers only")
    base, along_layers, along_depth = points[(4, 1)], points[(4, 2)] - points[(4, 1)], points[(5, 1)] - points[(4, 1)]

    def at(d: int, i: int) -> int:
        return base + (i - 1) * along_layers + (d - 4) * along_depth

    for d, i in ((3, 1), (5, 2), (5, 3)):
        if at(d, i) != points[(d, i)]:
            raise NotRepeating(f"{what}: middle layer {i} at depth {d} holds {points[(d, i)]}, the plane says {at(d, i)}")
    return at(depth, index)


def _role(key: tuple[Any, ...], depth: int) -> tuple[Any, ...]:
    """A segment's place independent of depth: outside the layers, or a layer that is the first, the last, or in the middle."""
    if key[0] not in ("forward", "backward"):
        return key
    index = key[1]
    return (key[0], "first" if index == 0 else "last" if index == depth - 1 else "middle")


def _layout(reference: Sequence[Segment], depth: int) -> list[tuple[Any, ...]]:
    """The keys of the depth-``depth`` step's segments, in order, from the order of one traced step."""
    keys: list[tuple[Any, ...]] = []
    for segment in reference:
        key = segment.key
        if key[0] not in ("forward", "backward"):
            keys.append(key)
        elif not any(seen[0] == key[0] for seen in keys):  # a direction's first layer: all of them, in its order
            order = range(depth) if key[0] == "forward" else reversed(range(depth))
            keys += [(key[0], index) for index in order]
    return keys


def _sample_segments(samples: Sequence[Sequence[Segment]]) -> dict[int, dict[tuple[Any, ...], Segment]]:
    by_depth = {}
    for depth, segments in zip(SAMPLE_DEPTHS, samples):
        keyed = {segment.key: segment for segment in segments}
        if len(keyed) != len(segments) or _layout(segments, depth) != [segment.key for segment in segments]:
            raise NotRepeating(f"the step at depth {depth} is not laid out as one segment per layer")
        by_depth[depth] = keyed
    return by_depth


def extrapolate_segments(samples: Sequence[Sequence[Segment]], depth: int, path: str, prefix: int = 0, period: int = 1) -> list[Segment]:
    """The segments of the step at ``depth`` repeated units from those at :data:`SAMPLE_DEPTHS` (``path``: the
    layer list's, for ``where``; ``prefix``: the layers built apart before the repeated ones; ``period``: a unit's layers)."""
    by_depth = _sample_segments(samples)
    out = []
    for key in _layout(samples[-1], depth):
        role = _role(key, depth)
        if role[-1] == "middle":
            chosen = {(d, i): by_depth[d][(key[0], i)] for d in SAMPLE_DEPTHS for i in range(1, d - 1)}
        else:
            chosen = {d: next(s for k, s in by_depth[d].items() if _role(k, d) == role) for d in SAMPLE_DEPTHS}
        words = {_words(segment, path, prefix, period) for segment in chosen.values()}
        if len(words) != 1:
            raise NotRepeating(f"segment {key}: its peak is at different ops at different depths ({sorted(words)})")
        names = list(dict.fromkeys(name for segment in chosen.values() for name in _numbers(segment)))
        numbers = {}
        for name in names:
            values = {at: _numbers(segment).get(name, 0 if name.startswith("kind:") else None) for at, segment in chosen.items()}
            what = f"segment {key}, {name}"
            numbers[name] = _plane(values, depth, key[1], what) if role[-1] == "middle" else _affine(values, depth, what)
        phase, op, where = words.pop()
        peak = None
        if numbers["peak"] is not None:
            kinds = {name[5:]: value for name, value in numbers.items() if name.startswith("kind:") and value}
            if key[0] in ("forward", "backward"):
                where = re.sub(r"\{layer(?:\+(\d+))?\}", lambda found: str(prefix + key[1] * period + int(found.group(1) or 0)), where)
            peak = PeakMoment(bytes=numbers["peak"], phase=phase, op=op, where=where, bytes_by_kind=kinds)
        out.append(Segment(key=key, phase=phase, peak=peak, held_max_bytes=numbers["held"], end_bytes=numbers["end"]))
    return out


def extrapolate_peak(samples: Sequence[Any], depth: int) -> Any:
    """The :class:`~resacct.account.peak.step_peak.PredictedStepPeak` of ``depth`` layers (its prefix's
    included) from the three at :data:`SAMPLE_DEPTHS` repeated layers (each made while :func:`segmenting`)."""
    from resacct.measurement.memory_timeline import MemoryTimeline

    traces = [sample.segments for sample in samples]
    if any(trace is None for trace in traces) or len({(trace.path, trace.prefix, trace.period) for trace in traces}) != 1:
        raise NotRepeating("a prediction was made without segments, or along different layer lists")
    prefix, period = traces[0].prefix, traces[0].period
    if (depth - prefix) % period:
        raise NotRepeating(f"{depth - prefix} layers after the prefix are not whole units of {period}")
    depth = (depth - prefix) // period  # from here on the repeated units only
    segments = extrapolate_segments([trace.segments for trace in traces], depth, traces[0].path, prefix, period)
    peak = None
    for segment in segments:  # the first largest, as the tracker keeps it
        if segment.peak is not None and (peak is None or segment.peak.bytes > peak.bytes):
            peak = segment.peak
    if peak is None:
        raise NotRepeating("no op ran in the step")
    start = _affine({d: s.timeline.start_bytes for d, s in zip(SAMPLE_DEPTHS, samples)}, depth, "the bytes held at the start")
    ops = {op: _affine({d: s.ops_seen.get(op, 0) for d, s in zip(SAMPLE_DEPTHS, samples)}, depth, f"calls of {op}")
           for op in dict.fromkeys(op for s in samples for op in s.ops_seen)}
    unprobed = _affine({d: s.unprobed_matmuls for d, s in zip(SAMPLE_DEPTHS, samples)}, depth, "matmuls too large to probe")
    phases = tuple(segment.phase for segment in segments for _ in range(2))
    held = tuple(value for segment in segments for value in (segment.held_max_bytes, segment.end_bytes))
    timeline = MemoryTimeline(phases=phases, bytes_held=held, start_bytes=start, peak_bytes=peak.bytes, peak_phase=peak.phase,
                              source=samples[-1].timeline.source)
    return type(samples[-1])(peak=peak, timeline=timeline, ops_seen=ops, unprobed_matmuls=unprobed)
