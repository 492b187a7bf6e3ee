"""``resacct verify``: run every claim against this machine's PyTorch and print the claims table.

Runs pytest in-process with the claims plugin (jaxtyping's hook is left out: the CLI has
already imported resacct), shows a progress bar, prints one table per area and a summary
line, writes ``report.json`` into the report directory, and exits 1 when any claim failed
or is invalid (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

from resacct.errors import ResacctError

__all__ = ["register", "run_claims", "default_specs_dir"]

STATUS_STYLE = {"holds": "green", "refuted": "magenta", "skipped": "yellow", "failed": "bold red", "invalid": "bold red"}


def default_specs_dir() -> Path:
    """The claims shipped inside the package: ``resacct/specs/`` (a wheel, an editable install or a checkout)."""
    return Path(__file__).resolve().parents[1] / "specs"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check every claim against PyTorch and print the claims table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  resacct verify\n  resacct verify --area dtypes --area storage\n  resacct verify -k gpt3 --report-dir reports/",
    )
    parser.add_argument("--specs", type=Path, default=None, help="folder of *.claims.yaml files (default: the claims shipped with resacct)")
    parser.add_argument("--area", action="append", default=[], help="only this area (repeatable), e.g. dtypes")
    parser.add_argument("-k", dest="pattern", default=None, help="only claims whose id matches this pytest -k expression")
    parser.add_argument("--gpu-required", action="store_true", help="fail GPU claims instead of skipping them when no GPU is present")
    parser.add_argument("--report-dir", type=Path, default=Path("reports"), help="where report.json and pytest.log go (default: reports/)")
    parser.add_argument("--workers", type=int, default=0, help="run claims in N processes with pytest-xdist (default: 0, in this process)")
    parser.add_argument("--quiet", action="store_true", help="print only the summary line")
    parser.add_argument("--no-roofline", action="store_true", help="skip measuring this machine's roofline for roofline.png (~1 s)")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="REPORT_JSON", default=None,
                        help="run nothing: combine report.json files (e.g. one per tox env) into a claims × torch-version matrix")
    parser.set_defaults(run=run_verify)


def _claim_files(specs: Path, areas: list[str]) -> list[Path]:
    if not specs.is_dir():
        raise ResacctError(f"specs folder {str(specs)!r} does not exist; pass --specs PATH to a folder of *.claims.yaml files")
    files = sorted(specs.glob("*.claims.yaml"))
    if areas:
        wanted = {area.lower() for area in areas}
        known = sorted(path.name.removesuffix(".claims.yaml") for path in files)
        unknown = sorted(wanted - set(known))
        if unknown:
            from resacct.errors import UnknownNameError

            raise UnknownNameError("area", unknown[0], known)
        files = [path for path in files if path.name.removesuffix(".claims.yaml") in wanted]
    if not files:
        raise ResacctError(f"no *.claims.yaml files in {str(specs)!r}")
    return files


class _Progress:
    """pytest plugin that advances a rich progress bar as claims finish."""

    def __init__(self, progress: Any):
        self.progress = progress
        self.task = None

    def pytest_collection_finish(self, session: Any) -> None:
        self.task = self.progress.add_task("verifying claims", total=len(session.items))

    def pytest_runtest_logreport(self, report: Any) -> None:
        if self.task is not None and (report.when == "call" or (report.when == "setup" and not report.passed)):
            self.progress.advance(self.task)


def run_claims(files: list[Path], report_dir: Path, *, pattern: str | None = None, workers: int = 0,
               gpu_required: bool = False, show_progress: bool = True) -> tuple[int, dict[str, Any]]:
    """Run pytest on ``files``; returns (pytest exit code, the report document)."""
    import pytest
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / "report.json"
    json_path.unlink(missing_ok=True)
    rootdir = files[0].parent.parent
    args = [str(path) for path in files]
    args += ["-o", "addopts=", "--rootdir", str(rootdir), "-p", "no:cacheprovider", "-q", "--no-claims-summary", "--claims-json", str(json_path)]
    if pattern:
        args += ["-k", pattern]
    if workers:
        args += ["-n", str(workers)]
    previous = os.environ.get("RESACCT_REQUIRE_GPU")
    if gpu_required:
        os.environ["RESACCT_REQUIRE_GPU"] = "1"
    log = io.StringIO()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      transient=True, disable=not show_progress) as progress:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                exit_code = pytest.main(args, plugins=[_Progress(progress)])
    finally:
        if gpu_required:
            if previous is None:
                os.environ.pop("RESACCT_REQUIRE_GPU", None)
            else:
                os.environ["RESACCT_REQUIRE_GPU"] = previous
    (report_dir / "pytest.log").write_text(log.getvalue(), encoding="utf-8")
    if not json_path.exists():
        raise ResacctError(f"pytest ran no claims (exit {int(exit_code)}); see {report_dir / 'pytest.log'}")
    return int(exit_code), json.loads(json_path.read_text(encoding="utf-8"))


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def print_table(document: dict[str, Any], quiet: bool = False) -> dict[str, int]:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 170))
    records = document["claims"]
    totals = {name: 0 for name in STATUS_STYLE}
    for record in records:
        totals[record["outcome"]] += 1
    if not quiet:
        areas = sorted({record["area"] for record in records})
        for area in areas:
            table = Table(title=f"{area}", title_justify="left", show_lines=False, expand=False)
            longest_id = max(len(record["id"]) for record in records if record["area"] == area)
            table.add_column("claim", no_wrap=True, min_width=longest_id)  # ids are never broken: they are what people grep for
            for column in ("says", "law", "predicted", "measured", "status"):
                table.add_column(column, overflow="fold", max_width=48 if column == "says" else 30)
            for record in (r for r in records if r["area"] == area):
                outcome = record["outcome"]
                status = f"[{STATUS_STYLE[outcome]}]{outcome}[/]"
                if outcome in {"refuted"} and record.get("truth"):
                    status += f"\n[dim]{record['truth']}[/]"
                elif outcome in {"skipped", "failed", "invalid"} and record.get("message"):
                    status += f"\n[dim]{_cell(record['message'].splitlines()[0])}[/]"
                law = record.get("law") or _expect_text(record.get("expect"))
                if record.get("forall"):
                    law = f"{law}  (∀ {', '.join(record['forall'])}, {record.get('examples', 0)} examples)"
                table.add_row(record["id"], record.get("says") or "", law or "—", _cell(record.get("predicted")),
                              _cell(record.get("measured")), status)
            console.print(table)
    environment = document.get("environment", {})
    console.print(
        f"claims: {', '.join(f'{count} {name}' for name, count in totals.items())}"
        f"  (torch {environment.get('torch', '?')}, {environment.get('device', '?')}: {environment.get('device_name', '?')})"
    )
    return totals


def _expect_text(expect: dict[str, Any] | None) -> str:
    if not expect:
        return ""
    return ", ".join(f"{key} {value}" for key, value in expect.items())


def run_verify(args: argparse.Namespace) -> int:
    from resacct.reporting import write_report_directory

    if args.merge:
        return run_merge(args.merge, args.report_dir, quiet=args.quiet)
    files = _claim_files(args.specs or default_specs_dir(), args.area)
    if args.workers < 0:
        raise ResacctError(f"--workers must be 0 or more, got {args.workers}")
    exit_code, document = run_claims(files, args.report_dir, pattern=args.pattern, workers=args.workers,
                                     gpu_required=args.gpu_required, show_progress=not args.quiet)
    totals = print_table(document, quiet=args.quiet)
    written = write_report_directory(document, args.report_dir)
    roofline = None if args.no_roofline else _write_roofline(args.report_dir)
    names = ", ".join(str(path) for path in [*written.values(), *([roofline] if roofline else [])])
    print(f"report: {names} (pytest output: {args.report_dir / 'pytest.log'})")
    return 1 if totals["failed"] or totals["invalid"] or exit_code not in (0, 5) else 0


_ROOFLINE_OPERATIONS = [("copy", 2**22), ("add", 2**22), ("relu", 2**22), ("gelu", 2**20), ("matvec", 2048), ("matmul", 64), ("matmul", 256)]


def _write_roofline(directory: Path) -> Path:
    """roofline.png: this machine's measured roofs with the measured ops placed on them (~1 s)."""
    from resacct.perf import measure_ceilings, measure_operation, save_roofline_png

    ceilings = measure_ceilings(matmul_size=256, copy_bytes=32 * 2**20, thread_count=1, repeats=5)
    points = []
    for name, size in _ROOFLINE_OPERATIONS:
        measured = measure_operation(name, size, thread_count=1, repeats=3)
        if measured.intensity_flops_per_byte > 0:
            points.append((f"{name} {size}", measured.intensity_flops_per_byte, measured.achieved_flops_per_sec))
    target = directory / "roofline.png"
    save_roofline_png(str(target), ceilings.roofline, points, title="resacct verify: this machine's measured roofline")
    return target


def run_merge(paths: list[Path], report_dir: Path, quiet: bool = False) -> int:
    from rich.console import Console
    from rich.table import Table

    from resacct.reporting import load_report, merge_reports, render_matrix_markdown

    matrix = merge_reports([load_report(path) for path in paths])
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "matrix.md").write_text(render_matrix_markdown(matrix), encoding="utf-8")
    (report_dir / "matrix.json").write_text(json.dumps(matrix, indent=2) + "\n", encoding="utf-8")
    changed = [row for row in matrix["rows"] if row["changes"]]
    if not quiet:
        table = Table(title="claims × environments (rows whose status changes are marked ⚠)", title_justify="left")
        table.add_column("area")
        table.add_column("claim")
        for column in matrix["columns"]:
            table.add_column(column)
        for row in matrix["rows"]:
            cells = [row["outcomes"].get(column, "—") for column in matrix["columns"]]
            styled = [f"[{STATUS_STYLE.get(cell, 'dim')}]{cell}[/]" for cell in cells]
            table.add_row(row["area"], row["id"] + (" ⚠" if row["changes"] else ""), *styled)
        Console(width=max(Console().width, 120)).print(table)
    print(f"{len(matrix['rows'])} claims × {len(matrix['columns'])} environments; {len(changed)} change status. "
          f"Wrote {report_dir / 'matrix.md'} and {report_dir / 'matrix.json'}")
    return 0
