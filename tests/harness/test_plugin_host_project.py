"""Installing resacct must not change another project's pytest runs (issue 11).

A host project with its own Hypothesis profile keeps it: the plugin applies its settings per
claim item, never by loading a profile. Its terminal output is the same with the plugin as
without it, and the ``gpu`` marker's description says what the plugin does with user tests.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings

HOST_CONFTEST = """
    from datetime import timedelta

    from hypothesis import settings

    # parent: Hypothesis' own defaults, not whatever the process running pytester has loaded
    settings.register_profile("host", settings.get_profile("default"), max_examples=7, deadline=timedelta(milliseconds=123))
    settings.load_profile("host")
"""

HOST_TEST = """
    import json
    from pathlib import Path

    from hypothesis import given, settings, strategies as st

    calls = []


    @given(st.integers())
    def test_host_property(x):
        calls.append(x)


    def test_record_settings():
        current = settings.default
        Path("host_settings.json").write_text(json.dumps({
            "profile": settings.get_current_profile_name(),
            "max_examples": current.max_examples,
            "deadline_ms": current.deadline.total_seconds() * 1000,
            "suppress_health_check": [str(check) for check in current.suppress_health_check],
            "calls": len(calls),
        }))
"""


@pytest.fixture
def host_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project with its own profile (7 examples, 123 ms deadline); CI=true, where resacct's
    claims derandomise, so a leak of that setting would show too."""
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv("RESACCT_HYPOTHESIS_PROFILE", raising=False)
    pytester.makeconftest(textwrap.dedent(HOST_CONFTEST))
    pytester.makepyfile(test_host=textwrap.dedent(HOST_TEST))
    return pytester


@pytest.fixture
def keeps_current_profile():
    """In-process runs load the host's profile into this process: put ours back afterwards."""
    name = settings.get_current_profile_name()
    yield
    settings.load_profile(name)


def _comparable(output: list[str]) -> list[str]:
    """Terminal lines without what differs between any two runs: timings, the plugin list, paths."""
    lines = []
    for line in output:
        if line.startswith(("plugins:", "rootdir:", "cachedir:", "platform ")):
            continue
        lines.append(re.sub(r" in \d+\.\d+s", " in <t>", line))
    return lines


def test_host_profile_and_output_are_unchanged_by_the_plugin(host_project: pytest.Pytester, keeps_current_profile):
    with_plugin = host_project.runpytest("-p", "no:cacheprovider")
    recorded_with = json.loads((host_project.path / "host_settings.json").read_text())
    without_plugin = host_project.runpytest("-p", "no:cacheprovider", "-p", "no:resacct")
    recorded_without = json.loads((host_project.path / "host_settings.json").read_text())

    assert with_plugin.ret == 0, with_plugin.stdout.str()
    assert recorded_with == recorded_without
    assert recorded_with["profile"] == "host"
    assert recorded_with["max_examples"] == 7 and recorded_with["deadline_ms"] == 123
    assert recorded_with["suppress_health_check"] == []
    assert 1 <= recorded_with["calls"] <= 7
    assert _comparable(with_plugin.outlines) == _comparable(without_plugin.outlines)
    assert "resacct claims" not in with_plugin.stdout.str() and "claims:" not in with_plugin.stdout.str()


def test_claims_keep_their_own_settings_inside_a_host_project(host_project: pytest.Pytester, write_spec, keeps_current_profile, monkeypatch):
    monkeypatch.delenv("CI")
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: square-law
            says: x squared is x times x.
            measure: testing.square
            forall: {x: "integers(-500, 500)"}
            law: x*x
        """,
    )
    result = host_project.runpytest("--claims-json", "claims.json", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    (record,) = json.loads((host_project.path / "claims.json").read_text())["claims"]
    host = json.loads((host_project.path / "host_settings.json").read_text())
    assert record["outcome"] == "holds" and record["examples"] == 40  # resacct's dev setting, not the host's 7
    assert host["profile"] == "host" and host["max_examples"] == 7 and host["calls"] <= 7


GPU_USER_TEST = """
    import pytest


    @pytest.mark.gpu
    def test_user_gpu_test_runs():
        pass
"""


def test_the_plugin_registers_no_markers_and_leaves_user_tests_alone(pytester: pytest.Pytester, monkeypatch):
    """A host's --strict-markers means the same with resacct installed: its own unregistered
    ``gpu`` mark is still an error, and resacct's claims still carry (and select by) theirs."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RESACCT_REQUIRE_GPU", "1")
    pytester.makepyfile(test_user=textwrap.dedent(GPU_USER_TEST))
    markers = pytester.runpytest("--markers")
    assert not any(line.startswith(("@pytest.mark.gpu", "@pytest.mark.slow", "@pytest.mark.distributed")) for line in markers.stdout.lines)
    # In-process runs share pytest.mark's cache of the names it has seen registered (this repository registers
    # ``gpu``): emptied for the strict run, as a fresh process starts it (a subprocess here cost ~1.5 CPU s a run).
    monkeypatch.setattr(pytest.mark, "_markers", set())
    strict = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers")
    strict.stdout.fnmatch_lines(["*'gpu' not found in `markers` configuration option*"])
    pytester.makeini("[pytest]\nmarkers =\n    gpu: the host's own\n")  # a host registers its own marks
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    assert result.parseoutcomes().get("passed") == 1 and "skipped" not in result.parseoutcomes()  # resacct never skips a user's test


def test_claims_carry_their_marks_without_registering_them(pytester: pytest.Pytester, write_spec, monkeypatch):
    monkeypatch.setenv("RESACCT_RUN_SLOW", "1")  # this repository's quick tier (active in-process) would leave the slow claim out
    write_spec("demo.claims.yaml", """
        area: demo
        source: test
        claims:
          - id: slow-one
            says: s
            measure: testing.echo
            given: {value: 1}
            law: 1
            marks: [slow]
          - id: plain-one
            says: s
            measure: testing.echo
            given: {value: 1}
            law: 1
        """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "slow", "--collect-only", "-q")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*demo.claims.yaml::slow-one*"])
    assert not any("plain-one" in line for line in result.stdout.lines)


@pytest.mark.slow
def test_no_hypothesis_folder_is_left_where_the_run_started(pytester: pytest.Pytester, monkeypatch, tmp_path):
    """A fresh process, as `pytest --pyargs resacct` in a user's folder is: Hypothesis keeps its
    example database and its constants cache (``.hypothesis/constants``) in resacct's cache folder.
    Hypothesis writes the constants cache only when it happens to draw a local constant (random),
    so the host's conftest records where it would write while a claim runs."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("RESACCT_HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    pytester.path.joinpath("strides.claims.yaml").write_text(textwrap.dedent("""
        area: storage
        source: test
        claims:
          - id: strides-2d-row-major
            says: A contiguous rows×cols tensor skips cols elements to the next row and 1 to the next column.
            measure: tensors.strides
            forall: {d0: dim, d1: dim}
            law: "[d1, 1]"
        """), encoding="utf-8")
    pytester.makeconftest("""
        import contextlib
        from pathlib import Path

        import resacct.harness.plugin as plugin

        home = plugin.claims_hypothesis_home

        @contextlib.contextmanager
        def recorded_home():
            with home():
                from hypothesis.configuration import storage_directory

                where = storage_directory("constants")
                Path("hypothesis-constants-dir.txt").write_text(str(getattr(where, "path", where)))
                yield

        plugin.claims_hypothesis_home = recorded_home
        """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    assert result.ret == 0, result.stdout.lines[-5:]
    assert not (pytester.path / ".hypothesis").exists()
    constants = Path((pytester.path / "hypothesis-constants-dir.txt").read_text())
    assert constants == tmp_path / "cache" / "resacct" / "hypothesis" / "constants"
