"""Ctrl-C at random moments of ``resacct verify`` (issue 26's bar): every try must exit 130, print
``interrupted``, show no traceback, and leave the complete report it started with unchanged.

A complete report (a run of one small claims file) is made once; each try copies it into a fresh
``reports/``, starts ``resacct verify --report-dir reports`` (every shipped claim unless VERIFY_ARGS
says otherwise), sends SIGINT after a random delay in [--from, --within] seconds, and checks the result.

    usage: .venv/bin/python tools/sigint_verify.py [--tries 20] [--within 10] [--from 0.1] [--seed N]
           [--resacct .venv/bin/resacct] [-- VERIFY_ARGS...]

Prints one line per try and a last line ``N of M tries: exit 130, 'interrupted', no traceback, report intact``;
exits 1 when any try fails the bar.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def _complete_report(resacct: str, into: Path) -> None:
    specs = _ROOT / "resacct" / "specs" / "dtypes.claims.yaml"
    done = subprocess.run([resacct, "verify", "-q", "--no-roofline", "--no-timeline", "--specs", str(specs), "--report-dir", str(into)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"could not make the starting report (exit {done.returncode}): {done.stderr.strip()[-500:]}")


def one_try(resacct: str, template: Path, delay_s: float, verify_args: list[str]) -> tuple[bool, str]:
    """Run, interrupt after ``delay_s``; (passed, one line that says what happened)."""
    with tempfile.TemporaryDirectory() as work:
        reports = Path(work) / "reports"
        shutil.copytree(template, reports)
        before = {path.name: path.read_bytes() for path in reports.iterdir()}
        process = subprocess.Popen([resacct, "verify", "--report-dir", str(reports), *verify_args],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work)
        time.sleep(delay_s)
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        after = {path.name: path.read_bytes() for path in reports.iterdir()}
    text = stderr.decode(errors="replace") + stdout.decode(errors="replace")
    traceback = "Traceback" in text
    said = "interrupted" in stderr.decode(errors="replace")
    passed = process.returncode == 130 and said and not traceback and before == after
    last = " / ".join(line.strip()[:120] for line in text.strip().splitlines()[-3:])
    line = (f"{delay_s:6.2f} s: exit {process.returncode}, {'interrupted' if said else 'NOT interrupted'}, "
            f"{'TRACEBACK' if traceback else 'no traceback'}, report {'intact' if before == after else 'CHANGED'}"
            f"{'' if passed else f'  <- {last!r}'}")
    if not passed:  # the whole story of a failed try, on stderr
        print("\n".join(["--- stderr:", *stderr.decode(errors="replace").splitlines()[-40:], "--- stdout:",
                         *stdout.decode(errors="replace").splitlines()[-15:], "---"]), file=sys.stderr)
    return passed, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--from", dest="earliest", type=float, default=0.1, help="earliest delay, seconds")
    parser.add_argument("--within", type=float, default=10.0, help="latest delay, seconds")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--resacct", default=str(_ROOT / ".venv" / "bin" / "resacct"))
    parser.add_argument("verify_args", nargs="*", help="arguments for resacct verify (after --)")
    args = parser.parse_args()
    chooser = random.Random(args.seed)
    passed = 0
    with tempfile.TemporaryDirectory() as work:
        template = Path(work) / "complete"
        _complete_report(args.resacct, template)
        for _ in range(args.tries):
            ok, line = one_try(args.resacct, template, chooser.uniform(args.earliest, args.within), args.verify_args)
            passed += ok
            print(line, flush=True)
    print(f"{passed} of {args.tries} tries: exit 130, 'interrupted', no traceback, report intact")
    return 0 if passed == args.tries else 1


if __name__ == "__main__":
    sys.exit(main())
