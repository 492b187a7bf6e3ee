"""Checks that exist only for the harness tests: they measure nothing but the value given,
so each test controls exactly what the "measurement" is."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from resacct.harness.registry import Outcome, check


@check("testing.echo", quantities=("twice",))
def echo(value: int, prediction_offset: int = 0) -> Outcome:
    """Measures ``value``; predicts ``value + prediction_offset``."""
    return Outcome(measured=value, predicted=value + prediction_offset, quantities={"twice": 2 * value})


@check("testing.square")
def square(x: int) -> Outcome:
    """Measures x·x (a stand-in for a real measurement)."""
    return Outcome(measured=x * x, predicted=x * x)


@check("testing.fails_with")
def fails_with(message: str) -> Outcome:
    """Raises RuntimeError(message)."""
    raise RuntimeError(message)


def sdpa_flop_count(message: str) -> None:  # named as torch 2.11's FlopCounterMode helper that asserts on GQA
    raise AssertionError(message)


@check("testing.asserts_in_torchs_sdpa_flop_count")
def asserts_in_torchs_sdpa_flop_count(message: str) -> Outcome:
    """Raises AssertionError(message) from a function named like torch's sdpa_flop_count."""
    sdpa_flop_count(message)
    raise AssertionError("unreachable")


@check("testing.text")
def text(value: str) -> Outcome:
    return Outcome(measured=value)


@pytest.fixture
def write_spec(pytester: pytest.Pytester):
    """Write ``specs/<name>`` with dedented YAML; returns its path."""

    def write(name: str, body: str) -> Path:
        path = pytester.path / "specs" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(textwrap.dedent(body).lstrip("\n"), encoding="utf-8")
        return path

    return write


# pytester's in-process runs drop modules first imported during the inner run; torch cannot be
# imported twice in one process, so import it (and resacct's checks) here, once, up front.
# The same for the plugin's items and loader (and yaml): beartype caches the class a string
# annotation such as ``yaml.nodes.Node`` names, so a yaml imported afresh by a later inner run
# fails that check (test_plugin.py run on its own failed 26 tests that way).
import torch  # noqa: E402,F401

import resacct.harness.plugin  # noqa: E402,F401

from resacct.harness.registry import all_checks  # noqa: E402

all_checks()


@check("testing.timed", timing=True)
def timed(value: float) -> Outcome:
    """A stand-in timing check: measures ``value`` (tests script the rounds through
    ``resacct.harness.timing.measure_with_cpu_share``)."""
    return Outcome(measured=value)


@check("testing.timed_with_state", timing=True, forget=(lambda: None,))
def timed_with_state(value: float) -> Outcome:
    """A stand-in timing check that keeps state between calls (``forget=``), as the runtime model's rates do."""
    return Outcome(measured=value)
