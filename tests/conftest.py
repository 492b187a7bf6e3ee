"""Tests share the claims' rule: a measurement this environment cannot make (``NotMeasurable``,
e.g. a torch version without FSDP2) skips with its reason instead of failing."""

from __future__ import annotations

import os

import pytest

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
    from resacct.measurement.torch_limits import transformers_unusable  # here: the xdist controller never imports torch

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow-audit", metavar="PATH", default=None,
                     help="write every item's wall and CPU seconds per phase to PATH (JSON); "
                          "tools/slow_audit.py PATH lists the quick-tier items over pytest.ini's slow line")


@pytest.hookimpl(tryfirst=True)  # before pytest_resacct's, which starts importing resacct
def pytest_configure(config: pytest.Config) -> None:
    """Under xdist the workers compile each module once between them (tests/run_bytecode.py).

    ``--slow-audit PATH``: tools/slow_audit.py's recorder, registered as a plugin (not a conftest), so it
    times the claims under resacct/specs as well as the tests here."""
    from conftest import type_checking, typecheck_wanted
    from tests import run_bytecode
    from tests.quick_tier import quick_tier_only

    run_bytecode.start_run(config)
    run_bytecode.share_with_other_worker(config, type_checked=type_checking() and typecheck_wanted(quick_tier_only(config), os.environ))
    if path := config.getoption("--slow-audit", None):
        import importlib.util
        from pathlib import Path

        import sys

        spec = importlib.util.spec_from_file_location("tools_slow_audit", Path(__file__).parent.parent / "tools" / "slow_audit.py")
        assert spec is not None and spec.loader is not None
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config.pluginmanager.register(module.SlowAuditRecorder(Path(path)), "resacct-slow-audit")


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests import run_bytecode

    run_bytecode.end_run(config)
