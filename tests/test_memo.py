"""resacct.measurement.memo: claims that measure the same thing share one measurement (issue 34)."""

from __future__ import annotations

import pytest
import torch

from resacct.errors import ResacctError
from resacct.harness.registry import Outcome
from resacct.measurement.memo import MEMO_VARIABLE, forget_shared_measurements, memo_enabled, memo_stats, shared_measurement


def _counting() -> tuple[list[tuple[int, str]], object]:
    calls: list[tuple[int, str]] = []

    @shared_measurement
    def measure(size: int, recipe: str = "fp32") -> Outcome:
        calls.append((size, recipe))
        return Outcome(measured=size, quantities={"sizes": [size], "recipe": recipe})

    return calls, measure


def test_same_inputs_measure_once_however_they_are_spelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    calls, measure = _counting()
    first = measure(3)
    assert measure(3, "fp32") == first == measure(size=3, recipe="fp32")  # the default filled in: one key
    assert calls == [(3, "fp32")]
    assert measure.memo_stats().hits == 2 and measure.memo_stats().misses == 1  # type: ignore[attr-defined]


def test_different_inputs_never_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    calls, measure = _counting()
    assert [measure(3).measured, measure(4).measured, measure(3, "bf16").quantities["recipe"]] == [3, 4, "bf16"]
    assert calls == [(3, "fp32"), (4, "fp32"), (3, "bf16")]


def test_a_caller_cannot_change_what_the_next_caller_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    _, measure = _counting()
    first = measure(5)
    first.quantities["sizes"].append(99)  # type: ignore[attr-defined]
    first.quantities["recipe"] = "changed"  # type: ignore[index]
    again = measure(5)
    assert again.quantities == {"sizes": [5], "recipe": "fp32"}
    assert again is not first and again.quantities is not first.quantities


def test_a_result_nothing_can_change_is_handed_out_itself_and_anything_else_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    from typing import NamedTuple

    from resacct.measurement.memo import is_frozen

    @dataclasses.dataclass(frozen=True)
    class Cost:
        op: str
        shape: tuple[int, ...]

    @dataclasses.dataclass(frozen=True)
    class Holder:
        sizes: list[int]

    class Pair(NamedTuple):
        left: int
        right: tuple[int, ...]

    assert is_frozen((1, 2.5, "a", None, b"x", torch.float32, torch.device("cpu"), Cost("mm", (2, 3)), Pair(1, (2,)), frozenset({1})))
    for changeable in ([1], {"a": 1}, (1, [2]), Holder([1]), Pair(1, [2]), torch.zeros(1), dataclasses.make_dataclass("Open", ["x"])(1)):
        assert not is_frozen(changeable), changeable
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)

    @shared_measurement
    def ops(size: int) -> tuple:
        return tuple(Cost("mm", (size, size)) for _ in range(3))

    @shared_measurement
    def sizes(size: int) -> tuple:
        return (size, [size])

    assert ops(2) is ops(2)  # shared, not copied: nothing in it can change
    first = sizes(2)
    assert first is not sizes(2) and first == sizes(2)
    first[1].append(99)
    assert sizes(2) == (2, [2])  # the list inside was the caller's copy


def test_torch_threads_are_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    calls, measure = _counting()
    threads = torch.get_num_threads()
    measure(1)
    torch.set_num_threads(threads + 1)
    try:
        measure(1)
    finally:
        torch.set_num_threads(threads)
    measure(1)
    assert len(calls) == 2  # the CPU flash kernel's scratch grows with the threads: another thread count measures again


@pytest.mark.parametrize("off", ["0", "off", "false", "no"])
def test_memo_off_measures_every_call(monkeypatch: pytest.MonkeyPatch, off: str) -> None:
    monkeypatch.setenv(MEMO_VARIABLE, off)
    assert not memo_enabled()
    calls, measure = _counting()
    measure(2)
    measure(2)
    assert calls == [(2, "fp32"), (2, "fp32")]


def test_unhashable_inputs_are_refused_with_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    _, measure = _counting()
    with pytest.raises(ResacctError, match=r"\[1, 2\].*not hashable"):
        measure([1, 2])
    with pytest.raises(ResacctError, match="do not fit"):
        measure(1, "fp32", "extra")


def test_forgetting_measures_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    calls, measure = _counting()
    measure(7)
    measure.cache_clear()  # type: ignore[attr-defined]
    measure(7)
    forget_shared_measurements()
    measure(7)
    assert len(calls) == 3
    assert any(stats.function.endswith("measure") for stats in memo_stats())


def test_a_peak_claim_and_its_phase_twin_share_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """peak.step_peak passes the recipe, peak.phase_matches leaves it to its default: with
    functools.lru_cache those were two keys and the step was measured twice."""
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    from resacct.checks import peak

    peak._step.cache_clear()  # type: ignore[attr-defined]
    step = peak.step_peak(model="mlp", batch=2, seq=1, recipe="fp32")
    phase = peak.phase_matches(model="mlp", batch=2, seq=1)
    stats = peak._step.memo_stats()  # type: ignore[attr-defined]
    assert (stats.misses, stats.hits) == (1, 1)
    assert phase.quantities["measured_phase"] == step.quantities["peak_phase"]


def test_a_launch_shared_by_design_is_shared_under_memo_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMO_VARIABLE, "0")
    calls: list[int] = []

    @shared_measurement(switchable=False)
    def launch(size: int) -> int:
        calls.append(size)
        return size

    @shared_measurement
    def switchable(size: int) -> int:
        calls.append(-size)
        return size

    assert [launch(2), launch(2), switchable(2), switchable(2)] == [2, 2, 2, 2]
    assert calls == [2, -2, -2]


def test_the_transformers_torch_check_reads_and_parses_the_metadata_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every HF claim asks whether transformers works with this torch; parsing its ~240 requirements
    each time was 2 s of verify, reading the metadata 263 times another 0.8 CPU s. Both happen once a
    process; what was read decides: other metadata (a fresh read) is judged afresh."""
    import packaging.requirements

    from resacct.measurement import torch_limits

    parsed: list[str] = []
    reads: list[str] = []

    class Counting(packaging.requirements.Requirement):
        def __init__(self, text: str) -> None:
            parsed.append(text)
            super().__init__(text)

    def requires(requirements: list[str]):  # type: ignore[no-untyped-def]
        def read(name: str) -> list[str]:
            reads.append(name)
            return requirements
        return read

    monkeypatch.setattr(packaging.requirements, "Requirement", Counting)
    monkeypatch.setattr(torch_limits.importlib.metadata, "version", lambda name: "5.99.1")
    monkeypatch.setattr(torch_limits.importlib.metadata, "requires", requires(['torch>=2.0; extra == "torch"', "numpy>=1.17"]))
    torch_limits._installed_transformers.cache_clear()
    try:
        assert torch_limits.transformers_unusable() is None and torch_limits.transformers_unusable() is None
        assert reads == ["transformers"]
        assert parsed == ['torch>=2.0; extra == "torch"', "numpy>=1.17"]
        monkeypatch.setattr(torch_limits.importlib.metadata, "requires", requires(['torch>=99; extra == "torch"']))
        assert torch_limits.transformers_unusable() is None  # read once a process: the first read still decides
        torch_limits._installed_transformers.cache_clear()  # a fresh process
        assert "needs torch>=99" in (torch_limits.transformers_unusable() or "")
        assert reads == ["transformers", "transformers"]
    finally:
        torch_limits._installed_transformers.cache_clear()  # the real metadata for the tests after
