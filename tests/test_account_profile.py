"""``resacct account --profile``: CPU and wall seconds per pass (import, load/build, trace, state,
activations, peak, render …) — each second charged to one pass, so the passes and ``other`` add up
to the total, which is no more than the time measured around the command; the account's functions
get their originals back afterwards."""

from __future__ import annotations

import json
import time

import pytest

from resacct.account.trace.pass_profile import PASSES, PassProfile, pass_profile
from resacct.cli import main


def _busy(seconds: float) -> None:
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


def test_nested_passes_take_their_seconds_out_of_the_outer_one():
    profile = PassProfile()
    started = (time.process_time(), time.perf_counter())
    with profile.timing("peak"):
        with profile.timing("trace"):
            _busy(0.2)
        with profile.timing("activations", outermost_only=True):  # inside a pass: counts to that pass
            _busy(0.05)
    report = profile.report(time.process_time() - started[0], time.perf_counter() - started[1])
    assert set(report) == {"peak", "trace", "other", "total"}
    assert report["trace"]["cpu_seconds"] >= 0.2 and 0.05 <= report["peak"]["cpu_seconds"] < report["trace"]["cpu_seconds"]
    passes = sum(times["cpu_seconds"] for name, times in report.items() if name != "total")
    assert passes == pytest.approx(report["total"]["cpu_seconds"], abs=1e-3)


@pytest.mark.slow  # 0.96 s idle on 2026-11-28
def test_account_json_has_every_pass_and_they_sum_to_the_total(capsys):
    import resacct.account.peak.step_peak as peak
    import resacct.account.trace.step_measurements as measurements

    originals = (peak.predict_step_peak, measurements.measure_training_state, measurements._RecipeTraining.step)
    wall = time.perf_counter()
    assert main(["account", "--model", "gpt-nano", "--batch", "1", "--seq", "8", "--no-time", "--profile", "--json"]) == 0
    wall = time.perf_counter() - wall
    report = json.loads(capsys.readouterr().out)["profile_seconds"]
    for name in ("import", "load/build", "trace", "state", "activations", "peak", "real run", "render"):
        assert name in report, (name, report)
    assert report["trace"]["cpu_seconds"] > 0 and report["peak"]["cpu_seconds"] > 0 and report["state"]["cpu_seconds"] > 0
    assert list(report)[: len(report) - 2] == [name for name in PASSES if name in report]  # in the order a step runs them
    for key in ("cpu_seconds", "wall_seconds"):
        passes = sum(times[key] for name, times in report.items() if name not in {"other", "total"})
        assert passes <= report["total"][key] + 1e-3
        assert passes + report["other"][key] == pytest.approx(report["total"][key], abs=2e-3)
    assert report["total"]["wall_seconds"] <= wall
    assert (peak.predict_step_peak, measurements.measure_training_state, measurements._RecipeTraining.step) == originals


def test_account_text_prints_the_passes_on_stderr_and_nothing_without_the_flag(capsys):
    assert main(["account", "--model", "resacct.account.answers.generic:mlp", "--batch", "2", "--profile"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("profile: ")]
    assert lines[0].split()[1:] == ["pass", "CPU", "s", "wall", "s"] and "profile:" not in captured.out
    names = [line.split()[1] for line in lines[1:]]
    assert {"load/build", "trace", "state", "peak", "render", "other", "total"} <= set(names), names
    assert main(["account", "--model", "resacct.account.answers.generic:mlp", "--batch", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert "profile_seconds" not in json.loads(captured.out) and "profile:" not in captured.err


def test_without_the_flag_nothing_is_timed():
    profile = pass_profile(False, (0.0, 0.0))
    fields: dict = {}
    with profile.installed(), profile.timing("trace"):
        pass
    profile.publish((0.0, 0.0), fields)
    assert fields == {}


@pytest.mark.parametrize("frozen_first", [False, True], ids=["nothing-frozen-before", "frozen-before"])
def test_collector_off_pauses_the_collector_and_leaves_nothing_frozen(frozen_first: bool) -> None:
    """``collector_off`` (the account and fit commands' builds and traces): no cyclic collection inside,
    the collector back on after, nothing left in the permanent generation, and a cycle made inside still
    collected by the next full collection."""
    import gc
    import weakref

    from resacct.account.trace.pass_profile import collector_off

    class Node:
        pass

    assert gc.isenabled()
    gc.freeze() if frozen_first else gc.unfreeze()  # a process that keeps objects frozen (a claims run, this suite) keeps them so
    frozen = gc.get_freeze_count()
    assert (frozen > 0) == frozen_first
    with collector_off():
        assert not gc.isenabled()
        node = Node()
        node.self = node  # a cycle: only the collector frees it
        alive = weakref.ref(node)
        del node
        made = [[index] for index in range(100_000)]  # far past every generation's threshold: no automatic collection runs
        assert alive() is not None and len(made) == 100_000
    # nothing the block made stays frozen, and what was frozen before stays so (a few frozen objects may die meanwhile)
    assert gc.isenabled() and (frozen - 1_000 <= gc.get_freeze_count() <= frozen if frozen_first else gc.get_freeze_count() == 0)
    gc.collect()
    assert alive() is None


@pytest.mark.slow  # an HF config's account and its CUDA step: ~2 CPU s
def test_a_device_answer_names_the_cuda_step_pass(capsys):
    """``--device BOARD`` traces the step as CUDA runs it: its seconds are the ``cuda step`` pass, not ``other``."""
    pytest.importorskip("transformers")
    assert main(["account", "--hf-config", "gpt2", "--batch", "1", "--seq", "64", "--device", "h100", "--no-cache", "--profile", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["profile_seconds"]
    assert report["cuda step"]["cpu_seconds"] > 0 and report["load/build"]["cpu_seconds"] > 0
    assert list(report)[: len(report) - 2] == [name for name in PASSES if name in report]
