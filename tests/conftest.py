"""Tests share the claims' rule: a measurement this environment cannot make (``NotMeasurable``,
e.g. a torch version without FSDP2) skips with its reason instead of failing."""

from __future__ import annotations

import os

import pytest

from resacct.measurement.torch_limits import transformers_unusable

# Commands trace afresh in tests (resacct.account.trace.cache): nothing written to the user's cache, no
# answer read back past a test's monkeypatch. The cache's own tests unset it and use a temporary folder.
os.environ.setdefault("RESACCT_NO_CACHE", "1")

_importorskip = pytest.importorskip


def _importorskip_usable(modname: str, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Where the installed transformers cannot build models with this torch (transformers 5.x under
    torch 2.4: it imports, its configs work, its models and peft do not), a test's
    ``pytest.importorskip("transformers")`` or ``("peft")`` skips naming both versions; config-only
    tests that import nothing this way still run. The library says the same itself
    (:func:`~resacct.measurement.torch_limits.transformers_unusable`), in claims and commands."""
    if modname.partition(".")[0] in {"transformers", "peft"} and (reason := transformers_unusable()):
        pytest.skip(f"could not use {modname!r}: {reason}", allow_module_level=True)
    return _importorskip(modname, *args, **kwargs)


pytest.importorskip = _importorskip_usable


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
