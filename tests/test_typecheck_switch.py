"""When the type-checking hook is on (root conftest.py, issue 34): everywhere but the plain quick tier
outside CI. It cost 33 of the quick tier's 145.5 CPU s (docs/suite_time.md); CI keeps it, so a
wrong shape, dtype or type still fails the gate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TYPECHECK_SKIP_REASON, typecheck_wanted

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("quick_tier", "environ", "wanted"), [
    (True, {}, False),  # `pytest` on a developer's machine
    (True, {"CI": "true"}, True),  # .ci/run's quick tier
    (True, {"CI": "1"}, True),
    (True, {"CI": "false"}, False),
    (False, {}, True),  # --run-slow, -m slow (.ci/run's slow tier), -k, a named file
    (True, {"RESACCT_TYPECHECK": "1"}, True),
    (False, {"RESACCT_TYPECHECK": "0", "CI": "true"}, False),  # the benchmarks' switch wins
])
def test_the_hook_is_off_only_in_the_plain_quick_tier(quick_tier: bool, environ: dict[str, str], wanted: bool) -> None:
    assert typecheck_wanted(quick_tier, environ) is wanted


def test_a_bad_switch_value_names_itself() -> None:
    with pytest.raises(pytest.UsageError, match=r"RESACCT_TYPECHECK='yes': expected 1 .*, 0 .* or unset"):
        typecheck_wanted(True, {"RESACCT_TYPECHECK": "yes"})


def test_ci_exports_ci_before_its_quick_tier() -> None:
    """The gate's quick tier runs under the hook because .ci/run exports CI=true before it."""
    script = (REPO / ".ci" / "run").read_text()
    export = script.index("export CI=true")
    quick_tier = re.search(r'^"\$VENV/bin/pytest" -n auto --dist loadgroup\s', script, flags=re.MULTILINE)
    assert quick_tier is not None, "the quick tier's command is no longer in .ci/run"
    assert export < quick_tier.start()


def _quick_tier_of(test_file: str, **environ: str) -> str:
    """`pytest` as the plain quick tier (no arguments: the testpaths), over one file."""
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "RESACCT_TYPECHECK", "RESACCT_RUN_SLOW", "PYTEST_ADDOPTS",
                                                            "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"}}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rs",
                             "-o", f"testpaths={test_file}"],
                            cwd=REPO, env=env | environ, capture_output=True, text=True, timeout=300)
    return result.stdout + result.stderr


@pytest.mark.slow
def test_ci_quick_tier_refuses_a_wrong_call_and_a_developers_skips_the_hook_tests() -> None:
    """tests/test_runtime_typing.py calls a model with a wrong shape, a wrong dtype and a list for a
    tensor: under CI=true the hook refuses each (the tests pass); without CI they skip, saying why."""
    under_ci = _quick_tier_of("tests/test_runtime_typing.py", CI="true")
    assert re.search(r"\b5 passed\b", under_ci) and "skipped" not in under_ci, under_ci[-3000:]
    developer = _quick_tier_of("tests/test_runtime_typing.py")
    assert re.search(r"\b5 skipped\b", developer) and "passed" not in developer, developer[-3000:]
    assert TYPECHECK_SKIP_REASON.split(":")[0] in developer
