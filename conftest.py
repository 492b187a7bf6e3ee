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

import jaxtyping
import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester", "tests.quick_tier", "tests.xdist_groups"]

# jaxtyping's import hook with beartype over the layers that handle tensors: a wrong shape, dtype or
# type raises at the call during tests. The harness (YAML loading, laws, the pytest plugin), the
# report writers and the CLI's argument layer are left out: they carry no tensors, and wrapping
# their hot loops (32,000 YAML node calls per collection) cost 30 % of the claims' CPU time
# (94 s vs 67 s for `pytest resacct/specs`, one process, 2026-11-24). The hook must be installed
# before any resacct module is imported, which is why it lives here and not in pytest.ini's
# `--jaxtyping-packages` (whose parser cannot take a list of modules with a configured checker).
# It is installed in every session but the plain quick tier outside CI (typecheck_wanted, below).
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


def plain_quick_tier(early_config: pytest.Config | None) -> bool:
    """tests/quick_tier.py's quick_tier_only, from what pytest knows while it imports this conftest
    (its options are not registered yet). None (this file run outside pytest's start-up, as
    tools/mutation does): not the quick tier, so the hook goes in, as it always did."""
    pytest.register_assert_rewrite("tests.quick_tier")  # imported here before pytest_plugins loads it
    from tests.quick_tier import RUN_SLOW_OPTION, RUN_SLOW_VARIABLE

    if early_config is None:
        return False
    known = early_config.known_args_namespace
    raw = [*early_config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split()]
    run_slow = any(arg == RUN_SLOW_OPTION for arg in raw) or os.environ.get(RUN_SLOW_VARIABLE, "") not in {"", "0"}
    return not (run_slow or getattr(known, "file_or_dir", None) or getattr(known, "markexpr", "") or getattr(known, "keyword", ""))


def _starting_config() -> pytest.Config | None:
    """The Config pytest is starting while it imports this file: the ``early_config`` argument of
    the pytest_load_initial_conftests hook (a hookspec name, so stable), found up the call stack."""
    frame = sys._getframe(1)
    while frame is not None:
        config = frame.f_locals.get("early_config")
        if isinstance(config, pytest.Config):
            return config
        frame = frame.f_back
    return None


def type_checking() -> bool:
    """Whether this process runs under the hook (jaxtyping's finder is on sys.meta_path)."""
    return any(type(finder).__module__.startswith("jaxtyping") for finder in sys.meta_path)


_already_imported = sorted(name for name in sys.modules if name == "resacct" or name.startswith("resacct."))
if _already_imported:
    raise RuntimeError(f"resacct was imported before the type-checking hook: {_already_imported[:5]}")
if os.environ.get("RESACCT_TYPECHECK", "1") != "0":  # RESACCT_TYPECHECK=0: without it (benchmarks)
    if typecheck_wanted(plain_quick_tier(_starting_config()), os.environ):
        jaxtyping.install_import_hook(type_checked_modules(), TYPECHECKER)


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

