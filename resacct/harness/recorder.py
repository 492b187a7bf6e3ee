"""The claims recorder: a pytest plugin object that keeps one record per finished claim item
(also on the xdist controller, from the workers' reports) and, at the end, prints the claims
table and writes ``--claims-json``.

The ``pytest_resacct`` entry point registers one per run, under ``resacct-claims-recorder``,
and keeps it in the config stash under ``CLAIMS_RECORDER``. The item and report modules are
imported when first needed, so registering it imports nothing heavy.
"""

from __future__ import annotations

import pytest

from resacct.harness.pytest_settings import CLAIM_PROPERTY

__all__ = ["ClaimsRecorder", "CLAIMS_RECORDER", "RECORDER_PLUGIN_NAME"]

RECORDER_PLUGIN_NAME = "resacct-claims-recorder"


class ClaimsRecorder:
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


CLAIMS_RECORDER = pytest.StashKey[ClaimsRecorder]()
