"""pytest plugin of resacct (entry point ``pytest11``): collects ``*.claims.yaml`` files.

This module imports nothing from ``resacct`` at import time. jaxtyping's import hook
(``--jaxtyping-packages=resacct,...``) refuses a package that is already imported, and pytest
loads entry-point plugins before that hook is installed; so everything heavy is imported
inside the hooks, after it.
"""

from __future__ import annotations

import fnmatch
import os

import pytest

CLAIM_PROPERTY = "resacct_claim"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("claims_files", "glob of claims files pytest collects", default="*.claims.yaml")
    group = parser.getgroup("resacct", "resacct claims")
    group.addoption("--claims-json", metavar="PATH", default=None, help="write one JSON record per claim to PATH")
    group.addoption("--no-claims-summary", action="store_true", default=False, help="do not print the claims table")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", GPU_MARKER_DESCRIPTION)
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "distributed: starts torch.distributed process groups")
    hypothesis_profile_name()  # a bad RESACCT_HYPOTHESIS_PROFILE is a usage error up front
    config.stash[_SEEN_IDS] = {}
    config.stash[RECORDER] = recorder = _ClaimsRecorder(config)
    config.pluginmanager.register(recorder, "resacct-claims-recorder")


RECORDER = pytest.StashKey["_ClaimsRecorder"]()


GPU_MARKER_DESCRIPTION = (
    "gpu: a resacct claim that needs a CUDA GPU; resacct skips such claims without one "
    "(RESACCT_REQUIRE_GPU=1 makes that a failure). resacct does not skip your own tests marked gpu: "
    "give them a skipif"
)

# Hypothesis settings of the claims' ``forall`` items only. They are applied per claim item,
# on top of Hypothesis' built-in defaults: no profile is registered or loaded, so a host
# project's own profile (and every test that is not a claim) is left exactly as it was.
CLAIM_HYPOTHESIS_SETTINGS = {
    "dev": {"max_examples": 40, "deadline": None},
    "ci": {"max_examples": 25, "deadline": None, "derandomize": True, "database": None, "print_blob": True},
}


def hypothesis_profile_name() -> str:
    """Which claim settings apply: ``RESACCT_HYPOTHESIS_PROFILE`` (``dev`` or ``ci``) if set, else
    ``ci`` under CI (derandomised), else ``dev``."""
    default = "ci" if os.environ.get("CI", "").lower() in {"1", "true", "yes"} else "dev"
    name = os.environ.get("RESACCT_HYPOTHESIS_PROFILE", default)
    if name not in CLAIM_HYPOTHESIS_SETTINGS:
        raise pytest.UsageError(f"RESACCT_HYPOTHESIS_PROFILE={name!r}: expected one of {sorted(CLAIM_HYPOTHESIS_SETTINGS)}")
    return name


def claim_hypothesis_settings(max_examples: int | None = None):  # type: ignore[no-untyped-def]
    """The ``hypothesis.settings`` of one claim item: Hypothesis' own ``default`` profile (never
    the host's loaded one) with resacct's values; ``max_examples`` from the claim's ``examples``."""
    from hypothesis import HealthCheck, settings

    values = dict(CLAIM_HYPOTHESIS_SETTINGS[hypothesis_profile_name()])
    if max_examples is not None:
        values["max_examples"] = max_examples
    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
    return settings(settings.get_profile("default"), suppress_health_check=quiet, **values)


_SEEN_IDS = pytest.StashKey[dict]()


def pytest_collect_file(file_path, parent):  # type: ignore[no-untyped-def]
    pattern = parent.config.getini("claims_files")
    if fnmatch.fnmatch(file_path.name, pattern) and not file_path.name.startswith("."):  # .#x.claims.yaml: an editor's lock
        from resacct.harness.plugin import ClaimsFile

        return ClaimsFile.from_parent(parent, path=file_path, seen_ids=parent.config.stash[_SEEN_IDS])
    return None


class _ClaimsRecorder:
    """Collects one record per claim item (also on the xdist controller) and prints the table."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.records: list[dict] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = dict(report.user_properties).get(CLAIM_PROPERTY)
        if record is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            from resacct.harness.plugin import finish_record

            self.records.append(finish_record(record, report))

    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        if not self.records:
            return
        from resacct.harness.report import write_claims_json, write_summary

        if not self.config.getoption("no_claims_summary"):
            write_summary(terminalreporter, self.records)
        path = self.config.getoption("claims_json")
        if path:
            write_claims_json(path, self.records)
            terminalreporter.write_line(f"claims: wrote {len(self.records)} records to {path}")
