"""The claims report in the forms people read: the terminal summary of ``resacct verify``,
Markdown, a single-file HTML page, the errata (every refuted claim with the source's words and
the measured truth), the evidence that decides each claim (measured, published, arithmetic,
counted per area), the report directory that is never lost to a partial run, and the matrix of
claim status across torch versions (and devices) built from several ``report.json`` files.

>>> outcome_counts([{"outcome": "holds"}, {"outcome": "refuted"}])["holds"]
1
"""

from __future__ import annotations

from resacct.reporting.directory import REPORT_FILES, ReportStaging, holds_complete_report, write_report_files
from resacct.reporting.documents import (
    OUTCOMES,
    counts_by_area,
    format_value,
    is_complete,
    json_safe,
    load_report,
    merge_reports,
    outcome_counts,
    render_matrix_markdown,
    replay_notice,
    run_notice,
    statement_text,
    strict_json_text,
)
from resacct.reporting.evidence import EVIDENCE_KINDS, evidence_by_area, evidence_counts, evidence_of, evidence_summary
from resacct.reporting.html import render_html
from resacct.reporting.markdown import render_errata_markdown, render_markdown

__all__ = [
    "EVIDENCE_KINDS",
    "OUTCOMES",
    "REPORT_FILES",
    "ReportStaging",
    "counts_by_area",
    "evidence_by_area",
    "evidence_counts",
    "evidence_of",
    "evidence_summary",
    "format_value",
    "holds_complete_report",
    "is_complete",
    "json_safe",
    "load_report",
    "merge_reports",
    "outcome_counts",
    "render_errata_markdown",
    "render_html",
    "render_markdown",
    "render_matrix_markdown",
    "replay_notice",
    "run_notice",
    "statement_text",
    "strict_json_text",
    "write_report_files",
]
