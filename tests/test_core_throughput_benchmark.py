"""benchmarks/core_throughput.py's arithmetic and its refusals (the spinning itself is a benchmark: nothing here
asserts a speed)."""

from __future__ import annotations

import pytest

from tests.script_modules import load_script


def _script():  # type: ignore[no-untyped-def]
    return load_script("benchmarks/core_throughput.py")


def test_whole_cores_deliver_their_count_and_one_shared_core_one() -> None:
    script = _script()
    assert script.delivered(2.0, [2.0, 2.0]) == pytest.approx(2.0)  # each as fast as alone: two cores' work
    assert script.delivered(2.0, [4.0, 4.0]) == pytest.approx(1.0)  # each twice as slow: one core shared
    assert script.delivered(3.0, [3.0, 6.0]) == pytest.approx(1.5)


def test_a_round_compares_the_group_with_the_mean_of_the_loop_alone_before_and_after() -> None:
    calls = []
    walls = {1: iter([1.0, 3.0]), 2: iter([[4.0, 4.0]])}

    def spin(processes: int, loops: int) -> list[float]:
        calls.append((processes, loops))
        value = next(walls[processes])
        return value if isinstance(value, list) else [value]

    figures = _script().cores_delivered(2, rounds=1, loops=7, spin=spin)
    assert calls == [(1, 7), (2, 7), (1, 7)]
    assert figures == [(pytest.approx(1.0), pytest.approx(2.0))]  # alone 2.0 s on average, 4.0 s each together
    line = _script().summary(2, figures, loops=7)
    assert "did 1.00 × one CPU's work" in line and "one alone: 2.00 s for 7 iterations" in line


@pytest.mark.parametrize("bad", [{"processes": 0}, {"rounds": 0}, {"loops": 0}])
def test_nothing_to_measure_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="must be 1 or more"):
        _script().cores_delivered(**bad, spin=lambda processes, loops: [1.0] * processes)


@pytest.mark.parametrize("seconds", [(0.0, [1.0]), (1.0, []), (1.0, [0.0, 1.0])])
def test_seconds_that_are_no_measurement_are_refused(seconds) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        _script().delivered(*seconds)


@pytest.mark.parametrize("option", ["--processes", "--rounds", "--loops"])
def test_a_count_below_one_is_a_usage_error(option, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        _script().main([option, "0"])
    assert exited.value.code == 2 and option in capsys.readouterr().err


def test_the_spinning_children_report_their_own_loop_seconds() -> None:
    seconds = _script().spin_seconds(2, loops=1000)  # a thousand iterations: a real child, no speed asserted
    assert len(seconds) == 2 and all(0 < value < 60 for value in seconds)


def test_verify_time_prints_the_probe_unless_told_not_to(monkeypatch, capsys) -> None:
    script = load_script("benchmarks/verify_time.py")
    script.print_probe("before", skip=True)
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(script.os, "cpu_count", lambda: 2)
    script.print_probe("before", skip=False, loops=1000, rounds=1)
    assert capsys.readouterr().out.startswith("CPUs before: 2 processes at once did ")


def test_the_probe_line_names_when_and_says_nothing_on_one_cpu(monkeypatch) -> None:
    script = _script()
    monkeypatch.setattr(script, "cores_delivered", lambda processes, rounds, loops: [script.Round(1.5, 0.5)] * rounds)
    assert script.probe_line("after", rounds=2, loops=10).startswith("CPUs after: 2 processes at once did 1.50 × one CPU's work")
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert script.probe_line("before") is None
