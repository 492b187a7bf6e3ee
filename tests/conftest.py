"""Tests share the claims' rule: a measurement this environment cannot make (``NotMeasurable``,
e.g. a torch version without FSDP2) skips with its reason instead of failing."""

from __future__ import annotations

import importlib.abc
import sys

import pytest

from resacct.measurement.torch_limits import transformers_unusable


class _RefuseUnusableTransformers(importlib.abc.MetaPathFinder):
    """Where the installed transformers cannot build models with this torch (transformers 5.x
    under torch 2.4), importing it or peft raises ModuleNotFoundError naming both versions, so the tests'
    ``pytest.importorskip("transformers")`` skips with that reason. The library says the same
    itself (:func:`~resacct.measurement.torch_limits.transformers_unusable`), in claims and commands."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.partition(".")[0] in {"transformers", "peft"}:
            raise ModuleNotFoundError(self.reason, name=name)
        return None


if (_UNUSABLE := transformers_unusable()) and "transformers" not in sys.modules:
    sys.meta_path.insert(0, _RefuseUnusableTransformers(_UNUSABLE))


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
