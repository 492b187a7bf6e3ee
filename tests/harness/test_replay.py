"""``resacct verify`` replays the measurements an earlier run stored on the same setup (resacct.harness.replay):
the check is not called again, the claim is judged afresh (an edited law fails on the stored value), the
report names what was replayed and when; ``--no-cache`` and ``RESACCT_NO_CACHE=1`` measure afresh and store
nothing; a forall claim's examples are replayed only where they repeat (the derandomised ``ci`` profile), never
``dev``'s new ones; a changed setup, a corrupt file or an outcome that does not read
back equal is measured again."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pickle
from pathlib import Path

import pytest

from resacct.cli import main
from resacct.harness import registry, replay
from resacct.harness.registry import Outcome

CLAIMS = """\
area: storage
source: a test of resacct verify's stored measurements
claims:
  - id: element-index-1-2-is-6
    says: In a 4×4 row-major matrix, element (1, 2) sits at index 1·4 + 2·1 = 6.
    measure: tensors.element_offset
    given: {{rows: 4, cols: 4, row_fraction: 0.25, col_fraction: 0.5}}
    law: "{law}"

  - id: strides-drawn
    says: A contiguous rows×cols tensor skips cols elements to the next row and 1 to the next column.
    measure: tensors.strides
    forall: {{d0: dim, d1: dim}}
    examples: 5
    law: "[d1, 1]"
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stored measurements on (the test suite turns them off) in a temporary folder; the ``dev`` Hypothesis profile
    whatever ``CI`` says (a forall claim draws new examples every run) unless a test sets ``ci``."""
    monkeypatch.delenv("RESACCT_NO_CACHE", raising=False)
    monkeypatch.setenv("RESACCT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RESACCT_HYPOTHESIS_PROFILE", "dev")
    return tmp_path / "cache" / "measurements"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Each call of the element-offset check, counted (the registry's entry wrapped for this test)."""
    seen: list[dict] = []
    original = registry.get_check("tensors.element_offset")

    @functools.wraps(original.function)  # the loader reads the check's signature through __wrapped__
    def counted(**inputs):
        seen.append(inputs)
        return original.function(**inputs)

    monkeypatch.setitem(registry._REGISTRY, "tensors.element_offset", dataclasses.replace(original, function=counted))
    return seen


def _verify(tmp_path: Path, law: str = "6", *options: str) -> tuple[int, dict, str]:
    specs = tmp_path / "specs"
    specs.mkdir(exist_ok=True)
    (specs / "storage.claims.yaml").write_text(CLAIMS.format(law=law), encoding="utf-8")
    report_dir = tmp_path / "reports"
    code = main(["verify", "--specs", str(specs), "--report-dir", str(report_dir), "--workers", "1", "--no-roofline", "--no-timeline", *options])
    document = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    return code, document, (report_dir / "report.md").read_text(encoding="utf-8")


def _record(document: dict, claim_id: str) -> dict:
    return next(record for record in document["claims"] if record["id"] == claim_id)


def test_the_second_run_judges_the_stored_measurement_without_measuring_it(tmp_path, cache, calls, capsys):
    code, first, _ = _verify(tmp_path)
    assert code == 0 and len(calls) == 1
    assert "replayed_from" not in _record(first, "element-index-1-2-is-6") and first["run"]["replayed"] == 0
    assert len(list(cache.glob("*/*.pickle"))) == 1  # the given claim's outcome; the forall claim's examples are not stored
    capsys.readouterr()

    code, second, markdown = _verify(tmp_path)
    out = capsys.readouterr().out
    assert code == 0 and len(calls) == 1  # the check was not called again
    replayed = _record(second, "element-index-1-2-is-6")
    assert replayed["outcome"] == "holds" and replayed["measured"] == _record(first, "element-index-1-2-is-6")["measured"] == 6
    assert replayed["replayed_from"][:4].isdigit() and "T" in replayed["replayed_from"]  # ISO 8601, when it was measured
    assert "replayed_from" not in _record(second, "strides-drawn") and _record(second, "strides-drawn")["examples"] == 5  # drawn again
    assert second["run"]["replayed"] == 1 and second["run"]["measurements_stored_in"] == str(next(cache.iterdir()))
    assert "1 of 2 claims were judged on the measurements an earlier run made on this same setup" in out
    assert "--no-cache" in out and "--no-cache" in markdown
    assert f"replayed: measured {replayed['replayed_from']}" in markdown  # beside the claim, in its evidence
    assert f"replayed: measured {replayed['replayed_from']}" in (tmp_path / "reports" / "report.html").read_text(encoding="utf-8")


def test_a_forall_claims_repeating_examples_are_replayed_one_by_one(tmp_path, cache, monkeypatch, capsys):
    """Under the derandomised ``ci`` profile a forall claim draws the same examples every run: each example's measurement is
    stored under its check and inputs and the next run judges them all without measuring; a note says the claim's
    examples ran through (what the next run's scheduling reads); the ``dev`` profile's examples are measured every run."""
    from resacct.harness.evaluate import FORALL_EXAMPLES_NOTE

    drawn: list[dict] = []
    original = registry.get_check("tensors.strides")

    @functools.wraps(original.function)
    def counted(**inputs):
        drawn.append(inputs)
        return original.function(**inputs)

    monkeypatch.setitem(registry._REGISTRY, "tensors.strides", dataclasses.replace(original, function=counted))
    monkeypatch.setenv("RESACCT_HYPOTHESIS_PROFILE", "ci")
    code, first, _ = _verify(tmp_path)
    examples = _record(first, "strides-drawn")["examples"]
    assert code == 0 and examples == len(drawn) == 5 and first["run"]["replayed"] == 0
    stored = list(cache.glob("*/*.pickle"))
    assert len(stored) == 1 + len({json.dumps(inputs, sort_keys=True) for inputs in drawn}) + 1  # the given claim, each example, the note

    code, second, _ = _verify(tmp_path)
    assert code == 0 and len(drawn) == 5  # not one example measured again
    record = _record(second, "strides-drawn")
    assert record["examples"] == 5 and record["replayed_from"] and record["outcome"] == "holds" and second["run"]["replayed"] == 2
    assert record["inputs"] == _record(first, "strides-drawn")["inputs"]  # the same example shown

    one_example = next(path for path in cache.glob("*/*.pickle") if '"check": "tensors.strides"' in pickle.loads(path.read_bytes())["key"])
    one_example.unlink()
    code, partly, _ = _verify(tmp_path)
    assert code == 0 and len(drawn) == 6  # the one example no longer stored, measured again
    assert "replayed_from" not in _record(partly, "strides-drawn") and partly["run"]["replayed"] == 1  # not all replayed: not "replayed"

    monkeypatch.setenv("RESACCT_HYPOTHESIS_PROFILE", "dev")
    code, third, _ = _verify(tmp_path)
    assert code == 0 and len(drawn) == 11 and "replayed_from" not in _record(third, "strides-drawn")  # new examples, measured
    keys = [pickle.loads(path.read_bytes())["key"] for path in cache.glob("*/*.pickle")]
    assert sum(f'"check": "{FORALL_EXAMPLES_NOTE}"' in key and '"claim": "strides-drawn"' in key for key in keys) == 1  # the ci run's note


def test_an_edited_law_is_judged_afresh_against_the_stored_measurement(tmp_path, cache, calls, capsys):
    assert _verify(tmp_path)[0] == 0
    code, document, _ = _verify(tmp_path, "7")  # the spec now says 7; the stored measurement says 6
    assert code == 1 and len(calls) == 1
    record = _record(document, "element-index-1-2-is-6")
    assert record["outcome"] == "failed" and record["measured"] == 6 and record["replayed_from"]


@pytest.mark.parametrize("how", ["--no-cache", "RESACCT_NO_CACHE=1"])
def test_no_cache_measures_every_claim_afresh_and_stores_nothing(tmp_path, cache, calls, monkeypatch, how):
    options = [how] if how.startswith("--") else []
    if not options:
        monkeypatch.setenv("RESACCT_NO_CACHE", "1")
    assert _verify(tmp_path, "6", *options)[0] == 0
    code, document, _ = _verify(tmp_path, "6", *options)
    assert code == 0 and len(calls) == 2 and document["run"]["replayed"] == 0 and document["run"]["measurements_stored_in"] is None
    assert not cache.exists()


def test_a_corrupt_stored_file_is_measured_again_and_rewritten(tmp_path, cache, calls):
    _verify(tmp_path)
    [stored] = cache.glob("*/*.pickle")
    stored.write_bytes(stored.read_bytes()[:20])  # truncated
    code, document, _ = _verify(tmp_path)
    assert code == 0 and len(calls) == 2 and "replayed_from" not in _record(document, "element-index-1-2-is-6")
    assert _verify(tmp_path)[1]["run"]["replayed"] == 1 and len(calls) == 2  # the rewritten file is read back


def test_a_changed_setup_measures_again(tmp_path, cache, calls, monkeypatch):
    _verify(tmp_path)
    import os

    other = "SSE41" if os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2" else "AVX2"  # another value than this run's (the AVX2-capped kind sets it)
    replay.setup_fingerprint.cache_clear()
    try:
        with monkeypatch.context() as changed:
            changed.setenv("ONEDNN_MAX_CPU_ISA", other)  # steers torch's kernels: another setup
            code, document, _ = _verify(tmp_path)
    finally:
        replay.setup_fingerprint.cache_clear()
    assert code == 0 and len(calls) == 2 and document["run"]["replayed"] == 0
    assert len(list(cache.iterdir())) == 2  # one folder per setup


def test_the_key_names_the_check_its_inputs_and_the_thread_count(monkeypatch):
    import torch

    base = replay.replay_key("tensors.element_offset", {"rows": 4, "cols": 4})
    assert base == replay.replay_key("tensors.element_offset", {"cols": 4, "rows": 4})  # order of the inputs is not a difference
    assert base != replay.replay_key("tensors.element_offset", {"rows": 4, "cols": 5})
    assert base != replay.replay_key("tensors.strides", {"rows": 4, "cols": 4})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert base != replay.replay_key("tensors.element_offset", {"rows": 4, "cols": 4})
    finally:
        torch.set_num_threads(threads)
    assert replay.setup_fingerprint() in base


def test_the_setup_leaves_out_the_moment_and_the_cache_switches(monkeypatch):
    environment = replay._steering_environment()
    assert "RESACCT_CACHE_DIR" not in environment and "RESACCT_NO_CACHE" not in environment and "RESACCT_HYPOTHESIS_PROFILE" not in environment
    for name, value in (("OMP_NUM_THREADS", "1"), ("LD_LIBRARY_PATH", "/opt/other"), ("PYTHONPATH", "/tmp/another-tree")):
        monkeypatch.setenv(name, value)
        assert replay._steering_environment()[name] == value
    assert "load_average_start" not in replay._machine()["profile"] and "cpu_isa" in replay._machine()["profile"]


def test_an_outcome_that_does_not_read_back_equal_is_not_stored(tmp_path, cache):
    with replay.replaying(False, folder=tmp_path):
        assert replay.store_measurement("tensors.element_offset", {"rows": 1}, Outcome(measured=6, predicted=6))
        assert not replay.store_measurement("tensors.element_offset", {"rows": 2}, Outcome(measured=math.nan))
        assert not replay.store_measurement("tensors.element_offset", {"rows": 3}, Outcome(measured=lambda: 6))
        assert replay.stored_measurement("tensors.element_offset", {"rows": 1}).outcome == Outcome(measured=6, predicted=6)
        assert not replay.stored_measurement("tensors.element_offset", {"rows": 1}).earlier  # this run stored it
        assert replay.stored_measurement("tensors.element_offset", {"rows": 2}) is None
    with replay.replaying(False, folder=tmp_path):  # the next run: measured earlier
        assert replay.stored_measurement("tensors.element_offset", {"rows": 1}).earlier
    assert replay.replay_folder() is None  # off outside the block


def test_only_the_setups_used_last_are_kept_and_nothing_else_is_touched(tmp_path, cache):
    import os

    for number in range(5):
        (tmp_path / f"{number:032x}").mkdir()
        os.utime(tmp_path / f"{number:032x}", (1_000_000 + number, 1_000_000 + number))
    (tmp_path / "a-folder-of-the-users").mkdir()  # not a setup's name: never removed
    with replay.replaying(False, folder=tmp_path) as folder:
        replay.store_measurement("tensors.element_offset", {"rows": 1}, Outcome(measured=6))
    assert folder is not None and folder.exists()
    left = sorted(path.name for path in tmp_path.iterdir() if path.is_dir())
    assert left == sorted([folder.name, f"{4:032x}", f"{3:032x}", "a-folder-of-the-users"])  # the 2 used last besides this one


def test_quiet_and_json_say_how_many_were_replayed(tmp_path, cache, calls, capsys):
    _verify(tmp_path)
    capsys.readouterr()
    assert _verify(tmp_path, "6", "-q")[0] == 0
    quiet = capsys.readouterr().out.splitlines()
    assert quiet[0].startswith("claims: 2 holds") and quiet[1] == "  1 judged on this setup's stored measurements (--no-cache measures afresh)"
    assert _verify(tmp_path, "6", "--json")[0] == 0
    fields = json.loads(capsys.readouterr().out)
    assert fields["run"]["replayed"] == 1 and fields["replayed"].startswith("1 of 2 claims were judged on the measurements")
    assert _verify(tmp_path, "6", "--json", "--no-cache")[0] == 0
    assert json.loads(capsys.readouterr().out)["replayed"] is None


def test_a_cache_folder_that_cannot_be_written_still_verifies_every_claim(tmp_path, monkeypatch, calls):
    """RESACCT_CACHE_DIR naming a file (nothing can be made under it): every claim is measured, none stored, the run passes."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.delenv("RESACCT_NO_CACHE", raising=False)
    monkeypatch.setenv("RESACCT_CACHE_DIR", str(blocker))
    for _ in range(2):
        code, document, _ = _verify(tmp_path)
        assert code == 0 and document["run"]["replayed"] == 0
    assert len(calls) == 2 and blocker.read_text() == "not a folder"


def test_the_checks_of_recorded_gpu_truth_key_their_record_files_contents():
    """A GPU record may be named by an absolute path outside resacct's files (not in the setup's hash): each of those checks
    adds the record file's sha256 to its key (until session 25 they opted out of replay)."""
    from resacct.account.gpu.records.recorded import record_contents

    checks = registry.all_checks()
    recorded = {name: check for name, check in checks.items() if name.startswith("gpu_recorded.")}
    inputs = {"record": "docs/gpu/2026-11-30-h200-record.json.gz", "step": "hf-gpt2/fp32/serve"}
    digest = record_contents(inputs)["record_sha256"]
    assert recorded and digest and all(callable(check.replay) and check.replay(inputs)["record_sha256"] == digest for check in recorded.values())
    # the prefill priced by the record's calibration: keyed by that file's contents too (a calibration fitted again is measured again)
    calibrated = recorded["gpu_recorded.board_prefill_time_calibrated"].replay(inputs)
    assert calibrated["calibration_sha256"] and calibrated["calibration_sha256"] != digest
    assert all(check.replay for name, check in checks.items() if name.startswith(("flops.", "hf.", "peak.")))


def test_measurements_sit_beside_the_trace_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("RESACCT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert replay.measurements_dir() == tmp_path / "xdg" / "resacct" / "measurements"
    monkeypatch.setenv("RESACCT_CACHE_DIR", str(tmp_path / "mine"))
    assert replay.measurements_dir() == tmp_path / "mine" / "measurements"


def test_a_check_keyed_by_a_files_contents_is_measured_again_when_the_file_changes(tmp_path, cache, calls, monkeypatch, capsys):
    """``replay=f`` (the recorded claims: the record file's sha256, resacct.account.gpu.records.recorded.record_contents): replayed
    while ``f`` answers the same, measured again once the file it reads changed."""
    evidence = tmp_path / "record.json"
    evidence.write_text("first", encoding="utf-8")
    counted = registry.get_check("tensors.element_offset")
    monkeypatch.setitem(registry._REGISTRY, "tensors.element_offset",
                        dataclasses.replace(counted, replay=lambda inputs: {"evidence": evidence.read_text(encoding="utf-8")}))
    assert _verify(tmp_path)[0] == 0 and len(calls) == 1
    code, again, _ = _verify(tmp_path)
    assert code == 0 and len(calls) == 1 and "replayed_from" in _record(again, "element-index-1-2-is-6")
    evidence.write_text("second", encoding="utf-8")
    code, changed, _ = _verify(tmp_path)
    assert code == 0 and len(calls) == 2 and "replayed_from" not in _record(changed, "element-index-1-2-is-6")


def test_a_recorded_claims_key_holds_its_record_files_sha256(tmp_path):
    import hashlib

    from resacct.account.gpu.records.recorded import record_contents

    record = tmp_path / "board.json.gz"
    record.write_bytes(b"a record")
    assert record_contents({"record": str(record)}) == {"record_sha256": hashlib.sha256(b"a record").hexdigest()}
    assert record_contents({"record": str(tmp_path / "missing.json")}) == {"record_sha256": None}
    assert registry.get_check("gpu_recorded.board_step_peak").replay_inputs({"record": str(record), "step": "s"})["replay_key"] == \
        {"record_sha256": hashlib.sha256(b"a record").hexdigest()}


def test_is_stored_asks_for_the_file_of_this_setup_and_thread_count(tmp_path, cache):
    import torch

    inputs = {"rows": 4, "cols": 4, "row_fraction": 0.25, "col_fraction": 0.5}
    threads = torch.get_num_threads()
    assert not replay.is_stored("tensors.element_offset", inputs, threads=threads)  # replaying is off outside verify
    with replay.replaying(False, folder=tmp_path):
        assert not replay.is_stored("tensors.element_offset", inputs, threads=threads)
        assert replay.store_measurement("tensors.element_offset", inputs, Outcome(measured=6))
        assert replay.is_stored("tensors.element_offset", inputs, threads=threads)
        assert not replay.is_stored("tensors.element_offset", inputs, threads=threads + 1)  # a worker's one thread is another key
        assert not replay.is_stored("tensors.element_offset", {**inputs, "rows": 5}, threads=threads)
