"""Root conftest: runtime type checking, pytester for the harness tests, and this repository's
own Hypothesis profile.

The claims plugin itself is the installed ``pytest_resacct`` entry point, so ``pytest`` collects
``resacct/specs/*.claims.yaml`` from anywhere. That plugin never loads a Hypothesis profile (it
sets the claims' settings per claim item); the profile below is this repository acting as any
host project would, for its own unit tests only.
"""

import os
import sys
from pathlib import Path

import jaxtyping
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

# jaxtyping's import hook with beartype over the layers that handle tensors: a wrong shape, dtype or
# type raises at the call during tests. The harness (YAML loading, laws, the pytest plugin), the
# report writers and the CLI's argument layer are left out: they carry no tensors, and wrapping
# their hot loops (32,000 YAML node calls per collection) cost 30 % of the claims' CPU time
# (94 s vs 67 s for `pytest resacct/specs`, one process, 2026-11-24). The hook must be installed
# before any resacct module is imported, which is why it lives here and not in pytest.ini's
# `--jaxtyping-packages` (whose parser cannot take a list of modules with a configured checker).
UNCHECKED_SUBPACKAGES = frozenset({"harness", "reporting", "cli", "specs"})
TYPECHECKER = "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))"


def type_checked_modules() -> list[str]:
    package = Path(__file__).resolve().parent / "resacct"
    names = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    names |= {path.parent.name for path in package.glob("*/__init__.py")}
    return sorted(f"resacct.{name}" for name in names - UNCHECKED_SUBPACKAGES)


_already_imported = sorted(name for name in sys.modules if name == "resacct" or name.startswith("resacct."))
if _already_imported:
    raise RuntimeError(f"resacct was imported before the type-checking hook: {_already_imported[:5]}")
if os.environ.get("RESACCT_TYPECHECK", "1") != "0":  # RESACCT_TYPECHECK=0: without it (benchmarks)
    jaxtyping.install_import_hook(type_checked_modules(), TYPECHECKER)

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("resacct-tests", max_examples=40, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("resacct-tests-ci", max_examples=25, deadline=None, derandomize=True, database=None, print_blob=True, suppress_health_check=_QUIET)
settings.load_profile("resacct-tests-ci" if os.environ.get("CI", "").lower() in {"1", "true", "yes"} else "resacct-tests")
