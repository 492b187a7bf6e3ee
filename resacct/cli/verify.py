"""``resacct verify``: run every claim against this machine's PyTorch; print per-area counts and
the claims that do not hold.

Prints the per-area counts (holds / refuted / skipped / failed / invalid), then only the claims
that do not hold: failed ones first, with the law's value, the prediction, the measurement, the
inputs and the YAML file:line; then the refuted ones with their truth. --all or --status shows
others; --json prints everything as strict JSON. The report directory (report.json, report.md,
report.html, errata.md, roofline.png, step-timeline.png, pytest.log) is replaced only by a complete run: a run of
--area or -k, or one stopped by Ctrl-C, goes to <report-dir>-partial/ when <report-dir> holds a
complete report, and says it is partial in every file. Exit status 1 when a claim failed or is
invalid, 2 for bad arguments, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from resacct.cli._claim_files import claim_files as _claim_files
from resacct.cli._drawn_beside import DrawnBeside
from resacct.errors import ResacctError

__all__ = ["register", "run_verify", "default_specs_dir"]

STATUS_STYLE = {"holds": "green", "refuted": "magenta", "skipped": "yellow", "inconclusive": "yellow", "failed": "bold red", "invalid": "bold red"}
_OUTCOMES = ("holds", "refuted", "skipped", "inconclusive", "failed", "invalid")


def default_specs_dir() -> Path:
    """The claims shipped inside the package: ``resacct/specs/`` (a wheel, an editable install or a checkout)."""
    return Path(__file__).resolve().parents[1] / "specs"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check every claim against PyTorch and print the claims table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  resacct verify\n  resacct verify --area dtypes --area storage --all\n  resacct verify -k gpt3 --status holds\n"
               "  resacct verify --json | jq '.counts'\n  resacct verify --last --status failed",
    )
    parser.add_argument("--specs", type=Path, default=None, help="a folder of *.claims.yaml files, or one such file (default: the claims shipped with resacct)")
    parser.add_argument("--area", action="append", default=[], help="only this area (repeatable), e.g. dtypes; the report is partial")
    parser.add_argument("-k", dest="pattern", default=None, help="only claims whose id matches this pytest -k expression; the report is partial")
    parser.add_argument("--machine-dependent", action="store_true",
                        help="only the claims whose outcome depends on the machine (a when: condition, or timed here); the report is partial")
    shown = parser.add_argument_group("what is printed (the report files always hold every claim that ran)")
    shown.add_argument("--all", action="store_true", help="list every claim, not only those that do not hold")
    shown.add_argument("--status", action="append", choices=_OUTCOMES, default=[], metavar="STATUS",
                       help=f"list the claims with this outcome (repeatable; one of {', '.join(_OUTCOMES)}); default: failed, invalid, refuted. "
                            "Of this run: verify runs the claims again and replaces the report; --last lists the last run's "
                            "without running a claim")
    shown.add_argument("-q", "--quiet", action="store_true", help="print only the summary line and where the report went")
    shown.add_argument("-v", "--verbose", action="store_true", help="whole truths and messages (a check's exception with its traceback), and every listed claim's inputs")
    shown.add_argument("--durations", type=_durations_count, nargs="?", const=10, default=None, metavar="N",
                       help="also print the N slowest claims (default 10; 0: every claim), each area's seconds and each phase's wall "
                            "seconds; report.json always holds every claim's seconds, run.seconds_by_area and run.phases")
    shown.add_argument("--json", action="store_true",
                       help="print one strict JSON object (counts, per-area counts, run, report files, and the claims --status selects; all by default)")
    parser.add_argument("--gpu-required", action="store_true", help="fail GPU claims instead of skipping them when no GPU is present")
    parser.add_argument("--report-dir", type=_report_dir, default=Path("reports"), help="where the report files go (default: reports/)")
    parser.add_argument("--workers", type=_workers_count, default=None, metavar="N",
                        help="run the claims in N processes forked from this one, then the timed and GPU claims alone in this one "
                             "(default: 2 on a Linux machine with 2 cores or more, else 1; 1: every claim in this process)")
    parser.add_argument("--no-cache", action="store_true",
                        help="measure every claim afresh: neither replay nor store the measurements an earlier verify made on this same "
                             "setup (same resacct source, packages, machine and settings; timed and GPU claims are always measured, "
                             "and forall claims' examples under --explore; RESACCT_NO_CACHE=1 does the same)")
    parser.add_argument("--explore", action="store_true",
                        help="draw new examples for every forall claim (Hypothesis' dev profile: 40 a claim, random, each measured) "
                             "instead of the 25 fixed ones a run draws by default (the ci profile: the same every run, so a verdict "
                             "repeats and a second run replays them); RESACCT_HYPOTHESIS_PROFILE=dev|ci chooses too")
    parser.add_argument("--no-roofline", action="store_true", help="skip measuring this machine's roofline for roofline.png (~1 s)")
    parser.add_argument("--no-timeline", action="store_true",
                        help="skip step-timeline.png: one training step's memory, predicted beside the CPU allocator's measurement (~1 s)")
    parser.add_argument("--last", action="store_true",
                        help="run nothing: list the last run's report in --report-dir (report.json) as that run printed it; "
                             "--status, --all, --durations, --json, -q and -v apply; exit 1 when a claim in it failed")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="REPORT_JSON", default=None,
                        help="run nothing: combine report.json files (e.g. one per tox env or machine) into a claims × environment matrix "
                             "(torch version · device · CPU bf16 kind)")
    parser.set_defaults(run=run_verify)


def _report_dir(text: str) -> Path:
    """``--report-dir``: a folder's name; an empty one (``''``, which Python reads as the current
    folder) is refused rather than filling the current folder with report files."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty; expected a folder for the report files, e.g. reports")
    return Path(text)


def _workers_count(text: str) -> int:
    from resacct.harness.worker_count import workers_count
    return workers_count(text)


def _durations_count(text: str) -> int:
    """``--durations N``: how many of the slowest claims to print (0: all of them)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number ≥ 0 (0 lists every claim)")
    return value




def _shown_statuses(args: argparse.Namespace) -> tuple[str, ...]:
    from resacct.reporting.terminal import DEFAULT_STATUSES

    if args.all:
        return _OUTCOMES
    return tuple(args.status) or DEFAULT_STATUSES


def _check_switch_variables() -> None:
    """Refuse a switch set to anything but 1 or 0, before pytest starts (exit 2, one line)."""
    from resacct.harness.pytest_settings import switch_variable_problems

    problems = switch_variable_problems()
    if problems:
        raise ResacctError("; ".join(problems))


def run_verify(args: argparse.Namespace) -> int:
    from resacct.harness.run import InterruptLatch

    if args.last:
        return _list_last_run(args)
    if args.merge:
        return run_merge(args.merge, args.report_dir, quiet=args.quiet, json_output=args.json)
    _check_switch_variables()
    from resacct.harness.pytest_settings import verify_examples_profile

    with verify_examples_profile(explore=args.explore), InterruptLatch().installed() as latch:
        return _run_verify(args, latch)


def _has_failures(document: dict[str, Any]) -> bool:
    """Whether a claim of the report failed or is invalid (verify's exit status 1, run or listed)."""
    return any(record.get("outcome") in {"failed", "invalid"} for record in document["claims"])


def _list_last_run(args: argparse.Namespace) -> int:
    """``--last``: the report in --report-dir printed as its run printed it; that run's exit status."""
    from resacct.cli._verify_last import last_report, refuse_run_options

    refuse_run_options(args)
    document, folder, files, note = last_report(args.report_dir)
    _print_result(args, document, folder, files)
    if not args.json:
        created = (document.get("environment") or {}).get("created") or "at an unknown time"
        print(f"(--last: nothing ran; this is the run of {created})" + (f"\n{note}" if note else ""))
    return 1 if _has_failures(document) else 0


def _run_verify(args: argparse.Namespace, latch: Any) -> int:
    """The run under ``latch``: Ctrl-C at any moment is 130 with the complete report kept — before the
    claims run (torch's import completes first), while they run (the finished ones go to a
    partial report), or after (nothing is published)."""
    from resacct.harness.phases import begin_run
    from resacct.reporting import ReportStaging
    from resacct.reporting.directory import REPORT_FILES_LISTED

    specs = args.specs or default_specs_dir()
    files = _claim_files(specs, args.area)
    pattern = _selection_pattern(args)
    staging = ReportStaging(args.report_dir)  # refuses a --report-dir that cannot be one before any claim runs
    started = time.monotonic()
    begin_run(started)
    try:
        if _whole_run_on_cores(args):
            from resacct.harness.early_ranks import start_forkserver_first

            start_forkserver_first()  # its imports on the second core while this one imports torch and collects (harness.early_ranks)
        with latch.deferred():
            _import_what_claims_need()
        if not (args.json or args.quiet):
            _print_machine_line()
        latch.check()
        with staging.writing():
            run, destination = _run_and_publish(args, latch, files, specs, pattern, staging, started)
    except BaseException:
        staging.discard()
        raise
    document = run.document
    files_written = [name for name in REPORT_FILES_LISTED if (destination / name).exists()]
    _print_result(args, document, destination, files_written)
    if run.interrupted:
        print(f"resacct verify: interrupted: the {len(document['claims'])} claims that finished are in {destination}/ (marked partial)",
              file=sys.stderr)
        return 130
    failed = _has_failures(document)
    return 1 if failed or run.exit_code not in (0, 1, 5) else 0


def _run_and_publish(args: argparse.Namespace, latch: Any, files: list[Path], specs: Path, pattern: str | None,
                     staging: Any, started: float) -> tuple[Any, Path]:
    from resacct.harness.phases import cpu_seconds, mark, run_clock
    from resacct.harness.run import run_claims
    from resacct.harness.worker_count import default_workers
    from resacct.reporting import write_report_files
    from resacct.reporting.durations import cpu_seconds_by_area, seconds_by_area

    from resacct.harness.replay import replaying

    workers = args.workers if args.workers is not None else default_workers()
    timeline_drawn = None if args.no_timeline else DrawnBeside(lambda: _write_step_timeline(staging.path))
    with replaying(args.no_cache) as stored_in:  # an earlier run's measurements on this same setup, judged afresh
        run = run_claims(files, staging.path, pattern=pattern, workers=workers, gpu_required=args.gpu_required,
                         show_progress=not (args.quiet or args.json), tracebacks=args.verbose, latch=latch,
                         beside_jobs=[timeline_drawn] if timeline_drawn is not None else [])
    document = run.document
    document["run"] = {
        "complete": not (args.area or pattern or run.interrupted),
        "interrupted": "Ctrl-C" if run.interrupted else False,
        "selection": {"areas": sorted(area.lower() for area in args.area), "pattern": pattern},
        "specs": str(Path(specs).resolve()),
        "rootdir": str(files[0].parent.parent.resolve()),
        "seconds": round(time.monotonic() - started, 1),
        "cpu_seconds": round(cpu_seconds(), 1),  # this process and the claims' workers: not the gloo ranks and children beside
        "seconds_by_area": seconds_by_area(document["claims"]),
        "cpu_seconds_by_area": cpu_seconds_by_area(document["claims"]),  # each claim's own process: honest beside neighbours
        "replayed": sum(1 for record in document["claims"] if record.get("replayed_from")),
        "measurements_stored_in": str(stored_in) if stored_in is not None else None,
    }
    roofline = None if args.no_roofline or run.interrupted else _write_roofline(staging.path)
    timeline = None if timeline_drawn is None or run.interrupted else timeline_drawn.path()  # with this process's threads, as the claims
    if roofline or timeline:
        mark("figures")
    document["run"]["phases"] = run_clock().phase_seconds()
    document["run"]["phase_cpu_seconds"] = run_clock().phase_cpu_seconds()
    if not run.interrupted:
        latch.check()  # a Ctrl-C that Python dropped after the last claim: nothing is published
    write_report_files(document, staging.path, roofline.read_bytes() if roofline else None, timeline.read_bytes() if timeline else None)
    return run, staging.publish(complete=document["run"]["complete"])


def _import_what_claims_need() -> None:
    """torch, pytest, hypothesis and the claims plugin, imported before the run (under the latch's
    ``deferred``: about a second, on a first run several)."""
    import hypothesis  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401

    import resacct.harness.plugin  # noqa: F401


def _whole_run_on_cores(args: argparse.Namespace) -> bool:
    """Whether this run is every shipped claim (its gloo launches included) on a machine of two cores
    or more that forks: the forkserver is then started before anything else."""
    return (args.specs is None and not args.area and not args.pattern and not args.machine_dependent and (args.workers or 2) >= 2
            and (os.cpu_count() or 1) >= 2 and sys.platform.startswith("linux"))


def _selection_pattern(args: argparse.Namespace) -> str | None:
    """The pytest -k expression: ``-k`` as given, and/or the machine-dependent claims' keyword."""
    from resacct.harness.plugin import MACHINE_DEPENDENT_KEYWORD

    if not args.machine_dependent:
        return args.pattern
    return f"{MACHINE_DEPENDENT_KEYWORD} and ({args.pattern})" if args.pattern else MACHINE_DEPENDENT_KEYWORD


def _print_machine_line() -> None:
    """The first line: the kind of machine every claim's ``when:`` is decided on (``resacct machine``
    shows it whole). A reader that already left (``| head -0``) stops the printing, not the run."""
    from resacct.measurement.machine_profile import this_machine

    line = f"machine: {this_machine().summary()}"
    width = output_width_columns()
    try:
        print(line if len(line) <= width else line[: width - 1] + "…", flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _print_result(args: argparse.Namespace, document: dict[str, Any], destination: Path, files_written: list[str]) -> None:
    from resacct.reporting import counts_by_area, evidence_summary, outcome_counts, replay_notice, run_notice, strict_json_text
    from resacct.reporting.durations import durations_text, slowest_claims
    from resacct.reporting.terminal import render_summary, summary_line

    diverted = destination.resolve() != Path(args.report_dir).resolve()
    moved = f"report: {destination}/ ({', '.join(files_written)})"
    if diverted:
        moved += f"\n  partial run: {Path(args.report_dir)}/ holds a complete report, which a partial run does not replace"
    if args.json:
        statuses = tuple(args.status) or _OUTCOMES
        totals = outcome_counts(document["claims"])
        fields = {
            "counts": {name: totals[name] for name in _OUTCOMES},
            "counts_by_area": {area: {name: counts[name] for name in _OUTCOMES} for area, counts in counts_by_area(document["claims"]).items()},
            "evidence": evidence_summary(document["claims"]),
            "complete": document["run"]["complete"],
            "notice": run_notice(document),
            "replayed": replay_notice(document),
            "run": document["run"],
            "environment": document["environment"],
            "report_dir": str(destination),
            "report_files": [str(destination / name) for name in files_written],
            "claims": [record for record in document["claims"] if record["outcome"] in statuses],
        }
        if args.durations is not None:
            fields["slowest"] = slowest_claims(document["claims"], args.durations)
        sys.stdout.write(strict_json_text(fields, non_finite="string"))
        return
    if args.quiet:
        print(summary_line(document, output_width_columns()))
        if document["run"].get("replayed"):  # the one line -q adds: how many were judged on stored measurements
            print(f"  {document['run']['replayed']} judged on this setup's stored measurements (--no-cache measures afresh)")
    else:
        print(render_summary(document, statuses=_shown_statuses(args), width=output_width_columns(), verbose=args.verbose))
    if args.durations is not None and document["claims"]:
        print(durations_text(document, args.durations))
    print(moved)


def output_width_columns() -> int:
    """100 columns, or a narrower terminal's width (at least 60). Output to a file or a pipe is
    100 columns wide unless ``COLUMNS`` says otherwise, whatever terminal the process came from."""
    if "COLUMNS" not in os.environ and not sys.stdout.isatty():
        return 100
    return max(60, min(shutil.get_terminal_size((100, 24)).columns, 100))


def _write_step_timeline(directory: Path) -> Path:
    """step-timeline.png: a training step's memory predicted beside measured (resacct.account.render.timeline_plot)."""
    from resacct.account.render.timeline_plot import write_reference_step_timeline_png

    return write_reference_step_timeline_png(directory / "step-timeline.png")


def _write_roofline(directory: Path) -> Path:
    """roofline.png: this machine's measured roofs with measured ops under them (resacct.measurement.measured_roofline)."""
    from resacct.measurement.measured_roofline import write_measured_roofline_png

    return write_measured_roofline_png(directory / "roofline.png")


def run_merge(paths: list[Path], report_dir: Path, quiet: bool = False, json_output: bool = False) -> int:
    """``--merge``: matrix.md and matrix.json in ``report_dir``; the table (or with ``json_output``
    one strict JSON object: the matrix, the count of rows that change, the files) on stdout."""
    from rich.console import Console
    from rich.table import Table

    from resacct.reporting import load_report, merge_reports, render_matrix_markdown, strict_json_text
    from resacct.reporting.documents import matrix_cell

    matrix = merge_reports([load_report(path) for path in paths])
    if report_dir.exists() and not report_dir.is_dir():
        raise ResacctError(f"report directory {str(report_dir)!r} is a file; --report-dir needs a directory resacct may create and write")
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "matrix.md").write_text(render_matrix_markdown(matrix), encoding="utf-8")
        (report_dir / "matrix.json").write_text(strict_json_text(matrix), encoding="utf-8")
    except OSError as error:
        raise ResacctError(f"report directory {str(report_dir)!r} cannot be written ({error.strerror or error}); "
                           "--report-dir needs a directory resacct may create and write") from None
    changed = [row for row in matrix["rows"] if row["changes"]]
    if json_output:
        print(strict_json_text({**matrix, "changed": len(changed),
                                "files": {"markdown": str(report_dir / "matrix.md"), "json": str(report_dir / "matrix.json")}}))
        return 0
    if not quiet:
        table = Table(title="claims × environments (rows whose status changes are marked ⚠)", title_justify="left")
        table.add_column("area")
        table.add_column("claim")
        for column in matrix["columns"]:
            table.add_column(column)
        for row in matrix["rows"]:
            cells = [matrix_cell(matrix, row, column) for column in matrix["columns"]]
            styled = [f"[{STATUS_STYLE.get(cell, 'dim')}]{cell}[/]" for cell in cells]
            table.add_row(row["area"], row["id"] + (" ⚠" if row["changes"] else ""), *styled)
        Console(width=max(Console().width, 120)).print(table)
    print(f"{len(matrix['rows'])} claims × {len(matrix['columns'])} environments; {len(changed)} change status. "
          f"Wrote {report_dir / 'matrix.md'} and {report_dir / 'matrix.json'}")
    return 0
