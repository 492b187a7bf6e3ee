"""Root conftest: runtime type checking (off in the plain quick tier, on in CI), pytester for the harness tests, and this repository's
own Hypothesis profile.

The claims plugin itself is the installed ``pytest_resacct`` entry point, so ``pytest`` collects
``resacct/specs/*.claims.yaml`` from anywhere. That plugin never loads a Hypothesis profile (it
sets the claims' settings per claim item); the profile below is this repository acting as any
host project would, for its own unit tests only.
"""

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests import lazy_typecheck

pytest_plugins = ["pytester", "tests.quick_tier", "tests.xdist_groups"]

# jaxtyping's import hook with beartype over the layers that handle tensors: a wrong shape, dtype or
# type raises at the call during tests. The harness (YAML loading, laws, the pytest plugin), the
# report writers and the CLI's argument layer are left out: they carry no tensors, and wrapping
# their hot loops (32,000 YAML node calls per collection) cost 30 % of the claims' CPU time
# (94 s vs 67 s for `pytest resacct/specs`, one process, 2026-11-24). The hook must be installed
# before any resacct module is imported, which is why it lives here and not in pytest.ini's
# `--jaxtyping-packages` (whose parser cannot take a list of modules with a configured checker).
# It is installed in every session but the plain quick tier outside CI (typecheck_wanted, below), and
# decorates each function on its first call (tests/lazy_typecheck.py: ~70 % of the functions imported
# are never called in the quick tier; a called one is checked exactly as by jaxtyping's own hook).
UNCHECKED_SUBPACKAGES = frozenset({"harness", "reporting", "cli", "specs"})
TYPECHECKER = "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))"


def type_checked_modules() -> list[str]:
    package = Path(__file__).resolve().parent / "resacct"
    names = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    names |= {path.parent.name for path in package.glob("*/__init__.py")}
    return sorted(f"resacct.{name}" for name in names - UNCHECKED_SUBPACKAGES)


# Under pytest-xdist, each worker gets its share of the cores for torch's intra-op threads. Left at
# torch's default (every core per worker), 2 workers on 2 cores ran 4 OpenMP threads that spin
# while waiting on each other: the quick tier took 82 s, and 53 s with one thread per worker
# (2026-11-24, this project's 2-core machine). An OMP_NUM_THREADS already set is kept; child
# processes (the CLI, spawned ranks) inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, _workers))))
    if "torch" in sys.modules:  # imported by another plugin before this conftest: set it directly
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TYPECHECK_VARIABLE = "RESACCT_TYPECHECK"
TYPECHECK_SKIP_REASON = ("needs the type-checking hook, which the plain quick tier leaves off: "
                         "CI=true, RESACCT_TYPECHECK=1, --run-slow, -m/-k or naming the file turn it on")


def typecheck_wanted(quick_tier: bool, environ: Mapping[str, str]) -> bool:
    """Whether this pytest session installs the hook: ``RESACCT_TYPECHECK=1`` always, ``=0`` never
    (benchmarks); unset, everywhere but the plain quick tier outside CI. The quick tier is what a
    developer runs (the hook was 33 of its 145.5 CPU s, 2026-11-28: docs/suite_time.md); CI (`.ci/run`
    exports CI=true) runs it under the hook, as do the slow tier and any run that names what it runs."""
    value = environ.get(TYPECHECK_VARIABLE, "")
    if value not in {"", "0", "1"}:
        raise pytest.UsageError(f"{TYPECHECK_VARIABLE}={value!r}: expected 1 (type-check), 0 (do not) or unset (all but the plain quick tier)")
    if value:
        return value == "1"
    return not quick_tier or environ.get("CI", "").lower() in {"1", "true", "yes"}


def type_checking() -> bool:
    """Whether this process runs under the hook (jaxtyping's finder is on sys.meta_path)."""
    return any(type(finder).__module__.startswith("jaxtyping") for finder in sys.meta_path)


def _checked_modules_imported() -> list[str]:
    checked = tuple(f"{name}." for name in type_checked_modules())
    return sorted(name for name in sys.modules if name.startswith(checked) or f"{name}." in checked)


# Installed as this file is imported (before anything imports resacct: pytest has not parsed its
# options yet), then taken out again by pytest_configure where the session does not want it.
_HOOK: list = []
_already_imported = sorted(name for name in sys.modules if name == "resacct" or name.startswith("resacct."))
if _already_imported:
    raise RuntimeError(f"resacct was imported before the type-checking hook: {_already_imported[:5]}")
if os.environ.get("RESACCT_TYPECHECK", "1") != "0":  # RESACCT_TYPECHECK=0: without it (benchmarks)
    _HOOK.append(lazy_typecheck.install_import_hook(type_checked_modules(), TYPECHECKER))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The plain quick tier outside CI takes the hook out before any checked module is imported
    (tryfirst: before pytest_resacct's pytest_configure, the first to import resacct; collection
    comes later). Where one already was (an initial conftest imported it), the hook stays."""
    from tests.quick_tier import quick_tier_only

    wanted = typecheck_wanted(quick_tier_only(config), os.environ)
    if _HOOK and not wanted and not _checked_modules_imported():
        _HOOK.pop().uninstall()
    # the cyclic collector as in `resacct verify` (resacct.harness.collector): in the quick tier under CI=true
    # 25 full collections took 5.1-5.2 of each xdist worker's ~65 CPU s before (docs/suite_time.md, session 8)
    from resacct.harness.collector import TunedCollector

    config.pluginmanager.register(TunedCollector(), "resacct-tuned-collector")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``typecheck`` assert that the hook refuses a wrong call: skipped where it is off."""
    if not type_checking():
        for item in items:
            if item.get_closest_marker("typecheck") is not None:
                item.add_marker(pytest.mark.skip(reason=TYPECHECK_SKIP_REASON))


_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("resacct-tests", max_examples=40, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("resacct-tests-ci", max_examples=25, deadline=None, derandomize=True, database=None, print_blob=True, suppress_health_check=_QUIET)
settings.load_profile("resacct-tests-ci" if os.environ.get("CI", "").lower() in {"1", "true", "yes"} else "resacct-tests")

