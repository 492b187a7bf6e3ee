"""What the claims' pytest items share with the ``pytest_resacct`` entry point, kept inside resacct
so that the harness never imports the entry point: the dependency points one way,
``pytest_resacct`` → ``resacct.harness`` (``tests/test_import_layers.py`` checks it).

- ``CLAIM_PROPERTY``: the ``user_properties`` key under which a claim item carries its record;
- ``SEEN_CLAIM_IDS``: the config stash key of the claim ids collected so far, each with its
  ``file:line`` (a second claim with the same id, in any file, is a spec error);
- the Hypothesis settings of the claims' ``forall`` items and the rule that picks them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from resacct.errors import ResacctError

__all__ = [
    "CLAIM_PROPERTY",
    "SEEN_CLAIM_IDS",
    "HYPOTHESIS_PROFILE_VARIABLE",
    "CLAIM_HYPOTHESIS_SETTINGS",
    "hypothesis_profile_name",
    "claim_hypothesis_settings",
    "claims_example_database",
    "claims_cache_folder",
    "claims_hypothesis_home",
    "examples_independent_of_imports",
    "examples_repeat",
    "verify_examples_profile",
]

CLAIM_PROPERTY = "resacct_claim"

SEEN_CLAIM_IDS = pytest.StashKey[dict]()

HYPOTHESIS_PROFILE_VARIABLE = "RESACCT_HYPOTHESIS_PROFILE"

# Hypothesis settings of the claims' ``forall`` items only. They are applied per claim item,
# on top of Hypothesis' built-in defaults: no profile is registered or loaded, so a host
# project's own profile (and every test that is not a claim) is left exactly as it was.
CLAIM_HYPOTHESIS_SETTINGS = {
    "dev": {"max_examples": 40, "deadline": None},
    "ci": {"max_examples": 25, "deadline": None, "derandomize": True, "database": None, "print_blob": True},
}


SWITCH_VARIABLES = {"RESACCT_REQUIRE_TIMING": "fails the timing claims this machine is too noisy to decide",
                    "RESACCT_REQUIRE_GPU": "fails the GPU claims instead of skipping them without a GPU"}
"""The environment switches of a claims run and what 1 does: each is 1, 0 or unset."""


def switch_variable_problems() -> list[str]:
    """One message per switch set to anything but 1 or 0 (``RESACCT_REQUIRE_TIMING=banana`` was
    taken as on, silently, by pytest and by verify; ``=false`` would be too)."""
    problems = []
    for variable, meaning in SWITCH_VARIABLES.items():
        value = os.environ.get(variable)
        if value is not None and value.strip() not in {"", "0", "1"}:
            problems.append(f"{variable}={value[:40]!r}: expected 1 (it {meaning}) or 0 (or unset)")
    return problems


def check_switch_variables() -> None:
    """A usage error (pytest exit 4, one line) for a switch that is neither 1 nor 0."""
    problems = switch_variable_problems()
    if problems:
        raise pytest.UsageError("; ".join(problems))


def hypothesis_profile_name() -> str:
    """Which claim settings apply: ``RESACCT_HYPOTHESIS_PROFILE`` (``dev`` or ``ci``) if set, else
    ``ci`` under CI (derandomised), else ``dev``."""
    default = "ci" if os.environ.get("CI", "").lower() in {"1", "true", "yes"} else "dev"
    name = os.environ.get(HYPOTHESIS_PROFILE_VARIABLE, default)
    if name not in CLAIM_HYPOTHESIS_SETTINGS:
        raise pytest.UsageError(_unknown_profile(name))
    return name


def _unknown_profile(name: str) -> str:
    return f"{HYPOTHESIS_PROFILE_VARIABLE}={name!r}: expected one of {sorted(CLAIM_HYPOTHESIS_SETTINGS)} (or unset)"


def examples_repeat() -> bool:
    """Whether a ``forall`` claim draws the same examples every run: the profile in force is derandomised (``ci``'s).
    Then each example's measurement is a function of its inputs and the setup, like a ``given`` claim's, and
    ``resacct verify`` may judge it on the one an earlier run stored (:mod:`resacct.harness.replay`); ``dev``'s examples
    are new every run and always measured."""
    return bool(CLAIM_HYPOTHESIS_SETTINGS[hypothesis_profile_name()].get("derandomize", False))


def claims_cache_folder():  # type: ignore[no-untyped-def]
    """resacct's Hypothesis folder: ``$XDG_CACHE_HOME/resacct/hypothesis`` (else
    ``~/.cache/resacct/hypothesis``), made if missing; None where it cannot be made."""
    from pathlib import Path

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base) / "resacct" / "hypothesis"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


def claims_example_database():  # type: ignore[no-untyped-def]
    """Where the claims' failing examples are kept: :func:`claims_cache_folder`'s ``examples``,
    never a ``.hypothesis/`` folder in whatever directory the run started from; None (no
    database) where that folder cannot be made."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    folder = claims_cache_folder()
    return None if folder is None else DirectoryBasedExampleDatabase(str(folder / "examples"))


@contextlib.contextmanager
def claims_hypothesis_home():  # type: ignore[no-untyped-def]
    """While a claim's examples run, Hypothesis writes what it keeps beside the database (its
    cache of the constants in the code under test, ``.hypothesis/constants``) into
    :func:`claims_cache_folder` too; the host's own setting is restored afterwards."""
    from hypothesis import configuration

    folder = claims_cache_folder()
    if folder is None:
        yield
        return
    previous = getattr(configuration, "__hypothesis_home_directory", None)
    configuration.set_hypothesis_home_dir(folder)
    try:
        yield
    finally:
        configuration.set_hypothesis_home_dir(previous)


@contextlib.contextmanager
def examples_independent_of_imports():  # type: ignore[no-untyped-def]
    """While a claim's examples run, Hypothesis draws no constants from the modules imported so far.

    Hypothesis (6.1xx) mixes into its draws the literals of every "local" module (not the standard
    library's, not site-packages') in ``sys.modules`` at that moment, so under ``CI=true`` a claim's
    examples still depended on what ran before it in the process: the full run, ``--area``, ``-k``
    or a worker of ``resacct verify --workers`` drew different ones. Its own constants (powers of
    two, edge floats) stay; where this Hypothesis has no such pool, nothing changes."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without the module
        yield
        return
    local_pool = getattr(providers, "_get_local_constants", None)
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if local_pool is None or cache is None or not hasattr(providers, "Constants"):
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    cache.clear()  # the allowed constants per draw kind, built from the pool
    try:
        yield
    finally:
        providers._get_local_constants = local_pool
        cache.clear()


@contextlib.contextmanager
def verify_examples_profile(*, explore: bool) -> Iterator[None]:
    """``resacct verify``'s Hypothesis profile for its ``forall`` claims: ``RESACCT_HYPOTHESIS_PROFILE`` where set, else ``dev`` with
    ``--explore`` (new examples) and ``ci`` without (derandomised: the same examples, a repeatable verdict, replayed by the
    next run on this setup). pytest runs keep their own rule (``ci`` under ``CI``, else ``dev``). Set in this process's
    environment for the run (the forked workers inherit it), then restored."""
    chosen = os.environ.get(HYPOTHESIS_PROFILE_VARIABLE)
    if chosen is not None:
        if chosen not in CLAIM_HYPOTHESIS_SETTINGS:
            raise ResacctError(_unknown_profile(chosen))
        if explore and chosen != "dev":
            raise ResacctError(f"--explore draws new examples (the dev profile), but {HYPOTHESIS_PROFILE_VARIABLE}={chosen!r} asks for "
                               f"fixed ones; drop one of the two")
        yield
        return
    os.environ[HYPOTHESIS_PROFILE_VARIABLE] = "dev" if explore else "ci"
    try:
        yield
    finally:
        os.environ.pop(HYPOTHESIS_PROFILE_VARIABLE, None)


def claim_hypothesis_settings(max_examples: int | None = None):  # type: ignore[no-untyped-def]
    """The ``hypothesis.settings`` of one claim item: Hypothesis' own ``default`` profile (never
    the host's loaded one) with resacct's values; ``max_examples`` from the claim's ``examples``."""
    from hypothesis import HealthCheck, settings

    values = dict(CLAIM_HYPOTHESIS_SETTINGS[hypothesis_profile_name()])
    values.setdefault("database", claims_example_database())
    if max_examples is not None:
        values["max_examples"] = max_examples
    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
    return settings(settings.get_profile("default"), suppress_health_check=quiet, **values)
