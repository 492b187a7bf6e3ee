"""Tests share the claims' rule: a measurement this environment cannot make (``NotMeasurable``,
e.g. a torch version without FSDP2) skips with its reason instead of failing."""

from __future__ import annotations

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):  # type: ignore[no-untyped-def]
    from resacct.harness.registry import NotMeasurable

    try:
        return (yield)
    except NotMeasurable as reason:
        pytest.skip(f"not measurable here: {reason}")


@pytest.fixture(autouse=True)
def _no_inherited_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist workers run with COLUMNS=80; the CLI's output width must not depend on the runner."""
    monkeypatch.delenv("COLUMNS", raising=False)
