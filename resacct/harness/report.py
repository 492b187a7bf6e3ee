"""The claims table printed at the end of a pytest run, and the JSON records behind it."""

from __future__ import annotations

import json
import platform
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

__all__ = ["OUTCOMES", "write_summary", "write_claims_json", "environment_fingerprint", "count_outcomes"]

OUTCOMES = ("holds", "refuted", "skipped", "failed", "invalid")


def count_outcomes(records: list[dict[str, Any]]) -> dict[str, Counter]:
    by_area: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        by_area[record.get("area") or "?"][record["outcome"]] += 1
    return dict(sorted(by_area.items()))


def write_summary(terminal: Any, records: list[dict[str, Any]]) -> None:
    by_area = count_outcomes(records)
    totals: Counter = sum(by_area.values(), Counter())
    terminal.section("resacct claims", sep="=")
    width = max(len("total"), *(len(area) for area in by_area))
    terminal.write_line("  ".join(["area".ljust(width)] + [name.rjust(7) for name in OUTCOMES]))
    for area, counts in by_area.items():
        terminal.write_line("  ".join([area.ljust(width)] + [str(counts[name]).rjust(7) for name in OUTCOMES]))
    terminal.write_line("  ".join(["total".ljust(width)] + [str(totals[name]).rjust(7) for name in OUTCOMES]))
    terminal.write_line(f"claims: {', '.join(f'{totals[name]} {name}' for name in OUTCOMES)}")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_fingerprint() -> dict[str, Any]:
    import datetime
    import os

    import torch
    from pytest_resacct import hypothesis_profile_name

    from resacct import __version__

    device = "cpu"
    device_name = _cpu_name()
    if torch.cuda.is_available():
        device = "cuda"
        device_name = torch.cuda.get_device_name(0)
    return {
        "resacct": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hypothesis_profile": hypothesis_profile_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "device_name": device_name,
    }


def write_claims_json(path: str | Path, records: list[dict[str, Any]]) -> None:
    document = {"environment": environment_fingerprint(), "claims": sorted(records, key=lambda r: (r["area"], r["path"] or "", r["line"] or 0))}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(target.suffix + ".tmp")
    temporary.write_text(json.dumps(document, indent=2, default=repr) + "\n", encoding="utf-8")
    temporary.replace(target)
