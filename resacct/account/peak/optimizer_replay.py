"""The optimizer step of a predicted peak, traced for one parameter of each kind and replayed for the
rest: the same timeline, peak and ops as tracing every parameter, at a fraction of the fake ops.

``torch.optim``'s for-loop optimizers (Adam, AdamW, SGD, Adagrad, RMSprop on CPU tensors) run the same
ops for every parameter, and what they allocate depends on the parameter's shape, strides and dtype,
its gradient's and its state's — a parameter's *class* here. On fake tensors each of those ops costs
FakeTensorMode's dispatch: GPT-2's AdamW step is 1,480 ops, a fifth of a prediction's time.

:func:`replayed_optimizer_steps` runs ``step()`` over a reduced list of the group's parameters — the
first of each class in order, then two members of one class (a body with a predecessor, and the
last parameter's body followed by what the step does after its loop) — with the tracker's event log
on (:attr:`~resacct.account.peak.tracker.LiveStorageTracker.event_log`): each op with the parameter
whose tensors it touches (a new parameter begins an iteration), each storage added and dropped, each
observation. Then it puts the tracker back as it was and replays the events for the whole list: the
first parameter's iteration as traced, each later one as its class's, each free of a temporary an
earlier iteration left (a loop's ``denom`` is freed when the next one is made) resolved against the
parameter that really came before. The bytes the tracker counts are integers added and subtracted in
the order the step would: the timeline, the peak and what is live at it come out the same.

It replays only what it checks, and otherwise runs the whole step (the events of the reduced one undone):
one parameter group, no closure, not fused, capturable or differentiable, a tracker of the plain kind;
every class with a member left, parameters that share no storage; each op touching at most one
parameter's tensors; one iteration per parameter in the log; every storage made in the step freed in
it, by the same or the next iteration (or, after the loop, one the first made); no storage of the step
renamed or resized, no scalar kept, no matmul left unprobed; two traces of one class equal to the byte,
and every iteration the same ops and events whatever its class (only the bytes differ), the first's
too but for the frees of what an iteration before it would have left.
``tests/test_optimizer_replay.py`` compares the prediction with and without it to the byte (timeline,
peak, ops) for every optimizer resacct builds, weight decay on and off, the recipes with master weights.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from resacct.account.peak.tracker import LiveStorageTracker

__all__ = ["REPLAYED_OPTIMIZERS", "replayed_optimizer_steps", "replay_enabled"]

#: The ``torch.optim`` optimizers whose for-loop step is replayed (exact types; subclasses run whole).
REPLAYED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad, torch.optim.RMSprop)

#: Switched off by the tests that compare the replay with the whole step.
replay_enabled = True


class _Unreplayable(Exception):
    """The reduced step's events do not make a replay that is sure to be the whole step's."""


@contextlib.contextmanager
def replayed_optimizer_steps(optimizer: torch.optim.Optimizer, tracker: LiveStorageTracker) -> Iterator[None]:
    """In the block, ``optimizer``'s step (the inner optimizer's, for a
    :class:`~resacct.account.peak.recipes.MasterWeightsOptimizer`) is replayed under ``tracker`` where it can be."""
    stepping = getattr(optimizer, "inner", optimizer)
    if not (replay_enabled and type(tracker) is LiveStorageTracker and type(stepping) in REPLAYED_OPTIMIZERS and len(stepping.param_groups) == 1
            and not any(stepping.param_groups[0].get(flag) for flag in ("fused", "capturable", "differentiable", "foreach"))):
        yield
        return
    whole_step = stepping.step

    def step(closure: Any = None) -> Any:
        if closure is not None:
            return whole_step(closure)
        return _step(stepping, whole_step, tracker)

    stepping.step = step  # type: ignore[method-assign]
    try:
        yield
    finally:
        del stepping.step


def _step(optimizer: torch.optim.Optimizer, whole_step: Any, tracker: LiveStorageTracker) -> None:
    group = optimizer.param_groups[0]
    stepped = [p for p in group["params"] if p.grad is not None]
    order = _reduced_order(optimizer, stepped)
    if order is None or tracker._pending_scalars or tracker.event_log is not None:
        whole_step()
        return
    reduced, classes = order
    saved = _Snapshot(tracker)
    log = _StepLog(optimizer, reduced)
    params = group["params"]
    group["params"] = reduced
    tracker.event_log = log
    try:
        whole_step()
    finally:
        tracker.event_log = None
        group["params"] = params
    saved.restore(tracker)
    try:
        actions = _replay(log, [classes[id(p)] for p in reduced], [classes[id(p)] for p in stepped])
    except _Unreplayable:
        whole_step()
        return
    _apply(tracker, actions)


def _meta(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What the ops of a step see of ``tensor`` besides its values (nothing that dispatches on a fake tensor)."""
    return (tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype, tensor.layout, tensor.requires_grad,
            tensor.untyped_storage().nbytes())


def _reduced_order(optimizer: torch.optim.Optimizer, stepped: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[int, Any]] | None:
    """The parameters to trace — the first of each class, then a second member of one class and its first
    — and each parameter's class; None where that saves nothing or parameters share storage."""
    classes: dict[int, Any] = {}
    members: dict[Any, list[torch.Tensor]] = {}
    storages: set[int] = set()
    for parameter in stepped:
        state = optimizer.state.get(parameter, {})
        tensors = [parameter, parameter.grad, *(v for v in state.values() if isinstance(v, torch.Tensor))]
        for tensor in tensors:
            if id(tensor.untyped_storage()) in storages:
                return None
            storages.add(id(tensor.untyped_storage()))
        key = (_meta(parameter), _meta(parameter.grad),
               tuple((name, _meta(v) if isinstance(v, torch.Tensor) else (type(v), v)) for name, v in state.items()))
        classes[id(parameter)] = key
        members.setdefault(key, []).append(parameter)
    first = classes[id(stepped[0])] if stepped else None
    repeated = [key for key, same in members.items() if len(same) > 1]
    if not repeated:
        return None
    anchor = first if first in repeated else repeated[0]
    reduced = [same[0] for same in members.values()] + [members[anchor][1], members[anchor][0]]
    return (reduced, classes) if len(reduced) < len(stepped) else None


class _Snapshot:
    """What the tracker counts, to put back after the reduced step."""

    def __init__(self, tracker: LiveStorageTracker) -> None:
        self.total, self.kinds, self.peak = tracker.total_bytes, Counter(tracker.bytes_by_kind), tracker.peak
        self.timeline_length, self.ops, self.unprobed = len(tracker.timeline), Counter(tracker.ops_seen), tracker.unprobed_matmuls
        self.segments = None if tracker.segments is None else [list(segment) for segment in tracker.segments]

    def restore(self, tracker: LiveStorageTracker) -> None:
        tracker.total_bytes, tracker.peak, tracker.unprobed_matmuls = self.total, self.peak, self.unprobed
        tracker.bytes_by_kind.clear()
        tracker.bytes_by_kind.update(self.kinds)
        tracker.ops_seen.clear()
        tracker.ops_seen.update(self.ops)
        del tracker.timeline[self.timeline_length:]
        if self.segments is not None:
            tracker.segments[:] = self.segments


class _StepLog:
    """The tracker's events over the reduced step, and where each parameter's iteration begins."""

    def __init__(self, optimizer: torch.optim.Optimizer, reduced: list[torch.Tensor]) -> None:
        self.owners: dict[int, tuple[Any, int]] = {}  # id(storage) -> (storage, id(parameter)); the storage kept so the id stays its
        for parameter in reduced:
            state = optimizer.state.get(parameter, {})
            for tensor in (parameter, parameter.grad, *(v for v in state.values() if isinstance(v, torch.Tensor))):
                storage = tensor.untyped_storage()
                self.owners[id(storage)] = (storage, id(parameter))
        self.events: list[tuple[Any, ...]] = []
        self.starts: list[int] = []
        self.current: int | None = None
        self.spoiled: str | None = None

    def op(self, name: str, args: Any, kwargs: Any) -> None:
        owner = None
        for value in tree_flatten((args, kwargs))[0]:
            if isinstance(value, torch.Tensor):
                known = self.owners.get(id(value.untyped_storage()))
                if known is not None:
                    if owner is not None and known[1] != owner:
                        self.spoiled = f"{name} touches two parameters' tensors"
                    owner = known[1]
        if owner is not None and owner != self.current:
            self.starts.append(len(self.events))
            self.current = owner
        self.events.append(("op", name))

    def added(self, entry: list[Any]) -> None:
        self.events.append(("add", entry, entry[0], entry[1]))

    def dropped(self, entry: list[Any]) -> None:
        self.events.append(("drop", entry, entry[0], entry[1]))

    def observed(self, op: str, transient: int, workspace: int, scratchpad: int) -> None:
        self.events.append(("observe", op, transient, workspace, scratchpad))

    def changed(self, what: str) -> None:
        self.spoiled = what


def _templates(log: _StepLog) -> tuple[list[tuple[Any, ...]], list[list[tuple[Any, ...]]]]:
    """The head (before the first iteration) and each iteration's events, adds as ``(bytes, kind)`` and
    drops as what they free: ``("head", a)``, ``("rel", d, a)`` (the a-th add of the iteration d back, d ≤ 1)
    or, in the last iteration, ``("first", a)`` (the first iteration's)."""
    if log.spoiled is not None:
        raise _Unreplayable(log.spoiled)
    bounds = [*log.starts, len(log.events)]
    pieces = [log.events[:bounds[0]], *(log.events[a:b] for a, b in zip(bounds, bounds[1:]))]
    made: dict[int, tuple[int, int, int, str]] = {}  # id(entry) -> (iteration, index, bytes, kind); head: iteration -1
    freed: set[int] = set()
    templates: list[list[tuple[Any, ...]]] = []
    last = len(pieces) - 2
    for iteration, piece in enumerate(pieces, start=-1):
        adds, template = 0, []
        for event in piece:
            if event[0] == "add":
                made[id(event[1])] = (iteration, adds, event[2], event[3])
                template.append(("add", event[2], event[3]))
                adds += 1
            elif event[0] == "drop":
                origin = made.get(id(event[1]))
                if origin is None or id(event[1]) in freed or origin[2:] != event[2:]:
                    raise _Unreplayable("a storage the step did not make was freed, or one was renamed")
                freed.add(id(event[1]))
                back = iteration - origin[0]
                if origin[0] == -1:
                    template.append(("drop", ("head", origin[1])))
                elif back <= 1:
                    template.append(("drop", ("rel", back, origin[1])))
                elif iteration == last and origin[0] == 0:
                    template.append(("drop", ("first", origin[1])))
                else:
                    raise _Unreplayable("a storage outlived the iteration after the one that made it")
            else:
                template.append(event)
        templates.append(template)
    if len(freed) != len(made):
        raise _Unreplayable("the step kept a storage it made")
    return templates[0], templates[1:]


def _shape(template: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [("add", event[2]) if event[0] == "add" else event for event in template]


def _but_frees_of_the_previous(template: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [event for event in _shape(template) if not (event[0] == "drop" and event[1][0] == "rel" and event[1][1] == 1)]


def _replay(log: _StepLog, reduced: list[Any], stepped: list[Any]) -> list[tuple[Any, ...]]:
    """The tracker's actions for the whole step, from the reduced step's log; ``reduced`` and ``stepped``:
    the classes of the parameters traced and of every parameter, in order."""
    head, iterations = _templates(log)
    if len(iterations) != len(reduced):
        raise _Unreplayable(f"{len(iterations)} iterations logged for {len(reduced)} parameters")
    bodies: dict[Any, list[tuple[Any, ...]]] = {}
    for kind, template in zip(reduced[1:-1], iterations[1:-1]):
        if bodies.setdefault(kind, template) != template:
            raise _Unreplayable("two parameters of one class stepped differently")
    shapes = {repr(_shape(template)) for template in bodies.values()}
    body = bodies[reduced[-1]]
    if len(shapes) != 1 or iterations[-1][:len(body)] != body:
        raise _Unreplayable("parameters of different classes stepped with different ops")
    if _but_frees_of_the_previous(iterations[0]) != _but_frees_of_the_previous(body):  # its adds are the ones a body's frees name
        raise _Unreplayable("the first parameter stepped with other ops than the rest")
    tail = iterations[-1][len(body):]
    made: dict[int, list[tuple[int, str]]] = {}  # per position (-1: the head), its adds' (bytes, kind)
    live: set[tuple[int, int]] = set()
    actions: list[tuple[Any, ...]] = []

    def emit(template: list[tuple[Any, ...]], at: int) -> None:
        mine = made.setdefault(at, [])
        for event in template:
            if event[0] == "add":
                live.add((at, len(mine)))
                mine.append((event[1], event[2]))
                actions.append(event)
            elif event[0] == "drop":
                label = event[1]
                source = (-1 if label[0] == "head" else 0 if label[0] == "first" else at - label[1], label[-1])
                if source not in live:
                    raise _Unreplayable(f"a free of {label} has nothing to free")
                live.discard(source)
                actions.append(("drop", *made[source[0]][source[1]]))
            else:
                actions.append(event)

    emit(head, -1)
    for at, kind in enumerate(stepped):
        emit(iterations[0] if at == 0 else _body(bodies, kind), at)
    emit(tail, len(stepped) - 1)
    if live:
        raise _Unreplayable("the replay keeps a storage the step frees")
    return actions


def _body(bodies: dict[Any, list[tuple[Any, ...]]], kind: Any) -> list[tuple[Any, ...]]:
    try:
        return bodies[kind]
    except KeyError:
        raise _Unreplayable("a class with no traced iteration after another") from None


def _apply(tracker: LiveStorageTracker, actions: list[tuple[Any, ...]]) -> None:
    """The events, on the tracker as the step would have made them."""
    for action in actions:
        what = action[0]
        if what == "op":
            tracker.ops_seen[action[1]] += 1
        elif what == "observe":
            tracker._observe(action[1], action[2], action[3], action[4])
        elif what == "add":
            tracker.bytes_by_kind[action[2]] += action[1]
            tracker.total_bytes += action[1]
        else:
            tracker._drop([action[1], action[2]])
