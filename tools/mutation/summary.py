"""Print the counts of a finished ``mutmut run`` (run from its scratch directory) and the survivors.

Usage (by run.sh): python summary.py MODULE SECONDS MUTMUT_VERSION
Kill rate = (killed + timeout) / (killed + timeout + survived); mutants no test reaches ("no tests")
count as survivors, so they lower the rate too.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path


def main() -> int:
    module, seconds, version = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    stats_path = Path("mutants/mutmut-cicd-stats.json")
    if not stats_path.exists():
        print(f"no results: {stats_path} is missing (mutmut failed before testing mutants?)", file=sys.stderr)
        return 1
    stats = json.loads(stats_path.read_text())
    killed = stats["killed"] + stats["timeout"]
    survivors = stats["survived"] + stats["no_tests"]
    tested = killed + survivors
    rate = 100.0 * killed / tested if tested else 0.0
    from mutmut.__main__ import SourceFileMutationData, get_diff_for_mutant, walk_mutatable_files
    from mutmut.stats import status_by_exit_code

    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, exit_code in sorted(data.exit_code_by_key.items()):
            status = status_by_exit_code[exit_code]
            if status in {"survived", "no tests"}:
                print(f"# {name}: {status}")
                print(get_diff_for_mutant(name, path=path).rstrip())
                print()
    others = {k: v for k, v in stats.items() if k not in {"killed", "survived", "timeout", "no_tests", "total"} and v}
    print(
        f"== {datetime.date.today()} mutmut {version} resacct/{module}.py: total {stats['total']}, "
        f"killed {stats['killed']}, timeout {stats['timeout']}, survived {stats['survived']}, "
        f"no tests {stats['no_tests']}{', ' + str(others) if others else ''}; "
        f"kill rate {rate:.1f}% ({killed}/{tested}); {seconds} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
