"""The suite's two tiers, as a pytest plugin (the root ``conftest.py`` loads it).

Plain ``pytest`` (the README's test command) runs the quick tier: every test and claim not marked
``slow``. ``pytest --run-slow`` (or ``RESACCT_RUN_SLOW=1``) runs everything, as ``.ci/run`` does.
``slow`` marks the tests that took 0.7 s or more and the claims (``marks: [slow]`` in their spec)
that took 0.45 s or more in ``pytest -n 2 --dist loadgroup --durations=0`` on this project's
2-core machine (2026-11-24): subprocess runs of the CLI and of ``resacct verify``, spawned gloo
ranks, timed kernels, real GPT and Hugging Face steps. A claim's mutation meta-test goes with its
claim. Naming files or node ids on the command line, or choosing tests with ``-m`` or ``-k``, runs
what was asked for, slow or not.
"""

from __future__ import annotations

import os

import pytest

RUN_SLOW_OPTION = "--run-slow"
RUN_SLOW_VARIABLE = "RESACCT_RUN_SLOW"


def pytest_addoption(parser):  # type: ignore[no-untyped-def]
    parser.addoption(RUN_SLOW_OPTION, action="store_true", default=False,
                     help=f"also run the slow tier (tests and claims marked slow); {RUN_SLOW_VARIABLE}=1 does the same. .ci/run runs it")


def quick_tier_only(config) -> bool:  # type: ignore[no-untyped-def]
    if config.getoption(RUN_SLOW_OPTION) or os.environ.get(RUN_SLOW_VARIABLE, "") not in {"", "0"}:
        return False
    if config.getoption("markexpr") or config.getoption("keyword"):
        return False
    return config.args_source == config.ArgsSource.TESTPATHS  # `pytest` alone: the configured testpaths


_SLOW_NOT_RUN = pytest.StashKey[int]()
_WORKER_OUTPUT_KEY = "resacct_slow_not_run"


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    if not quick_tier_only(config):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    config.stash[_SLOW_NOT_RUN] = len(slow)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def pytest_sessionfinish(session):  # type: ignore[no-untyped-def]
    worker_output = getattr(session.config, "workeroutput", None)  # an xdist worker: tell the controller
    if worker_output is not None:
        worker_output[_WORKER_OUTPUT_KEY] = session.config.stash.get(_SLOW_NOT_RUN, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # type: ignore[no-untyped-def]
    """xdist's controller: every worker collects everything and leaves out the same slow items."""
    count = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT_KEY, 0)
    node.config.stash[_SLOW_NOT_RUN] = max(count, node.config.stash.get(_SLOW_NOT_RUN, 0))


def pytest_terminal_summary(terminalreporter, config):  # type: ignore[no-untyped-def]
    if quick_tier_only(config):
        count = config.stash.get(_SLOW_NOT_RUN, 0)
        terminalreporter.write_line(
            f"quick tier: {count} tests and claims marked slow were not run; `pytest {RUN_SLOW_OPTION}` runs "
            f"them too (.ci/run does), and `resacct verify` runs every claim")
