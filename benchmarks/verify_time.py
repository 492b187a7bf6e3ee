"""Wall and CPU seconds of the whole `resacct verify`, this tree beside an older one (issue 34: ≤ 25 s idle).

    python benchmarks/verify_time.py                         # this tree, one run
    python benchmarks/verify_time.py --baseline 27b77d1      # and that commit's tree, the two taking turns
    python benchmarks/verify_time.py --baseline 27b77d1 --commit HEAD --rounds 2   # two commits' trees
    python benchmarks/verify_time.py --workers 1                            # verify's claims all in one process
    python benchmarks/verify_time.py --baseline fea76ea --area sharding --area peak_sharded   # a partial run of both trees
    python benchmarks/verify_time.py --warm --rounds 3       # this tree measuring every claim, and replaying its stored measurements
    python benchmarks/verify_time.py --warm --baseline 27b77d1 --rounds 3   # both trees replaying, each what its own first run stored

Every run measures every claim afresh (``RESACCT_NO_CACHE=1``) but the ``--warm`` runs, which replay what one untimed run stored
(resacct.harness.replay; timed and GPU claims are measured all the same; since session 33 a forall claim's examples, the same
every run under CI=true, replay one by one).

Each run is `resacct verify --quiet` in a fresh process (CI=true: hypothesis derandomized, so
every run draws the same examples) with its report in a temporary folder. Printed per run: wall
seconds; CPU seconds of the verify process itself (report.json's ``run.cpu_seconds``) and of
everything it started (gloo ranks, background children: every process under verify, read from /proc
every 0.2 s, since the forkserver they run under is killed unreaped); how busy the machine's CPUs were in each phase
of verify's run (/proc/stat every 0.25 s laid against report.json's ``run.phases``: where a core idles); the
claims and verdict counts, each area's seconds and those of the claims marked ``distributed`` (they
launch gloo ranks or children, in verify's phase alone). With ``--baseline`` the trees take turns round by round (load moves
both alike), each claim's outcome is compared between them (exit 1 if any differs), the claims
whose record differs in anything but its seconds (wall and CPU) are counted and named (timed claims' values move
from run to run), and the ratios of the medians are printed. ``--workers`` is passed to this tree's
verify only (verify's default: 2 processes on 2 cores; the baseline runs as its tree does). The machine's load average is printed before and after: on a
shared machine wall seconds are the load's as much as verify's, and CPU seconds are the steadier
figure. So is what the CPUs delivered: before and after the runs, two processes spinning at once against one alone
(benchmarks/core_throughput.py; ``--no-core-probe`` skips it) — on a VM two CPUs may do 1.3 × one CPU's work one
minute and 2 × the next. The bar is the issue's 25 s wall on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # core_throughput beside it, also where this file is loaded as a module
from core_throughput import print_probe  # noqa: E402  (what the CPUs delivered, printed before and after the runs)
BAR_SECONDS = 25.0
OUTCOMES = ("holds", "refuted", "skipped", "inconclusive", "failed", "invalid")


_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def _process_table() -> dict[int, tuple[int, float]]:
    """pid → (parent pid, CPU seconds so far: user + system) of every process /proc shows."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND)
    return table


def _watch_tree_cpu(root: int, seen: dict[int, float], stop: threading.Event) -> None:
    """Until ``stop``: the last CPU seconds of ``root`` and of every process under it, every 0.2 s. The
    gloo ranks and background children live under a forkserver that verify kills without reaping it,
    so RUSAGE_CHILDREN never counts them; this does (a process that lives under 0.2 s is missed)."""
    tree = {root}
    while not stop.wait(0.2):
        table = _process_table()
        grown = True
        while grown:
            grown = False
            for pid, (parent, _) in table.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grown = True
        for pid in tree:
            if pid in table:
                seen[pid] = table[pid][1]


def _machine_ticks() -> tuple[int, int]:
    """(all, idle) jiffies of every CPU together since boot (/proc/stat's first line; idle counts iowait too)."""
    with open("/proc/stat", encoding="utf-8") as file:
        values = [int(value) for value in file.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def _watch_machine_busy(started: float, samples: list[tuple[float, float]], stop: threading.Event) -> None:
    """Until ``stop``: every 0.25 s, (seconds since ``started``, the share of the machine's CPUs busy since the last sample)."""
    before = _machine_ticks()
    while not stop.wait(0.25):
        now = _machine_ticks()
        ticks, idle = now[0] - before[0], now[1] - before[1]
        before = now
        if ticks > 0:
            samples.append((time.perf_counter() - started, 1.0 - idle / ticks))


def busy_by_phase(samples: list[tuple[float, float]], phases: dict[str, float], cpus: int) -> list[tuple[str, float, float, float]]:
    """Per phase of verify's report (its seconds, in order, laid end to end from the process's start): (phase, seconds, CPUs busy
    on average — the whole machine's, whoever used them —, CPU-seconds left idle). A phase no sample fell in gets the nearest
    sample's share. The layout is approximate by the interpreter's start (~0.1 s) and the sampling step (0.25 s)."""
    rows = []
    start = 0.0
    for phase, seconds in phases.items():
        inside = [share for at, share in samples if start < at <= start + seconds]
        if not inside and samples:
            inside = [min(samples, key=lambda sample: abs(sample[0] - (start + seconds / 2)))[1]]
        busy = cpus * (sum(inside) / len(inside) if inside else 0.0)
        rows.append((phase, seconds, busy, seconds * (cpus - busy)))
        start += seconds
    return rows


def run_verify(tree: Path, extra: list[str], environment: dict[str, str] | None = None) -> dict[str, object]:
    """One `resacct verify` of ``tree``'s claims: wall and CPU seconds, outcome per claim. ``environment``: variables set for it
    (default: ``RESACCT_NO_CACHE=1``, every claim measured afresh — verify's stored measurements off, as in every figure before
    session 14)."""
    with tempfile.TemporaryDirectory() as report_dir:
        env = {**os.environ, "CI": "true", "PYTHONPATH": str(tree), **(environment if environment is not None else {"RESACCT_NO_CACHE": "1"})}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "resacct", "verify", "--quiet", "--report-dir", report_dir, *extra],
                                   cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        seen: dict[int, float] = {}
        samples: list[tuple[float, float]] = []
        stop = threading.Event()
        watchers = [threading.Thread(target=_watch_tree_cpu, args=(process.pid, seen, stop), daemon=True),
                    threading.Thread(target=_watch_machine_busy, args=(started, samples, stop), daemon=True)]
        for watcher in watchers:
            watcher.start()
        _, stderr = process.communicate()
        wall = time.perf_counter() - started
        stop.set()
        for watcher in watchers:
            watcher.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        completed = subprocess.CompletedProcess(process.args, process.returncode, "", stderr)
        report = Path(report_dir) / "report.json"
        if not report.exists():
            raise SystemExit(f"verify of {tree} wrote no report (exit {completed.returncode}): {completed.stderr.strip()[-400:]}")
        document = json.loads(report.read_text(encoding="utf-8"))
    reaped_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # verify and what it reaped
    own_cpu = float(document["run"].get("cpu_seconds") or 0.0)  # absent in trees before it was recorded
    total_cpu = max(reaped_cpu, sum(seen.values()))  # the watched tree: verify, the forkserver and everything under it
    outcomes = {record["id"]: record["outcome"] for record in document["claims"]}
    records = {record["id"]: {key: value for key, value in record.items() if key not in ("seconds", "cpu_seconds", "replayed_from")}
               for record in document["claims"]}
    return {"wall": wall, "cpu": total_cpu, "own_cpu": own_cpu, "outcomes": outcomes, "records": records, "exit": completed.returncode,
            "areas": document["run"].get("seconds_by_area") or {}, "replayed": int(document["run"].get("replayed") or 0),
            "launching": sum(float(record.get("seconds") or 0.0) for record in document["claims"] if "distributed" in (record.get("marks") or [])),
            "busy": busy_by_phase(samples, document["run"].get("phases") or {}, os.cpu_count() or 1)}


def commit_problem(commit: str) -> str | None:
    """Why ``commit`` names no commit of this repository (git's own words), or None."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True, text=True)
    return None if found.returncode == 0 else f"{commit!r} is not a commit of {ROOT} (git rev-parse found none): expected a hash, a branch or HEAD~N"


def refuse_unknown_commits(parser: argparse.ArgumentParser, **commits: str | None) -> None:
    """A usage error (exit 2) naming the first option whose value names no commit (``baseline="HEAD~1"``: ``--baseline``)."""
    for option, commit in commits.items():
        if commit is not None and (problem := commit_problem(commit)) is not None:
            parser.error(f"--{option} {problem}")


def tree_of(commit: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _line(name: str, run: dict[str, object]) -> str:
    counts = Counter(run["outcomes"].values())  # type: ignore[union-attr]
    verdicts = ", ".join(f"{counts[outcome]} {outcome}" for outcome in OUTCOMES if counts[outcome] or outcome in ("holds", "failed"))
    own = float(run["own_cpu"])  # type: ignore[arg-type]
    split = f" ({own:.1f} verify + {float(run['cpu']) - own:.1f} ranks/children)" if own else ""  # type: ignore[arg-type]
    areas = "; by area " + ", ".join(f"{area} {float(seconds):.1f} s" for area, seconds in sorted(run["areas"].items())) if run.get("areas") else ""  # type: ignore[union-attr]
    replayed = f"; {run['replayed']} replayed" if run.get("replayed") else ""
    busy = run.get("busy") or []
    phases = ("; CPUs busy by phase (the machine's): " + ", ".join(f"{phase} {seconds:.1f} s × {cpus:.2f}" for phase, seconds, cpus, _ in busy)  # type: ignore[union-attr]
              + f"; {sum(idle for *_, idle in busy):.1f} CPU-s idle") if busy else ""  # type: ignore[union-attr]
    return (f"{name:10s} {float(run['wall']):6.1f} s wall  {float(run['cpu']):6.1f} CPU s{split}  "  # type: ignore[arg-type]
            f"{len(run['outcomes'])} claims: {verdicts}{areas}; claims that launch ranks (phase alone) {float(run['launching']):.1f} s{replayed}{phases}")  # type: ignore[arg-type]


def python_without_resacct() -> str | None:
    """Why this Python cannot run resacct's verify (each run is ``sys.executable -m resacct verify``), or None: a
    system Python without torch failed every run with a traceback about torch, not about the command."""
    import importlib.util

    missing = [name for name in ("torch", "pytest", "hypothesis") if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"{sys.executable} has no {', '.join(missing)}: run this benchmark with the Python resacct is installed in, "
            f"e.g. .venv/bin/python benchmarks/verify_time.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="COMMIT", help="also run that commit's tree (git archive), taking turns")
    parser.add_argument("--commit", metavar="COMMIT", help="run that commit's tree as 'this tree' instead of the working tree (which others may be editing)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tree (default 1)")
    parser.add_argument("--workers", type=int, default=0, help="pass --workers N to this tree's verify (default: verify's own default)")
    parser.add_argument("--area", action="append", default=[], help="pass --area AREA to both trees' verify (repeatable): a partial run, "
                        "each area's seconds printed")
    parser.add_argument("--no-core-probe", action="store_true",
                        help="skip measuring what the CPUs deliver together before and after the runs (benchmarks/core_throughput.py, ~8 s)")
    parser.add_argument("--warm", action="store_true",
                        help="this tree cold (RESACCT_NO_CACHE=1) and warm (replaying the measurements one untimed run stored first in a "
                             "temporary cache folder: resacct.harness.replay) taking turns; with --baseline, both trees warm, taking turns")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more (runs of each tree), got {args.rounds}")
    if (problem := python_without_resacct()) is not None:
        parser.error(problem)
    refuse_unknown_commits(parser, baseline=args.baseline, commit=args.commit)
    selected = [option for area in args.area for option in ("--area", area)]
    extra = ["--workers", str(args.workers)] if args.workers else []
    print(f"load average before: {' '.join(f'{value:.1f}' for value in os.getloadavg())}  ({os.cpu_count()} CPUs)")
    print_probe("before", skip=args.no_core_probe)
    with tempfile.TemporaryDirectory() as folder:
        this = tree_of(args.commit, Path(folder) / "this") if args.commit else ROOT
        trees: dict[str, tuple[Path, list[str], dict[str, str] | None]] = {"this tree": (this, [*selected, *extra], None)}
        if args.baseline:
            trees = {args.baseline: (tree_of(args.baseline, Path(folder) / "baseline"), selected, None), **trees}
        if args.warm:
            stored = {"RESACCT_CACHE_DIR": str(Path(folder) / "cache")}
            if args.baseline:  # both trees warm, each replaying what its own untimed run stored (their setups differ)
                trees = {f"{args.baseline} warm": (trees[args.baseline][0], selected, stored), "warm": (this, [*selected, *extra], stored)}
            else:
                trees = {"cold": (this, [*selected, *extra], None), "warm": (this, [*selected, *extra], stored)}
            for tree, options, _ in trees.values() if args.baseline else [trees["warm"]]:
                print(_line("(filling)", run_verify(tree, options, stored)), flush=True)
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, (tree, options, environment) in trees.items():
                runs[name].append(run_verify(tree, options, environment))
                print(_line(name, runs[name][-1]), flush=True)
    print(f"load average after:  {' '.join(f'{value:.1f}' for value in os.getloadavg())}")
    print_probe("after", skip=args.no_core_probe)
    medians = {name: statistics.median(float(run["wall"]) for run in done) for name, done in runs.items()}  # type: ignore[arg-type]
    status = 0
    reference, subject = list(runs)[0], list(runs)[-1]
    if reference != subject:
        old, new = runs[reference][-1]["outcomes"], runs[subject][-1]["outcomes"]
        changed = sorted(claim for claim in set(old) | set(new) if old.get(claim) != new.get(claim))  # type: ignore[union-attr]
        cpu = {name: statistics.median(float(run["cpu"]) for run in done) for name, done in runs.items()}  # type: ignore[arg-type]
        print(f"{subject} / {reference}: wall {medians[subject] / medians[reference]:.2f}, "
              f"CPU {cpu[subject] / cpu[reference]:.2f} (medians of {args.rounds})")
        print(f"claims whose outcome differs: {len(changed)}" + (f" ({', '.join(changed[:10])})" if changed else ""))
        old_records, new_records = runs[reference][-1]["records"], runs[subject][-1]["records"]
        moved = sorted(claim for claim in set(old_records) & set(new_records) if old_records[claim] != new_records[claim])  # type: ignore[operator]
        print(f"claims whose record differs beyond its seconds (values, examples, messages): {len(moved)}" + (f" ({', '.join(moved[:12])})" if moved else ""))
        status = 1 if changed else 0
    for name in ([reference, subject] if args.warm else [subject]):
        best = medians[name]
        if args.area:  # the bar is the whole run's: a partial run meets nothing
            print(f"bar {BAR_SECONDS:.0f} s wall (idle, 2 cores) is the whole run's; {name} ran {', '.join(args.area)} only ({best:.1f} s)")
        else:
            print(f"bar {BAR_SECONDS:.0f} s wall (idle, 2 cores), {name}: {'met' if best <= BAR_SECONDS else 'not met'} here ({best:.1f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
