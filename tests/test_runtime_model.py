"""The per-op runtime model and the measured roofline, on synthetic machine rates (fast): the
cost of an op follows from torch's own FLOP count and the tensors' storages; the claims in
resacct/specs/runtime_model.claims.yaml and perf.claims.yaml check it against the clock."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from resacct.errors import ResacctError
from resacct.measurement.measured_roofline import (ComputeRoof, MeasuredRoofline, MemoryRoof, RooflinePoint, best_until_stable_sec, measure_point,
                                       save_measured_roofline_png)
from resacct.training.models import Cruncher
from resacct.measurement.runtime_model import MachineCosts, OpCost, op_cost, optimizer_op_overhead_sec, predict_step, step_time_rows

COSTS = MachineCosts(matmul_flops_per_sec={"float32": 1e11}, elements_per_sec=1e9, transcendental_elements_per_sec=1e8, division_elements_per_sec=3e8,
                     dram_bytes_per_sec=1e10, cache_bytes_per_sec=5e10, cache_bytes=2**25, kernel_overhead_sec=2e-6, view_overhead_sec=1e-6)


def test_a_matmul_costs_torch_flops_over_the_matmul_roof():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    out = torch.mm(a, b)
    with FlopCounterMode(display=False) as counter:
        torch.mm(a, b)
    cost = op_cost(torch.ops.aten.mm.default, (a, b), {}, out, COSTS)
    assert cost.flops == counter.get_total_flops() == 2 * 64 * 32 * 16
    assert cost.bytes_moved == a.untyped_storage().nbytes() + b.untyped_storage().nbytes() + 2 * out.untyped_storage().nbytes()
    assert cost.compute_sec == pytest.approx(cost.flops / 1e11)
    assert cost.memory_sec == pytest.approx(cost.bytes_moved / 5e10)  # in cache
    assert cost.predicted_sec == pytest.approx(max(cost.compute_sec, cost.memory_sec) + 2e-6)


def test_an_out_of_cache_add_is_memory_bound_on_dram():
    x = torch.empty(2**23, device="meta")
    cost = op_cost(torch.ops.aten.add.Tensor, (x, x), {}, torch.empty(2**23, device="meta"), COSTS)
    assert cost.bytes_moved == 4 * 2**23 * 4  # two reads (the same storage twice) + a write and its write-allocate read
    assert cost.memory_sec == pytest.approx(cost.bytes_moved / 1e10) and cost.bound == "memory"
    view = op_cost(torch.ops.aten.view.default, (x, [2, -1]), {}, x.view(2, -1), COSTS)
    assert (view.predicted_sec, view.bound) == (1e-6, "overhead")


def test_a_step_is_predicted_per_phase_and_module_and_clocked():
    torch.manual_seed(0)
    step = predict_step(Cruncher(dim=16, num_layers=2), torch.randn(8, 16), COSTS, repeats=2)
    assert set(step.phases()) == {"forward", "backward", "optimizer"} and all(value > 0 for value in step.phases().values())
    assert step.predicted_step_sec == pytest.approx(sum(step.phases().values()))
    modules = step.by_module()
    assert {"forward:layers.0", "forward:final", "backward:layers.1", "optimizer:optimizer"} <= set(modules)
    assert sum(op.flops for op in step.ops if op.op == "aten.mm" and op.phase == "forward") == 2 * 8 * 16 * (16 + 16 + 1)
    assert all(len(samples) == 2 for samples in step.measured_samples_sec.values()) and step.measured_step_sec > 0
    rows = step_time_rows(step)
    assert [row[0] for row in rows] == ["step, per-op roofline model", "  forward", "  backward", "  optimizer"]
    with pytest.raises(ResacctError, match="repeats is 0"):
        predict_step(Cruncher(dim=4, num_layers=1), torch.randn(2, 4), COSTS, repeats=0)


def test_best_until_stable_stops_when_the_best_stops_improving():
    samples = best_until_stable_sec(lambda: None, min_samples=4, max_samples=50, window=3, min_sample_sec=1e-4)
    assert 4 <= len(samples) <= 50 and min(samples) > 0


def _ticking_clock(seconds_per_call: float) -> tuple[list[int], object, object]:
    """A kernel that counts its calls and a clock that advances ``seconds_per_call`` per call."""
    calls = [0]

    def kernel() -> None:
        calls[0] += 1

    return calls, kernel, lambda: calls[0] * seconds_per_call


@pytest.mark.parametrize(("seconds_per_call", "expected_calls", "expected_samples"), [
    (5e-3, 2, (5e-3,)),  # long enough: the call timed to size the batches is the sample (warm-up + 1)
    (1e-3, 4, (1e-3,)),  # too short: batched in twos after the sizing call (warm-up + 1 + 2)
])
def test_one_sample_costs_the_warm_up_and_the_sizing_call_when_no_batching_is_needed(seconds_per_call, expected_calls, expected_samples):
    calls, kernel, clock = _ticking_clock(seconds_per_call)
    samples = best_until_stable_sec(kernel, min_samples=1, max_samples=1, max_total_sec=math.inf, clock=clock)
    assert calls[0] == expected_calls and samples == pytest.approx(expected_samples)


def test_the_sizing_call_counts_as_a_sample_of_a_long_kernel():
    calls, kernel, clock = _ticking_clock(4e-3)
    samples = best_until_stable_sec(kernel, min_samples=5, max_samples=5, max_total_sec=math.inf, clock=clock)
    assert len(samples) == 5 and calls[0] == 1 + 5  # the warm-up, then five timed calls, the first of them the sizing one


def test_the_roofline_png_labels_points_by_shape_and_dtype(tmp_path):
    point = RooflinePoint("matmul 256×256 @ 256×256 float32", "matmul", "float32", 2 * 256**3, 3 * 256**2 * 4, (1e-3,))
    measured = MeasuredRoofline(memory=MemoryRoof(4e10, 3e10, 2**26, (1.0,)), compute={"float32": ComputeRoof("float32", 1e11, 512, (1.0,))},
                                points=(point,))
    assert measured.share_of_roof(point) == pytest.approx(point.best_flops_per_sec / 1e11) and measured.bound(point) == "compute"
    path = save_measured_roofline_png(tmp_path / "roofline.png", measured)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ResacctError, match="bfloat16"):
        measured.roofline("bfloat16")
    assert math.isclose(measured.roofline().ridge_point_flops_per_byte, 2.5)


@pytest.mark.slow
def test_account_prints_the_predicted_step_beside_the_measured(monkeypatch):
    import resacct.measurement.runtime_model as runtime_model
    from resacct.account import account_gpt

    monkeypatch.setattr(runtime_model, "cached_machine_costs", lambda: COSTS)  # the rates are measured in the claims
    account = account_gpt("gpt-nano", batch=1, seq=8, measure=True)
    rows = {row.quantity: row for row in account.rows() if row.section == "time"}
    step = rows["step, per-op roofline model"]
    assert step.predicted == pytest.approx(account.timing.prediction.predicted_step_sec) and step.measured > 0
    assert {"  forward", "  backward", "  optimizer"} <= set(rows)
    assert any(entry["quantity"] == "step, per-op roofline model" and entry["predicted_sec"] > 0 for entry in account.to_json()["time"])


def test_an_element_wise_point_is_held_to_the_triad_of_its_own_size():
    point = measure_point("add", (256, 256), samples=2, triad_alongside=True)  # 256 KiB tensors: in cache
    assert point.memory_roof_bytes_per_sec > 0 and len(point.roof_samples_sec) == 4 and len(point.samples_sec) == 2
    slow_dram = MeasuredRoofline(memory=MemoryRoof(1.0, 0.75, 2**26, (1.0,)), compute={"float32": ComputeRoof("float32", 1e15, 512, (1.0,))},
                                 points=(point,))
    assert slow_dram.attainable_flops_per_sec(point) == pytest.approx(point.intensity_flops_per_byte * point.memory_roof_bytes_per_sec)
    roofs: dict[int, list[float]] = {}
    matmul = measure_point("matmul", (32, 32, 32), samples=3, alongside=(lambda: None, lambda: None), alongside_samples=roofs)
    assert sorted(roofs) == [0, 1] and all(len(samples) == 6 for samples in roofs.values()) and matmul.memory_roof_bytes_per_sec == 0.0


def test_the_optimizer_overhead_per_op_comes_from_a_one_element_stand_in():
    model = Cruncher(dim=16, num_layers=2)
    per_op = optimizer_op_overhead_sec(torch.optim.AdamW(model.parameters(), lr=1e-3), repeats=3)
    assert 0 < per_op < 1e-2
    step = predict_step(model, torch.randn(8, 16), COSTS, repeats=1)
    optimizer_ops = [op for op in step.ops if op.phase == "optimizer" and op.op != "aten.view"]
    assert step.optimizer_op_overhead_sec > 0 and all(op.overhead_sec == step.optimizer_op_overhead_sec for op in optimizer_ops)
    assert all(op.overhead_sec in (COSTS.kernel_overhead_sec, COSTS.view_overhead_sec) for op in step.ops if op.phase != "optimizer")


def test_reuse_distance_counts_the_bytes_touched_since_a_tensor_was_last_used_over_the_step_as_a_cycle():
    from resacct.measurement.step_cost_passes import reuse_distances_bytes

    # a (key 1) read by the first and third op: 50 bytes of b between; b touched once, so a whole step ago
    assert reuse_distances_bytes([[(1, 100)], [(2, 50)], [(1, 100)]]) == [[0.0], [200.0], [50.0]]
    assert reuse_distances_bytes([]) == []


def test_a_tensor_evicted_since_its_last_use_is_priced_at_dram_in_a_step():
    torch.manual_seed(0)
    small_cache = MachineCosts(**{**vars(COSTS), "cache_bytes": 2**12})  # 4 KiB: a Cruncher weight (16 KiB) is evicted between uses
    step = predict_step(Cruncher(dim=64, num_layers=2), torch.randn(8, 64), small_cache, repeats=1)
    roomy = predict_step(Cruncher(dim=64, num_layers=2), torch.randn(8, 64), COSTS, repeats=1)
    memory = {name: sum(op.memory_sec for op in run.ops if op.phase == "optimizer") for name, run in (("small", step), ("roomy", roomy))}
    bytes_moved = sum(op.bytes_moved for op in step.ops if op.phase == "optimizer")
    assert memory["roomy"] == pytest.approx(bytes_moved / COSTS.cache_bytes_per_sec, rel=1e-6)  # the whole step fits
    # evicted between uses: DRAM; touched again by the same op (mul_ reads then writes x): cache
    assert 2 * memory["roomy"] < memory["small"] <= bytes_moved / COSTS.dram_bytes_per_sec * (1 + 1e-9)


def test_page_faults_are_counted_per_op_and_priced_at_the_measured_cost_of_one():
    import mmap
    import time

    from resacct.measurement.step_cost_passes import minor_page_faults, page_fault_sec

    assert 0 < page_fault_sec(time.thread_time, pages=64, repeats=3) < 1e-3
    # A fresh anonymous mapping written from this thread: one fault per page. (A torch tensor is no
    # test of the counter: glibc may reuse already-faulted heap for it, and torch fills a large
    # tensor from its intra-op threads, whose faults RUSAGE_THREAD does not count.)
    pages = 64
    with mmap.mmap(-1, pages * mmap.PAGESIZE) as fresh:
        before = minor_page_faults()
        for page in range(pages):
            fresh[page * mmap.PAGESIZE] = 1
        assert minor_page_faults() - before >= pages // 2
    faulting = MachineCosts(**{**vars(COSTS), "page_fault_sec": 1.0})
    op = OpCost("forward", "", "aten.add", 1.0, 1.0, 1e-9, 1e-9, 1e-9, fault_sec=3 * faulting.page_fault_sec)
    assert op.predicted_sec == pytest.approx(3.0, rel=1e-6) and op.bound == "page faults"


def test_the_roofline_png_labels_neither_overlap_nor_leave_the_picture(tmp_path, monkeypatch):
    """Two points close together (add and relu on a CPU) and a long label at the right edge: each
    point's number beside it overlaps no other text, and every text lies inside the saved picture
    (the labels written beside the markers overlapped and ran off the right edge)."""
    import matplotlib.figure

    points = (RooflinePoint("add [4096×4096] float32", "add", "float32", 4096**2, 3 * 4096**2 * 4, (0.0067,)),
              RooflinePoint("relu [4096×4096] float32", "relu", "float32", 4096**2, 2 * 4096**2 * 4, (0.0090,)),
              RooflinePoint("matmul 1024×1024 @ 1024×1024 float32", "matmul", "float32", 2 * 1024**3, 3 * 1024**2 * 4, (0.021,)))
    measured = MeasuredRoofline(memory=MemoryRoof(4e10, 3e10, 2**26, (1.0,)), compute={"float32": ComputeRoof("float32", 1e11, 512, (1.0,))},
                                points=points)
    saved = []
    original = matplotlib.figure.Figure.savefig

    def keep(figure, *args, **kwargs):
        saved.append((figure, kwargs))
        return original(figure, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    save_measured_roofline_png(tmp_path / "roofline.png", measured)
    (figure, kwargs), = saved
    assert kwargs.get("bbox_inches") == "tight"  # the picture grows to hold the legend below the axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()  # the closed figure's canvas is a bare one
    axes = figure.axes[0]
    numbers = [text.get_window_extent(renderer) for text in axes.texts]
    assert [text.get_text() for text in axes.texts] == ["1", "2", "3"]
    assert not any(a.overlaps(b) for i, a in enumerate(numbers) for b in numbers[i + 1:])
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert any(line.startswith("3. matmul 1024×1024 @ 1024×1024 float32") for line in legend), legend
    legend_box, axes_box = axes.get_legend().get_window_extent(renderer), axes.get_window_extent(renderer)
    assert legend_box.y1 <= axes_box.y0  # below the axes: it covers no point (the tight picture holds it)


def test_the_rates_take_a_triad_measured_already_instead_of_measuring_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime model's out-of-cache triad (1.2 of its rates' 1.5 s) is the roofline's where the process measured
    that already, one thread: the claims' phase of timed claims measures it once, not twice."""
    from resacct.checks import runtime_model as checks
    from resacct.measurement import measured_roofline
    from resacct.measurement.runtime_model import measure_machine_costs

    triads: list[int] = []
    original = measured_roofline.measure_memory_roof

    def counted(**kwargs):  # type: ignore[no-untyped-def]
        triads.append(kwargs.get("array_bytes") or 0)
        return original(**{**kwargs, "array_bytes": kwargs.get("array_bytes") or 2**20})  # small arrays: the count is under test

    monkeypatch.setattr(measured_roofline, "measure_memory_roof", counted)
    given = measure_machine_costs(dram_bytes_per_sec=1.5e10)
    assert given.dram_bytes_per_sec == 1.5e10 and triads == [measured_roofline.last_level_cache_bytes() // 8]  # the in-cache triad only
    triads.clear()
    assert measure_machine_costs().dram_bytes_per_sec > 0 and len(triads) == 2  # its own out-of-cache triad, and the in-cache one

    class _Cached:  # this_machine_roofline with (or without) a measurement kept
        def __init__(self, size: int, threads: int) -> None:
            self.size, self.threads = size, threads

        def cache_info(self):  # type: ignore[no-untyped-def]
            return type("Info", (), {"currsize": self.size})()

        def __call__(self) -> MeasuredRoofline:
            return MeasuredRoofline(memory=MemoryRoof(2.5e10, 1.9e10, 2**26, ()), compute={}, points=(), threads=self.threads)

    monkeypatch.setattr(measured_roofline, "this_machine_roofline", _Cached(0, 1))
    assert checks._dram_measured_already() is None
    monkeypatch.setattr(measured_roofline, "this_machine_roofline", _Cached(1, 1))
    assert checks._dram_measured_already() == 2.5e10
    monkeypatch.setattr(measured_roofline, "this_machine_roofline", _Cached(1, 2))
    assert checks._dram_measured_already() is None  # another thread count: another clock
