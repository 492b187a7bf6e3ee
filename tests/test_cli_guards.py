"""Issue 26, CLI and user code: user code that ends the process, a module tree with a cycle,
``--input-dtype`` alone, ``optimal`` below the Chinchilla fits, ``plan`` with 1e300 sizes, and the
guards of a long ``resacct account`` run (the progress line, ``--timeout``, ``--max-memory``).

Each test failed on main before its fix: ``sys.exit(0)`` in a factory exited 0 with no output, a
module holding itself ended in a RecursionError traceback, ``--input-dtype int64`` without
``--input-shape`` was dropped silently, ``optimal --flops 1`` printed 0.099 parameters, ``plan``
printed 300-digit gigabytes, and a sleeping forward printed nothing until it returned.
"""

from __future__ import annotations

import io
import json
import resource
import signal
import sys
import time

import pytest

from resacct.cli import main

FIXTURES = "tests.fixtures_user_model:"


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], status: int = 2) -> str:
    assert main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured
    return captured.err


# ── 1. sys.exit inside the user's code: the user code's failure, exit 2 ──


@pytest.mark.parametrize(("argv", "fragments"), [
    ([FIXTURES + "exits_in_factory"], ["factory 'tests.fixtures_user_model:exits_in_factory' called sys.exit(0)", "exit status 0"]),
    ([FIXTURES + "exits_in_factory", "--model-arg", "code=3"], ["called sys.exit(3)", "exit status 3"]),
    ([FIXTURES + "exits_in_factory", "--model-arg", "code=bye"], ["called sys.exit('bye')", "exit status 1"]),
    ([FIXTURES + "raises_system_exit"], ["factory 'tests.fixtures_user_model:raises_system_exit' called sys.exit()", "exit status 0"]),
    ([FIXTURES + "exits_in_forward", "--input-shape", "2,4"], ["the step of ExitsInForward (forward, loss or backward) called sys.exit(0)"]),
], ids=["exit-0", "exit-3", "exit-text", "raise-SystemExit", "forward-exit-0"])
def test_sys_exit_in_user_code_is_its_failure_exit_2(capsys, argv, fragments):
    err = _one_line_error(capsys, ["account", "--model", *argv])
    assert err.startswith("resacct account: error: ") and "fixtures_user_model.py:" in err, err
    assert all(fragment in err for fragment in fragments), err


def test_sys_exit_while_importing_the_users_module(capsys, tmp_path, monkeypatch):
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    err = _one_line_error(capsys, ["account", "--model", "exits_on_import:build"])
    assert "importing 'exits_on_import' for --model 'exits_on_import:build' called sys.exit(0)" in err, err


def test_keyboard_interrupt_in_user_code_stays_interrupted_130(capsys):
    assert main(["account", "--model", FIXTURES + "interrupted_in_factory"]) == 130
    assert capsys.readouterr().err == "resacct: interrupted\n"


# ── 2. a module tree with a cycle: one line naming the attribute path ──


@pytest.mark.parametrize(("factory", "path"), [
    ("contains_itself", "'model.again' is 'model'"),
    ("two_module_cycle", "'model.inner.outer' is 'model'"),
])
def test_a_module_that_contains_itself_is_one_line(capsys, factory, path):
    err = _one_line_error(capsys, ["account", "--model", FIXTURES + factory, "--input-shape", "2,4"])
    assert f"contains itself: {path}, a cycle in its module tree" in err and "RecursionError" not in err, err


def test_module_cycle_tells_a_cycle_from_a_shared_module_and_a_deep_tree():
    from torch import nn

    from resacct.account.load.model_factory import module_cycle
    from tests.fixtures_user_model import shared_module

    assert module_cycle(shared_module()) is None
    deep = nn.Sequential()
    inner = deep
    for _ in range(5000):  # deeper than Python's recursion limit: walked without recursion
        child = nn.Sequential()
        inner.add_module("next", child)
        inner = child
    assert module_cycle(deep) is None
    inner.add_module("back", deep.next.next)
    assert module_cycle(deep) == f"{'model' + '.next' * 5000 + '.back'!r} is 'model.next.next'"


# ── 3. --input-dtype without --input-shape ──


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--model", FIXTURES + "build_embedding", "--input-dtype", "int64"], "--input-dtype int64 applies to --input-shape's tensor; expected --input-shape"),
    (["--input-dtype", "float16"], "--input-dtype apply to --model module:factory"),
    (["--hf-config", "gpt2", "--input-dtype", "float16"], "--input-dtype do not apply to --hf-config"),
])
def test_input_dtype_without_input_shape_is_refused(capsys, argv, fragment):
    err = _one_line_error(capsys, ["account", *argv])
    assert fragment in err, err


def test_input_dtype_help_says_it_needs_input_shape(capsys):
    assert main(["account", "--help"]) == 0
    assert "only with --input-shape" in " ".join(capsys.readouterr().out.split())


# ── 4. optimal below the fits, plan with 1e300 sizes ──


_FITTED = "70M-16B parameters on 5B-500B tokens"


@pytest.mark.parametrize(("argv", "fragments"), [
    (["--flops", "1"], ["a budget of 1 FLOPs gives approach 1 0.0992 parameters × 1.68 tokens, fewer than one", "at least 2.1e+18 FLOPs", _FITTED]),
    (["--flops", "10", "--approach", "3"], ["a budget of 10 FLOPs gives approach 3 ", _FITTED]),
    (["--flops", "100", "--approach", "3"], ["gives 20 tokens per parameter 0.913 parameters", "expected a budget of at least", _FITTED]),
    (["--flops", "1e20", "--tokens-per-param", "1e30"], ["--tokens-per-param near 20 (given 1e+30)", _FITTED]),
    (["--flops", "1e24", "--device", "h100", "--mfu", "1e-300", "--goodput", "1e-300"], ["argument --mfu: '1e-300' is too small for a utilisation"]),
])
def test_optimal_refuses_an_optimum_below_one_parameter(capsys, argv, fragments):
    err = _one_line_error(capsys, ["optimal", *argv])
    assert all(fragment in err for fragment in fragments), err


def test_optimal_warns_outside_the_fitted_range(capsys):
    assert main(["optimal", "--flops", "1e10", "--json"]) == 0
    low = json.loads(capsys.readouterr().out)["warning"]
    assert low.startswith("1e+10 FLOPs is below the smallest budget the Chinchilla fits rest on") and "2.1e+18" in low
    assert main(["optimal", "--flops", "1e30"]) == 0
    assert "warning: 1e+30 FLOPs is beyond the paper's own projections" in capsys.readouterr().out
    assert main(["optimal", "--flops", "5.76e23", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warning"] is None


def test_plan_with_1e300_sizes_prints_no_300_digit_numbers(capsys):
    shape = ["--layers", "80", "--hidden", "8192", "--heads", "64", "--seq", "4096"]
    err = _one_line_error(capsys, ["plan", "--params", "1e300", *shape, "--memory-gb", "80"])  # issue 36: refused, not answered
    assert "argument --params: '1e300' is too large; expected a parameter count up to 2^53" in err, err
    assert main(["plan", "--params", "9e15", *shape, "--memory-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert "1.44e+08 GB" in out and max(len(word) for word in out.split()) < 40, out
    err = _one_line_error(capsys, ["plan", "--params", "70B", *shape, "--memory-gb", "1e300"])
    assert "--memory-gb 1e+300 is too large" in err, err
    err = _one_line_error(capsys, ["plan", "--params", "70B", *shape, "--memory-gb", "80", "--reserve-gb", "1e300"])
    assert "--reserve-gb 1e+300 is too large" in err, err


# ── 5. the guards of a long run: the progress line, --timeout, --max-memory ──


@pytest.mark.slow
def test_the_progress_line_names_the_phase_once_it_runs_long():
    from resacct.account.load.user_code import running_phase, showing_progress

    stream = io.StringIO()
    with showing_progress(stream, command="resacct account", after_s=0.3, every_s=10.0):
        with running_phase("loading the model"):
            time.sleep(1.2)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("resacct account: loading the model, ") and lines[0].endswith("s)"), lines
    quiet = io.StringIO()
    with showing_progress(quiet, command="resacct account", after_s=5.0), running_phase("loading the model"):
        time.sleep(0.3)
    assert quiet.getvalue() == ""


@pytest.mark.slow
def test_progress_goes_to_stderr_and_json_stays_clean(capsys):
    argv = ["account", "--model", FIXTURES + "slow_factory", "--model-arg", "seconds=3", "--input-shape", "2,4", "--no-measure", "--json"]
    assert main([*argv, "--progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["model_class"] == "Linear"
    assert "resacct account: loading the model (factory 'tests.fixtures_user_model:slow_factory'), " in captured.err, captured.err
    assert main([*argv, "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_timeout_stops_a_hanging_forward_naming_the_phase_and_the_line(capsys):
    handler = signal.getsignal(signal.SIGALRM)
    started = time.monotonic()
    err = _one_line_error(capsys, ["account", "--model", FIXTURES + "sleepy", "--input-shape", "2,4", "--timeout", "2"])
    assert time.monotonic() - started < 40, "the sleeping forward ran on past --timeout"
    assert "--timeout 2 s reached while tracing and measuring the step of SleepyForward (forward, loss or backward)" in err, err
    assert "fixtures_user_model.py:" in err and "in forward" in err and "raise --timeout" in err, err
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.slow
def test_timeout_names_the_factory_when_loading_hangs(capsys):
    err = _one_line_error(capsys, ["account", "--model", FIXTURES + "slow_factory", "--input-shape", "2,4", "--timeout", "1.5"])
    assert "--timeout 1.5 s reached while loading the model (factory 'tests.fixtures_user_model:slow_factory')" in err, err


def test_stopping_after_lets_a_quick_body_finish_and_restores_the_handler():
    from resacct.account.load.user_code import stopping_after
    from resacct.errors import ResacctError

    before = signal.getsignal(signal.SIGALRM)
    with stopping_after(30):
        pass
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with pytest.raises(ResacctError, match="reached while resacct's own work"):
        with stopping_after(0.2):
            try:
                time.sleep(30)
            except Exception:  # a user's blanket except cannot swallow the limit
                pass
    assert signal.getsignal(signal.SIGALRM) is before


@pytest.mark.parametrize("text", ["0", "-1", "8XB", "lots", "1e30"])
def test_max_memory_takes_sizes_only(capsys, text):
    err = _one_line_error(capsys, ["account", "--max-memory", text])
    assert f"argument --max-memory: {text!r}" in err, err


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux only")
def test_max_memory_refuses_a_hungry_forward_before_it_allocates(capsys):
    """The forward makes a 4 GB temporary: predicted on fake tensors, refused, never allocated."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    err = _one_line_error(capsys, ["account", "--model", FIXTURES + "hungry", "--input-shape", "2,4", "--max-memory", "1GiB"])
    assert "the step is predicted to need 4 GB (4,000,000," in err and "more than --max-memory 1.074 GB" in err and "refused before anything runs for real" in err, err
    grew_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grew_kib < 1 << 20, f"the process's peak grew by {grew_kib} KiB: the temporary was allocated"


@pytest.mark.slow
def test_max_memory_lets_a_step_under_it_run(capsys):
    argv = ["account", "--model", FIXTURES + "hungry", "--model-arg", "elements=1000", "--input-shape", "2,4", "--json"]
    assert main([*argv, "--max-memory", "1GiB"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == "cpu"


@pytest.mark.slow
def test_max_memory_refuses_a_gpt_over_it(capsys):
    err = _one_line_error(capsys, ["account", "--model", "gpt-nano", "--batch", "1", "--seq", "8", "--max-memory", "1KiB", "--no-time"])
    assert "--model gpt-nano: the step is predicted to need" in err and "--max-memory 1.024 kB" in err, err


_HARD_STOP_PROBE = """
import sys, threading, time
from resacct.account.load.user_code import running_phase, stopping_after

def body():
    with stopping_after(0.5, command="probe"), running_phase("a phase in a thread"):
        time.sleep(60)

worker = threading.Thread(target=body)
worker.start()
worker.join()
print("joined")
"""


@pytest.mark.slow
def test_stopping_after_ends_the_process_where_no_alarm_can_stop_it():
    """Outside the main thread no signal reaches the body: the watchdog ends the process, status 2, one line."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", _HARD_STOP_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("probe: error: --timeout 0.5 s reached while a phase in a thread (at "), done.stderr
    assert "in body)" in done.stderr and "stopped hard: no alarm outside the main thread" in done.stderr, done.stderr
