"""How long: a training step's time predicted op by op from this machine's measured roofs, beside
the clock — per phase (forward, backward, optimizer), per module, per op, with each op's bound.

For every aten op that runs (recorded with a ``TorchDispatchMode``; module from torch's
``ModuleTracker``)::

    predicted = max(compute, memory) + overhead + page faults
    compute   = matmul FLOPs ÷ the measured matmul roof (its dtype), or
                elements × work per element ÷ the measured element-wise rate (an add's; a
                tanh's for exponentials and tanh; a div's for divisions; a sqrt's for roots)
    memory    = (bytes read + 2 × bytes written) ÷ the measured triad bandwidth (the roof counts
                the write-allocate read the same way: :mod:`resacct.measurement.measured_roofline`) — tensor by
                tensor in a step: the last-level cache's when the step touched at most half the
                cache since that tensor's last use, DRAM's otherwise (:mod:`resacct.measurement.step_cost_passes`)
    overhead  = a measured one-element add (dispatch, no work); in ``optimizer.step()``, the step
                of a one-element stand-in of the same optimizer ÷ its ops (its Python around each op)
    page faults = the minor faults the op took in the recorded step × the measured cost of one

The bound of an op is the largest term ("overhead" when the fixed cost per op exceeds compute
and memory). The same ops run once more with a clock around each (``measured_sec`` per
op); the phases are timed without any recording. torch's own
``torch.distributed._tools.runtime_estimator`` (roofline mode) is the reference model; it asserts
on a machine without CUDA ("Roofline estimation needs to access CUDA capabilities"), so on a CPU
this module is the only roofline estimate.

>>> from resacct.training.models import Cruncher
>>> costs = MachineCosts(matmul_flops_per_sec={"float32": 1e11}, elements_per_sec=1e9, transcendental_elements_per_sec=2e8, division_elements_per_sec=5e8,
...                      dram_bytes_per_sec=2e10, cache_bytes_per_sec=8e10, cache_bytes=2**25, kernel_overhead_sec=3e-6, view_overhead_sec=1e-6)
>>> step = predict_step(Cruncher(dim=64, num_layers=2), torch.randn(32, 64), costs, repeats=1)
>>> [phase for phase in step.phases()]
['forward', 'backward', 'optimizer']
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from resacct.errors import ResacctError
from resacct.measurement.step_cost_passes import minor_page_faults, page_fault_sec, reuse_distances_bytes
from resacct.measurement.step_cost_passes import optimizer_op_overhead_sec as _stand_in_sec

__all__ = [
    "MachineCosts",
    "measure_machine_costs",
    "OpCost",
    "StepPrediction",
    "predict_step",
    "predict_training_step",
    "cached_machine_costs",
    "optimizer_op_overhead_sec",
    "step_time_rows",
    "op_cost",
    "step_clock",
    "MATMUL_OPS",
    "TRANSCENDENTAL_OPS",
    "DIVISION_OPS",
    "ROOT_OPS",
]

PHASES = ("forward", "backward", "optimizer")

#: Ops whose FLOPs FlopCounterMode counts (matrix products): timed against the matmul roof.
MATMUL_OPS = frozenset(f"aten.{name}" for name in "mm addmm bmm baddbmm matmul linear convolution _scaled_dot_product_flash_attention_for_cpu "
                                                   "_scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention".split())
#: Element-wise work with exponentials or tanh: timed against the measured rate of ``tanh``.
TRANSCENDENTAL_OPS = frozenset(f"aten.{name}" for name in "gelu gelu_backward tanh tanh_backward exp log sigmoid sigmoid_backward erf "
                                                          "_softmax _softmax_backward_data _log_softmax _log_softmax_backward_data".split())
#: Divisions and square roots: timed against the measured rate of ``div`` (several times an add's cost).
DIVISION_OPS = frozenset(f"aten.{name}" for name in "div div_ reciprocal addcdiv addcdiv_ _foreach_div _foreach_div_ _foreach_addcdiv_".split())
#: Square roots: timed against the measured rate of ``sqrt`` (about half a div's here: Adam's ``denom``).
ROOT_OPS = frozenset(f"aten.{name}" for name in "sqrt sqrt_ rsqrt rsqrt_ _foreach_sqrt _foreach_sqrt_".split())
#: Passes over the data per element of ops that are not one pointwise step (normalisations).
_WORK_PER_ELEMENT = {"aten.native_layer_norm": 5, "aten.native_layer_norm_backward": 8, "aten._foreach_addcdiv_": 2,
                     "aten._foreach_addcmul_": 2, "aten._foreach_lerp_": 2, "aten.nll_loss_forward": 1, "aten.nll_loss_backward": 1}


@dataclass(frozen=True)
class MachineCosts:
    """This machine's measured rates: the cost model's only inputs besides the ops."""

    matmul_flops_per_sec: dict[str, float]
    elements_per_sec: float  # an in-cache add: one element-wise step per element
    transcendental_elements_per_sec: float  # an in-cache tanh
    division_elements_per_sec: float  # an in-cache div
    dram_bytes_per_sec: float  # triad, out of cache, write-allocate counted
    cache_bytes_per_sec: float  # triad, in the last-level cache
    cache_bytes: int
    kernel_overhead_sec: float  # a one-element add: dispatch and launch, no work
    view_overhead_sec: float  # a view: dispatch, no kernel
    threads: int = 1
    root_elements_per_sec: float = 0.0  # an in-cache sqrt (0: not measured, the division rate stands in)
    page_fault_sec: float = 0.0  # a write to a fresh page: the cost of memory the allocator takes from the system


def _best_sec(function: Callable[[], object], samples: int = 7, min_sample_sec: float = 2e-3) -> float:
    from resacct.measurement.measured_roofline import best_until_stable_sec

    return min(best_until_stable_sec(function, min_samples=samples, max_samples=samples, min_sample_sec=min_sample_sec, max_total_sec=float("inf")))


def measure_machine_costs(*, dtypes: tuple[str, ...] = ("float32",), matmul_size: int = 384, dram_bytes_per_sec: float | None = None) -> MachineCosts:
    """Measure the rates with dedicated kernels (~1.5 s on one CPU thread, 1.2 of it the out-of-cache triad:
    ``dram_bytes_per_sec`` is that triad measured already, e.g. by ``this_machine_roofline``)."""
    from resacct.facts.dtypes import parse_dtype
    from resacct.measurement.measured_roofline import last_level_cache_bytes, measure_compute_roof, measure_memory_roof

    cache = last_level_cache_bytes()
    dram = dram_bytes_per_sec if dram_bytes_per_sec is not None else measure_memory_roof(max_total_sec=0.5).bandwidth_bytes_per_sec
    in_cache = measure_memory_roof(array_bytes=cache // 8, max_total_sec=0.3).bandwidth_bytes_per_sec
    matmul = {dtype: measure_compute_roof(str(parse_dtype(dtype)).removeprefix("torch."), size=matmul_size, max_total_sec=0.5).peak_flops_per_sec
              for dtype in dtypes}
    x, y = torch.rand(2**14), torch.rand(2**14)  # 64 KiB each: in L2
    out = torch.empty_like(x)
    elements = x.numel() / _best_sec(functools.partial(torch.add, x, y, out=out))
    transcendental = x.numel() / _best_sec(functools.partial(torch.tanh, x, out=out))
    division = x.numel() / _best_sec(functools.partial(torch.div, x, y, out=out))
    root = x.numel() / _best_sec(functools.partial(torch.sqrt, x, out=out))
    one, other, scratch = torch.ones(1), torch.ones(1), torch.empty(1)
    kernel = _best_sec(functools.partial(torch.add, one, other, out=scratch), samples=9)
    view = _best_sec(functools.partial(torch.ops.aten.view.default, x, [128, 128]), samples=9)
    return MachineCosts(matmul_flops_per_sec=matmul, elements_per_sec=elements, transcendental_elements_per_sec=transcendental,
                        division_elements_per_sec=division,
                        dram_bytes_per_sec=dram, cache_bytes_per_sec=in_cache, cache_bytes=cache, kernel_overhead_sec=kernel,
                        view_overhead_sec=view, threads=torch.get_num_threads(), root_elements_per_sec=root,
                        page_fault_sec=page_fault_sec(step_clock()))


@dataclass(frozen=True)
class OpCost:
    """One aten op call: its work, the model's seconds and bound, and the clock's seconds."""

    phase: str
    module: str
    op: str
    flops: float
    bytes_moved: float
    compute_sec: float
    memory_sec: float
    overhead_sec: float
    measured_sec: float = 0.0
    fault_sec: float = 0.0  # the page faults the op took in the recorded step × the measured cost of one

    @property
    def predicted_sec(self) -> float:
        return max(self.compute_sec, self.memory_sec) + self.overhead_sec + self.fault_sec

    @property
    def bound(self) -> str:
        if self.fault_sec > max(self.compute_sec, self.memory_sec, self.overhead_sec):
            return "page faults"
        if self.overhead_sec >= max(self.compute_sec, self.memory_sec):
            return "overhead"
        return "compute" if self.compute_sec >= self.memory_sec else "memory"

    @property
    def intensity_flops_per_byte(self) -> float:
        return self.flops / self.bytes_moved if self.bytes_moved else float("inf")


def _tensors(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _packet(func: Any) -> str:
    return "aten." + func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)


def op_cost(func: Any, args: tuple, kwargs: dict, out: Any, costs: MachineCosts, *, phase: str = "forward", module: str = "") -> OpCost:
    """The model's cost of one op call (``func`` an aten OpOverload, its arguments and output)."""
    from torch.utils.flop_counter import flop_registry

    from resacct.measurement.flop_tracing import estimate_uncounted_flops

    packet = _packet(func)
    inputs, outputs = _tensors((args, kwargs)), _tensors(out)
    is_view = bool(getattr(func, "is_view", False)) or packet in ("aten.view", "aten._unsafe_view", "aten.t", "aten.detach", "aten.expand")
    if is_view:
        return OpCost(phase, module, packet, 0.0, 0.0, 0.0, 0.0, costs.view_overhead_sec)
    read = sum(t.untyped_storage().nbytes() if t.is_contiguous() else t.numel() * t.element_size() for t in inputs)
    written = sum(t.numel() * t.element_size() for t in outputs)
    moved = float(read + 2 * written)  # + the write-allocate read, as the roof counts it
    memory_rate = costs.cache_bytes_per_sec if read + written <= costs.cache_bytes // 2 else costs.dram_bytes_per_sec
    memory_sec = moved / memory_rate
    overhead = costs.kernel_overhead_sec * (len(outputs) if packet.startswith("aten._foreach") else 1)  # a CPU foreach loops over tensors
    counter = flop_registry.get(getattr(func, "_overloadpacket", None))
    if counter is not None or packet in MATMUL_OPS:
        flops = float(counter(*args, **kwargs, out_val=out) if counter is not None else 0)
        dtype = str(outputs[0].dtype).removeprefix("torch.") if outputs else "float32"
        peak = costs.matmul_flops_per_sec.get(dtype) or min(costs.matmul_flops_per_sec.values())
        return OpCost(phase, module, packet, flops, moved, flops / peak, memory_sec, overhead)
    elements = max((t.numel() for t in (*outputs, *inputs)), default=0)
    estimated = estimate_uncounted_flops(func, inputs[0].numel() if inputs else 0, sum(t.numel() for t in outputs))
    work = elements * _WORK_PER_ELEMENT.get(packet, 1)
    rate = (costs.transcendental_elements_per_sec if packet in TRANSCENDENTAL_OPS
            else costs.division_elements_per_sec if packet in DIVISION_OPS
            else (costs.root_elements_per_sec or costs.division_elements_per_sec) if packet in ROOT_OPS else costs.elements_per_sec)
    flops = float(estimated if estimated is not None else work)
    compute_sec = work / rate if (estimated or packet in _WORK_PER_ELEMENT or packet in TRANSCENDENTAL_OPS or packet in DIVISION_OPS
                                        or packet in ROOT_OPS) else 0.0
    return OpCost(phase, module, packet, flops, moved, compute_sec, memory_sec, overhead)


def step_clock() -> Callable[[], float]:
    """The clock a step is measured with: with one torch thread, this thread's CPU time
    (``time.thread_time``) — the work itself, not the time spent waiting for a core on a shared
    machine; on an idle machine the two agree. With more threads, the wall clock."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


class _Recorder(TorchDispatchMode):
    """Runs every op, costs it, and (``clock=True``) times it with :func:`step_clock`."""

    def __init__(self, costs: MachineCosts, tracker: Any, clock: bool) -> None:
        super().__init__()
        self.costs, self.tracker, self.clock = costs, tracker, clock
        self.now = step_clock()
        self.phase = "forward"
        self.ops: list[OpCost] = []
        self.accesses: list[list[tuple[int, int]]] = []  # per op: (storage, bytes) read, then written (twice: write-allocate)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        faults = minor_page_faults()
        began = self.now()
        out = func(*args, **kwargs)
        elapsed = self.now() - began
        faults = minor_page_faults() - faults
        parents = [name for name in self.tracker.parents if name != "Global"]
        deepest = max(parents, key=lambda name: name.count("."), default="")  # ModuleTracker: "Cruncher.layers.0"
        module = deepest.partition(".")[2] if self.phase != "optimizer" else "optimizer"
        cost = op_cost(func, args, kwargs, out, self.costs, phase=self.phase, module=module)
        cost = OpCost(**{**vars(cost), "measured_sec": elapsed if self.clock else 0.0, "fault_sec": faults * self.costs.page_fault_sec})
        self.ops.append(cost)
        self.accesses.append([] if cost.bytes_moved == 0 else
                             [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes() if t.is_contiguous() else t.numel() * t.element_size())
                              for t in _tensors((args, kwargs))]
                             + [(t.untyped_storage().data_ptr(), 2 * t.numel() * t.element_size()) for t in _tensors(out)])
        return out


@dataclass
class StepPrediction:
    """Predicted and measured seconds of one training step, per phase, module and op."""

    ops: list[OpCost]
    measured_phase_sec: dict[str, float]
    costs: MachineCosts
    measured_samples_sec: dict[str, list[float]] = field(default_factory=dict)
    optimizer_op_overhead_sec: float = 0.0  # per op of optimizer.step() on one-element stand-ins (0: not measured)

    def phases(self) -> dict[str, float]:
        """Predicted seconds per phase."""
        return {phase: sum(op.predicted_sec for op in self.ops if op.phase == phase) for phase in PHASES}

    @property
    def predicted_step_sec(self) -> float:
        return sum(op.predicted_sec for op in self.ops)

    @property
    def measured_step_sec(self) -> float:
        return sum(self.measured_phase_sec.values())

    @property
    def ratio(self) -> float:
        """predicted ÷ measured step time."""
        return self.predicted_step_sec / self.measured_step_sec

    def by(self, key: Callable[[OpCost], str]) -> dict[str, dict[str, Any]]:
        """Predicted and clocked seconds (inside the recording), and the dominant bound, per ``key``."""
        table: dict[str, dict[str, Any]] = {}
        for op in self.ops:
            row = table.setdefault(key(op), {"predicted_sec": 0.0, "measured_sec": 0.0, "calls": 0, "sec_by_bound": {}})
            row["predicted_sec"] += op.predicted_sec
            row["measured_sec"] += op.measured_sec
            row["calls"] += 1
            row["sec_by_bound"][op.bound] = row["sec_by_bound"].get(op.bound, 0.0) + op.predicted_sec
        for row in table.values():
            row["bound"] = max(row["sec_by_bound"], key=row["sec_by_bound"].get)
        return table

    def by_module(self) -> dict[str, dict[str, Any]]:
        return self.by(lambda op: f"{op.phase}:{op.module or '(top)'}")

    def by_op(self) -> dict[str, dict[str, Any]]:
        return self.by(lambda op: op.op)


def _default_loss(output: torch.Tensor) -> torch.Tensor:
    return output.float().pow(2).mean()


def predict_step(model: nn.Module, inputs: Any, costs: MachineCosts | None = None, *, loss: Callable[[Any], torch.Tensor] = _default_loss,
                 optimizer: torch.optim.Optimizer | None = None, repeats: int = 5) -> StepPrediction:
    """Predict one training step of ``model`` on ``inputs`` (forward and ``loss`` of the output,
    backward, ``optimizer.step()`` — AdamW by default) and time it: :func:`predict_training_step`."""
    return predict_training_step(model, lambda: loss(model(inputs)), costs, optimizer=optimizer, repeats=repeats)


@functools.cache
def _costs_at(thread_count: int) -> MachineCosts:
    return measure_machine_costs()


def cached_machine_costs() -> MachineCosts:
    """:func:`measure_machine_costs` at the current torch thread count, once per process."""
    return _costs_at(torch.get_num_threads())


def optimizer_op_overhead_sec(optimizer: torch.optim.Optimizer, *, repeats: int = 7) -> float:
    """The optimizer's own seconds per op, on :func:`step_clock`: see
    :func:`resacct.measurement.step_cost_passes.optimizer_op_overhead_sec` (a one-element stand-in)."""
    return _stand_in_sec(optimizer, step_clock(), repeats=repeats)


def _with_residency(ops: list[OpCost], accesses: list[list[tuple[int, int]]], costs: MachineCosts) -> list[OpCost]:
    """Each op's memory seconds again, tensor by tensor: from the cache when the step touched at
    most half of it since that tensor was last used (:func:`resacct.measurement.step_cost_passes.reuse_distances_bytes`),
    from DRAM otherwise — an op whose tensors fit in the cache may still find them evicted."""
    priced = []
    for op, touched, distances in zip(ops, accesses, reuse_distances_bytes(accesses), strict=True):
        if not touched:
            priced.append(op)
            continue
        memory_sec = sum(size / (costs.cache_bytes_per_sec if distance <= costs.cache_bytes // 2 else costs.dram_bytes_per_sec)
                         for (_, size), distance in zip(touched, distances, strict=True))
        priced.append(OpCost(**{**vars(op), "memory_sec": memory_sec}))
    return priced


def predict_training_step(model: nn.Module, objective: Callable[[], torch.Tensor], costs: MachineCosts | None = None, *,
                          optimizer: torch.optim.Optimizer | None = None, repeats: int = 5) -> StepPrediction:
    """Predict one training step — ``objective()`` (forward and loss), backward,
    ``optimizer.step()`` (AdamW by default) — op by op, and time it: each phase's median over
    ``repeats`` clean steps (no recording, :func:`step_clock`), after one warm-up step. The
    model's ``.grad`` fields are left empty; its weights take the steps."""
    from torch.utils.module_tracker import ModuleTracker

    costs = costs or cached_machine_costs()
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ResacctError(f"repeats is {repeats!r}; expected a whole number ≥ 1")
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-3)
    now = step_clock()

    def run(record: _Recorder | None = None) -> dict[str, float]:
        seconds = {}
        optimizer.zero_grad(set_to_none=True)
        began = now()
        loss = objective()
        seconds["forward"] = now() - began
        if record is not None:
            record.phase = "backward"
        began = now()
        loss.backward()
        seconds["backward"] = now() - began
        if record is not None:
            record.phase = "optimizer"
        began = now()
        optimizer.step()
        seconds["optimizer"] = now() - began
        return seconds

    run()  # warm-up: optimizer state, allocator, kernel choice
    with ModuleTracker() as tracker, _Recorder(costs, tracker, clock=True) as recorder:
        run(recorder)
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(repeats):
        for phase, seconds in run().items():
            samples[phase].append(seconds)
    optimizer.zero_grad(set_to_none=True)
    per_op = optimizer_op_overhead_sec(optimizer)
    ops = [OpCost(**{**vars(op), "overhead_sec": per_op}) if op.phase == "optimizer" and per_op and op.overhead_sec != costs.view_overhead_sec
           else op for op in _with_residency(recorder.ops, recorder.accesses, costs)]
    return StepPrediction(ops=ops, measured_phase_sec={phase: statistics.median(values) for phase, values in samples.items()},
                          costs=costs, measured_samples_sec=samples, optimizer_op_overhead_sec=per_op)


def step_time_rows(prediction: StepPrediction) -> list[tuple[str, float, float, str]]:
    """(quantity, predicted s, measured s, note) rows: the step, then each phase with its bound.
    Measured: the prediction's own clean steps, on :func:`step_clock`."""
    share = {bound: sum(op.predicted_sec for op in prediction.ops if op.bound == bound) / prediction.predicted_step_sec
             for bound in ("compute", "memory", "overhead", "page faults")}
    mix = ", ".join(f"{bound} {value:.0%}" for bound, value in share.items())
    clock = "this thread's CPU time" if prediction.costs.threads == 1 else "wall clock"
    rows = [("step, per-op roofline model", prediction.predicted_step_sec, prediction.measured_step_sec,
             f"resacct.measurement.runtime_model; measured: {clock}; {mix}")]
    by_phase = prediction.by(lambda op: op.phase)
    for phase, predicted in prediction.phases().items():
        bound = by_phase.get(phase, {}).get("bound", "—")
        rows.append((f"  {phase}", predicted, prediction.measured_phase_sec[phase], f"mostly {bound}-bound, {by_phase.get(phase, {}).get('calls', 0)} ops"))
    return rows
