"""Issue 36, part A: the reproductions of round four of the reliability attacks, one test each.

Each test failed on main before its fix (a traceback, a hang, a wrong exit code, or a silently
accepted value); each now asserts one clear line and the right exit code, and that nothing is lost.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
import torch

from resacct.cli import main
from resacct.reporting.documents import format_value


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], status: int = 2) -> str:
    assert main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured
    return captured.err


# ── the crash: a law whose value is beyond a float ──

HUGE_LAW_SPEC = """\
area: huge
source: x.txt — "y"
claims:
  - id: huge-law
    says: A law whose value no float can hold.
    measure: dtypes.bits
    given: {dtype: float32}
    law: "10**128*10**128*10**128"
  - id: float32-has-32-bits
    says: float32 uses 32 bits.
    measure: dtypes.bits
    given: {dtype: float32}
    law: "32"
"""


def test_integers_beyond_a_float_are_written_like_the_others():
    assert format_value(10**384) == "1e+384"
    assert format_value(-(10**384)) == "-1e+384"
    assert format_value(123456789 * 10**400) == "1.23457e+408"
    assert format_value(999999999 * 10**400) == "1e+409"  # rounding carries into the exponent
    assert format_value(2**2000) == f"{Decimal(2**2000):.6g}" == "1.14813e+602"
    assert format_value(123456789012345) == f"{123456789012345:.6g}"  # within a float's range: as before


@pytest.mark.slow
@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_a_law_beyond_a_float_fails_its_claim_and_loses_no_other(tmp_path, capsys, json_output):
    spec = tmp_path / "huge.claims.yaml"
    spec.write_text(HUGE_LAW_SPEC, encoding="utf-8")
    report = tmp_path / "report"
    argv = ["verify", "--specs", str(spec), "--report-dir", str(report), "--no-roofline", "--no-timeline"]
    assert main(argv + (["--json"] if json_output else [])) == 1
    out = capsys.readouterr().out
    if json_output:
        printed = json.loads(out)
        assert printed["counts"]["holds"] == 1 and printed["counts"]["failed"] == 1
    else:
        assert "1e+384" in out and "1 holds" in out
    written = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert {claim["id"]: claim["outcome"] for claim in written["claims"]} == {"huge-law": "failed", "float32-has-32-bits": "holds"}
    assert "10**128*10**128*10**128 = 1e+384" in (report / "report.md").read_text(encoding="utf-8")
    assert "1e+384" in (report / "report.html").read_text(encoding="utf-8")


# ── numbers that hung or overflowed ──

LLAMA_SHAPE = ["--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--mlp", "11008", "--vocab", "32000"]


@pytest.mark.parametrize("targets", ["q_proj,v_proj", "all-linear", "o_proj,down_proj"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_lora_answers_any_depth_from_three_layers_exactly(targets, checkpointing):
    """The closed form over the layers equals the per-layer loop it replaces, byte for byte and
    FLOP for FLOP, at every depth the loop can still run."""
    import argparse

    from resacct.cli import lora
    from resacct.formulas.hf_formulas import HfArchitecture
    from resacct.formulas.lora import lora_step_flops

    chosen = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj") if targets == "all-linear" else tuple(targets.split(","))
    args = argparse.Namespace(rank=8, targets=chosen, seq=64, dropout=0.1, gradient_checkpointing=checkpointing)
    for layers in (1, 2, 3, 4, 7, 40):
        model = HfArchitecture(family="llama", vocab=128, hidden=64, layers=layers, heads=4, kv_heads=2, head_dim=16, mlp=96, positions=64)
        assert lora._activation_bytes(model, args, 3, "bfloat16") == lora._activation_bytes_looped(model, args, 3, "bfloat16")
        looped = lora_step_flops(model, rank=8, targets=chosen, batch=3, seq=64)
        for part in ("forward_flops", "backward_flops"):
            closed = lora._over_layers(model, lambda shallow, part=part: getattr(lora_step_flops(shallow, rank=8, targets=chosen, batch=3, seq=64), part))
            assert closed == getattr(looped, part), (layers, part)


def test_lora_with_9e15_layers_answers_at_once(capsys):
    import time

    started = time.perf_counter()
    assert main(["lora", "--layers", "9e15", *LLAMA_SHAPE, "--memory-gb", "80", "--json"]) == 0
    assert time.perf_counter() - started < 10  # looped over every layer, it never returned
    answer = json.loads(capsys.readouterr().out)
    assert answer["fits"] is False and answer["largest_batch"] == 0
    assert answer["adapter_parameters"] == 9 * 10**15 * 16 * (4096 + 4096 + 4096 + 1024)  # q: 4096→4096, v: 4096→1024


@pytest.mark.parametrize("argv", [
    ["infer", "--hf-config", "gpt2", "--context", "1024", "--memory-gb", "1e300"],
    ["infer", "--hf-config", "gpt2", "--context", "1024", "--memory-gb", "80", "--reserve-gb", "1e300"],
    ["lora", "--hf-config", "llama-2-7b", "--memory-gb", "1e300"],
    ["lora", "--hf-config", "llama-2-7b", "--memory-gb", "80", "--reserve-gb", "1e300"],
    ["fit", "--hf-config", "gpt2", "--memory-gb", "1e300"],
    ["fit", "--hf-config", "gpt2", "--memory-gb", "80", "--reserve-gb", "1e300"],
    ["memory", "--params", "7B", "--device-memory-gb", "1e300"],  # "inf" in its one line
    ["offload", "--params", "7B", "--largest-layer", "1e8", "--gpu-memory-gb", "1e300"],  # "memory: GPU inf GB"
    ["offload", "--params", "7B", "--largest-layer", "1e8", "--host-memory-gb", "1e300"],
], ids=lambda argv: " ".join(argv[:1] + argv[-2:]))
def test_memory_beyond_2_63_bytes_is_refused_before_any_work(capsys, argv):
    import time

    started = time.perf_counter()
    err = _one_line_error(capsys, argv)
    assert "is too large; expected at most 9.22e+09 GB" in err and "'1e300'" in err, err
    assert time.perf_counter() - started < 5  # fit --hf-config searched for 50 s before overflowing


@pytest.mark.slow
def test_a_timeout_shorter_than_starting_the_timer_is_one_line():
    import subprocess
    import sys

    launcher = Path(sys.executable).with_name("resacct")  # the console script, as a user runs it
    done = subprocess.run([str(launcher), "account", "--timeout", "1e-9"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done
    assert done.stderr.startswith("resacct account: error: --timeout 1e-09 s reached while") and "_TimeLimitReached" not in done.stderr
    assert "(at " not in done.stderr, done.stderr  # no user code ran: no frame (it named the launcher script)


def test_the_timeout_names_the_users_frame_never_a_library_or_the_launcher(monkeypatch):
    import sys

    from resacct.account.load.user_code import _user_location

    def frame_in(filename: str):
        namespace: dict = {}
        exec(compile("import sys\ndef here():\n    return sys._getframe()\n", filename, "exec"), namespace)
        return namespace["here"]()

    assert _user_location(frame_in("/home/me/train/model.py")) == "/home/me/train/model.py:3 in here"
    caller = f"{__file__}:"  # the frame that called the skipped one: this test's frame_in
    assert _user_location(frame_in("/venv/lib/python3.11/site-packages/transformers/modeling.py")).startswith(caller)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/resacct", "account"])
    assert _user_location(frame_in("/venv/bin/resacct")).startswith(caller)


@pytest.mark.parametrize(("fake", "fragment"), [
    ('{"physical_cores": ' + "9" * 5000 + "}", "RESACCT_FAKE_MACHINE holds a number of more than 4300 digits"),
    ("[" * 50_000 + "]" * 50_000, "RESACCT_FAKE_MACHINE nests arrays or objects deeper than Python's JSON reader goes (100,000 characters)"),
    ('{"physical_cores": ' + "[" * 50_000 + "]" * 50_000 + "}", "RESACCT_FAKE_MACHINE nests arrays or objects deeper"),
    ('{"gpu_memory_bytes": -1}', "RESACCT_FAKE_MACHINE: gpu_memory_bytes: expected a finite number ≥ 0 (a count, bytes or a load), got -1"),
    ('{"load_average_start": 1e999}', "RESACCT_FAKE_MACHINE: load_average_start: expected a finite number ≥ 0"),
], ids=["5000-digits", "50000-deep", "50000-deep-field", "negative-gpu-memory", "infinite-load"])
def test_a_hostile_fake_machine_is_one_line(capsys, monkeypatch, fake, fragment):
    from resacct.measurement.machine_profile import this_machine

    monkeypatch.setenv("RESACCT_FAKE_MACHINE", fake)
    this_machine.cache_clear()
    try:
        err = _one_line_error(capsys, ["machine"])
    finally:
        this_machine.cache_clear()
    assert err.startswith("resacct machine: error: " + fragment), err


# ── user code: a tree too deep to walk, a BaseException of its own, what it prints ──

HERE = "tests.test_reliability_round4:"


class _Wrap(torch.nn.Module):
    """One level of a deep tree whose forward does not recurse (the leaf is reached in a loop)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        module = self.inner
        while isinstance(module, _Wrap):
            module = module.inner
        return module(x)


def nested_model(levels: int = 5000) -> torch.nn.Module:
    model: torch.nn.Module = torch.nn.Linear(4, 4)
    for _ in range(levels - 1):
        model = _Wrap(model)
    return model


class _OwnBaseException(BaseException):
    pass


def raises_base_exception() -> torch.nn.Module:
    raise _OwnBaseException("the factory gave up")


class _RaisesBaseInForward(torch.nn.Linear):
    def forward(self, x):
        raise _OwnBaseException("the forward gave up")


def raises_base_exception_in_forward() -> torch.nn.Module:
    return _RaisesBaseInForward(4, 4)


@pytest.mark.slow
def test_a_model_nested_5000_modules_deep_is_one_line(capsys):
    err = _one_line_error(capsys, ["account", "--model", HERE + "nested_model", "--input-shape", "2,4"])
    assert f"the model from factory '{HERE}nested_model' nests modules 5,000 deep; expected at most 100" in err, err


@pytest.mark.slow
def test_a_model_100_modules_deep_is_accounted(capsys):
    assert main(["account", "--model", HERE + "nested_model", "--model-arg", "levels=100", "--input-shape", "2,4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 20


@pytest.mark.parametrize(("factory", "fragment"), [
    ("raises_base_exception", f"factory '{HERE}raises_base_exception' raised _OwnBaseException: the factory gave up (at "),
    ("raises_base_exception_in_forward", "the step of _RaisesBaseInForward (forward, loss or backward) raised _OwnBaseException: the forward gave up (at "),
])
def test_a_base_exception_of_the_users_own_is_one_line(capsys, factory, fragment):
    err = _one_line_error(capsys, ["account", "--model", HERE + factory, "--input-shape", "2,4"])
    assert fragment in err and "test_reliability_round4.py:" in err, err


# ── verify --merge: JSON when asked, a partial report's missing claims are no change ──


def _merge_input(version: str, outcomes: dict[str, str], *, complete: bool = True) -> dict:
    document = {"environment": {"torch": version, "device": "cpu", "machine": {"cpu_bf16_matmul": "amx"}},
                "claims": [{"id": claim, "area": "x", "says": "s", "outcome": outcome} for claim, outcome in outcomes.items()]}
    if not complete:
        document["run"] = {"complete": False, "interrupted": False, "selection": {"areas": [], "pattern": "a or b"}}
    return document


def test_merge_counts_no_change_for_claims_a_partial_report_did_not_run(tmp_path, capsys):
    from resacct.reporting import merge_reports, render_matrix_markdown

    complete = _merge_input("2.13.0", {"a": "holds", "b": "refuted", "c": "holds", "d": "holds"})
    partial = _merge_input("2.4.1", {"a": "holds", "b": "failed"}, complete=False)
    older = _merge_input("2.2.0", {"a": "holds", "b": "refuted", "c": "holds"})  # complete, without d: a change
    matrix = merge_reports([complete, partial, older])
    assert {row["id"]: row["changes"] for row in matrix["rows"]} == {"a": False, "b": True, "c": False, "d": True}
    markdown = render_matrix_markdown(matrix)
    assert markdown.startswith("# Claims across environments (torch version · device · CPU bf16 kind)")
    assert "| x | c | holds | not run | holds |" in markdown and "| x | d ⚠ | holds | not run | — |" in markdown
    paths = []
    for name, document in (("complete", complete), ("partial", partial)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(document), encoding="utf-8")
    assert main(["verify", "--merge", *map(str, paths), "--report-dir", str(tmp_path / "m"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)  # it printed the table
    assert printed["changed"] == 1 and printed["columns"] == ["torch 2.13.0 · cpu · bf16 amx", "torch 2.4.1 · cpu · bf16 amx (partial)"]
    assert printed["partial"] == ["torch 2.4.1 · cpu · bf16 amx (partial)"]
    assert printed["files"]["json"] == str(tmp_path / "m" / "matrix.json")
    assert json.loads((tmp_path / "m" / "matrix.json").read_text(encoding="utf-8"))["rows"] == printed["rows"]


class _PrintsInForward(torch.nn.Linear):
    def forward(self, x):
        print("the forward says hello")
        return super().forward(x)


def prints_everywhere() -> torch.nn.Module:
    print("the factory says hello")
    return _PrintsInForward(4, 4)


@pytest.mark.slow
def test_what_user_code_prints_goes_to_stderr_under_json(capsys):
    assert main(["account", "--model", HERE + "prints_everywhere", "--input-shape", "2,4", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["parameters"] == 20  # the prints made stdout invalid JSON
    assert "the factory says hello" in captured.err and "the forward says hello" in captured.err
    assert main(["account", "--model", HERE + "prints_everywhere", "--input-shape", "2,4"]) == 0
    assert "the factory says hello" in capsys.readouterr().out  # without --json, stdout as before
    assert main(["fit", "--model", HERE + "prints_everywhere", "--input-shape", "2,4", "--memory-gb", "0.001", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["largest"] > 1 and "the forward says hello" in captured.err  # fit --model --json alike


def test_file_descriptor_1_goes_to_stderr_under_json(capfd):
    import os

    from resacct.cli.output import user_output_to_stderr

    with user_output_to_stderr(True):
        os.write(1, b"from C\n")
        print("from Python")
    os.write(1, b"after\n")
    captured = capfd.readouterr()
    assert captured.out == "after\n" and captured.err == "from C\nfrom Python\n"


# ── specs: a when: range no machine is in ──

EMPTY_RANGE_SPEC = """\
area: when
source: x.txt — "y"
claims:
  - id: float32-has-32-bits
    says: float32 uses 32 bits.
    measure: dtypes.bits
    given: {dtype: float32}
    law: "32"

  - id: never-decided
    says: float32 uses 32 bits.
    measure: dtypes.bits
    given: {dtype: float32}
    when: {physical_cores: {at_least: 5, at_most: 1}}
    law: "32"
"""


def test_a_when_range_no_machine_is_in_is_a_schema_error_naming_file_line_and_claim(tmp_path):
    from resacct.harness.loader import load_claims_file

    path = tmp_path / "when.claims.yaml"
    path.write_text(EMPTY_RANGE_SPEC, encoding="utf-8")
    loaded = load_claims_file(path, display_path="when.claims.yaml")
    assert [claim.id for claim in loaded.claims] == ["float32-has-32-bits"]  # the other claim still runs
    assert [str(error) for error in loaded.errors] == [
        "when.claims.yaml:14: claim 'never-decided': when: physical_cores: at_least 5 is above at_most 1, a range no machine is in "
        "(the claim would never be decided)"]
    path.write_text(EMPTY_RANGE_SPEC.replace("at_least: 5, at_most: 1", "at_least: 1, at_most: 1"), encoding="utf-8")
    assert load_claims_file(path).errors == []  # a range of one value is fine


@pytest.mark.slow
@pytest.mark.parametrize("command", ["offload", "lora", "infer", "plan", "run"])
@pytest.mark.parametrize("name", ["bogus-rope", "padding-past-vocabulary", "bogus-layer-type"])
def test_a_config_transformers_refuses_is_refused(tmp_path, capsys, name, command):
    pytest.importorskip("transformers")
    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 512,
              "vocab_size": 1000, "max_position_embeddings": 128}
    config.update({"bogus-rope": {"rope_scaling": {"rope_type": "bogus", "factor": 2.0}}, "padding-past-vocabulary": {"pad_token_id": 99999},
                   "bogus-layer-type": {"layer_types": ["bogus", "bogus"]}}[name])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    extra = {"offload": [], "lora": [], "infer": [], "plan": ["--tp", "1", "--device", "h100"], "run": ["--tokens", "1B", "--device", "h100", "--devices", "8", "--mfu", "0.4"]}[command]
    err = _one_line_error(capsys, [command, "--hf-config", str(path), *extra])
    assert f"resacct {command}: error: config file '{path}': transformers" in err, err  # the closed form answered for it
    del config[{"bogus-rope": "rope_scaling", "padding-past-vocabulary": "pad_token_id", "bogus-layer-type": "layer_types"}[name]]
    path.write_text(json.dumps(config), encoding="utf-8")
    assert main([command, "--hf-config", str(path), *extra, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


# ── the Python API: checkpoints and account_model ──


@pytest.mark.slow
def test_checkpoint_parts_of_the_wrong_kind_are_one_line(tmp_path):
    """Run without the test suite's type-checking hook (which refuses model=42 itself): as a user
    calls it, save_checkpoint(model=42) raised a raw AttributeError."""
    import subprocess
    import sys

    script = f"""
import torch
from resacct.errors import CheckpointError
from resacct.training.checkpoint import load_checkpoint, save_checkpoint
path = {str(tmp_path / "c.pt")!r}
linear = torch.nn.Linear(2, 2)
for call in (lambda: save_checkpoint(path, model=42, optimizer=None, step=0),
             lambda: save_checkpoint(path, model=linear, optimizer=42, step=0),
             lambda: save_checkpoint(path, model=linear, optimizer=None, step=0, data=object()),
             lambda: load_checkpoint(path, model="model")):
    try:
        call()
    except CheckpointError as error:
        print(error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    path = tmp_path / "c.pt"
    assert done.stdout.splitlines() == [
        f"{path}: refusing to save: model is int 42; expected an nn.Module; nothing was written",
        f"{path}: refusing to save: optimizer is int 42, which has no state_dict(); expected None or an object with state_dict() "
        "(a torch optimizer, a loader's state, a GradScaler)",
        f"{path}: refusing to save: data is object " + done.stdout.splitlines()[2].split("data is object ")[1].split(",")[0]
        + ", which has no state_dict(); expected None or an object with state_dict() (a torch optimizer, a loader's state, a GradScaler)",
        f"{path}: refusing to load: model is str 'model'; expected an nn.Module; nothing was read",
    ]
    assert not path.exists()


# ── the environment switches and a truth's literal braces ──


@pytest.mark.parametrize("variable", ["RESACCT_REQUIRE_TIMING", "RESACCT_REQUIRE_GPU"])
@pytest.mark.parametrize("value", ["banana", "true", "2"])
def test_a_switch_variable_other_than_0_or_1_is_refused(capsys, monkeypatch, tmp_path, variable, value):
    monkeypatch.setenv(variable, value)
    err = _one_line_error(capsys, ["verify", "--area", "dtypes", "--report-dir", str(tmp_path / "r")])
    assert err.startswith(f"resacct verify: error: {variable}={value!r}: expected 1 (it fails the "), err
    assert not (tmp_path / "r").exists()


def test_double_braces_in_a_truth_are_literal_braces(tmp_path):
    from resacct.harness.loader import load_claims_file
    from resacct.harness.schema import fill_truth, truth_template_names

    assert fill_truth("{{measured}} is {measured}", {"measured": 2}) == "{measured} is 2"  # it read '{2} is 2'
    assert fill_truth("}}{{{measured:.1f}}}", {"measured": 2}) == "}{2.0}"
    assert truth_template_names("{{not_a_quantity}} and {measured}") == {"measured"}
    path = tmp_path / "braces.claims.yaml"
    path.write_text(HUGE_LAW_SPEC.replace('law: "10**128*10**128*10**128"', 'law: "31"\n    status: refuted\n    truth: "{{bogus_quantity}} is {measured}"'),
                    encoding="utf-8")
    assert load_claims_file(path).errors == []  # {{bogus_quantity}} names no quantity: not refused as an unknown one


def test_kinetos_start_stop_lines_are_dropped_and_nothing_else(capfd):
    import os

    from resacct.measurement.native_stderr import kineto_start_stop_lines_dropped

    with kineto_start_stop_lines_dropped():
        os.write(2, b"USDT:2026-11-28 06:09:43 3000:3000 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"[W kineto] a real warning\n")
        os.write(2, b"USDT:2026-11-28 06:09:43 3000:3000 SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
        os.write(2, b"USDT: something else kineto says\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "[W kineto] a real warning\nUSDT: something else kineto says\nafter\n"


@pytest.mark.slow
def test_a_kernel_probe_prints_nothing():
    """The first account_model printed 10 'USDT … profiler_start/stop' lines: one pair per kernel
    probe (torch's profiler, started and stopped around one op)."""
    import subprocess
    import sys

    script = """
import torch
from resacct.measurement.kernel_probe import _probe
from resacct.measurement.activation_recording import trace_allocations
left = torch.ones(64, 64, dtype=torch.bfloat16)
for _ in range(3):
    _probe(torch.ops.aten.mm.default, (left, left), {})
with trace_allocations() as trace:
    kept = torch.ones(1000)
print(trace.peak_bytes >= 4000)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "True\n", done
    assert "USDT" not in done.stderr and "profiler_st" not in done.stderr, done.stderr


@pytest.mark.parametrize(("keywords", "message"), [
    ({"batch": 0}, "batch 0 (int): expected a whole number ≥ 1 (sequences, or rows, per step)"),
    ({"batch": -3}, "batch -3 (int): expected a whole number ≥ 1"),
    ({"seq": 0}, "seq 0 (int): expected a whole number ≥ 1 (tokens per sequence), or None"),
    ({"input_shape": (0, 4)}, "input_shape (0, 4): expected a tuple of whole numbers ≥ 1, batch first"),
])
def test_account_model_refuses_sizes_below_one(keywords, message):
    import resacct
    from resacct.errors import ResacctError

    with pytest.raises(ResacctError) as error:  # batch=0 was accounted: a step of 0 FLOPs
        resacct.account_model(torch.nn.Linear(4, 4), **keywords)
    assert str(error.value).startswith(message), error.value


@pytest.mark.slow
def test_account_model_refuses_a_text_batch_and_a_tree_too_deep_in_one_line():
    """Without the suite's type-checking hook, as a user calls it: batch="8" raised a raw TypeError
    deep inside, a model nested 5000 deep a RecursionError."""
    import subprocess
    import sys

    script = f"""
import resacct, torch
from resacct.errors import ResacctError
from {__name__} import nested_model
for model, keywords in ((torch.nn.Linear(4, 4), {{"batch": "8"}}), (torch.nn.Linear(4, 4), {{"batch": True}}), (nested_model(5000), {{}})):
    try:
        resacct.account_model(model, **keywords)
    except ResacctError as error:
        print(error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["batch '8' (str): expected a whole number ≥ 1 (sequences, or rows, per step)",
                                        "batch True (bool): expected a whole number ≥ 1 (sequences, or rows, per step)",
                                        "the model _Wrap nests modules 5,000 deep; expected at most 100 (copying and walking the tree recurses "
                                        "once or more a level, and Python stops at 1000 nested calls: sys.setrecursionlimit raises it)"]


@pytest.mark.slow
def test_render_honours_columns_and_an_explicit_width(monkeypatch):
    import resacct

    report = resacct.account_model(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)), batch=2)

    def widest(text: str) -> int:
        return max(len(line.rstrip()) for line in text.splitlines())

    monkeypatch.delenv("COLUMNS", raising=False)
    assert 100 < widest(report.render()) <= 150  # not a terminal (pytest captures stdout): 150 as before
    monkeypatch.setenv("COLUMNS", "80")
    narrow = report.render()
    assert widest(narrow) <= 80 and "FlopCounterMode" in narrow  # it was 150 columns whatever the terminal
    assert widest(report.render(width=100)) <= 100
    assert widest(report.render(width=10)) <= 60  # at least 60: narrower tables are unreadable


# ── --help texts ──

from resacct.cli import COMMAND_MODULES  # noqa: E402


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_help_shows_no_restructuredtext_markup(command, capsys):
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    for markup in ("``", ":func:`", ":class:`", ":mod:`", ":meth:`", ":data:`", "**"):
        assert markup not in text, (markup, [line for line in text.splitlines() if markup in line][:3])


def test_help_keeps_the_words_of_the_markup(capsys):
    assert main(["lora", "--help"]) == 0
    text = capsys.readouterr().out
    assert "resacct lora: does LoRA (or QLoRA: --base nf4) fine-tuning" in text and "lora_saved_terms" in text


@pytest.mark.parametrize("value", ["banana", "true"])
def test_plain_pytest_refuses_a_switch_variable_other_than_0_or_1(pytester: pytest.Pytester, monkeypatch, value):
    """The same switches under plain pytest (a host project, CI): a usage error naming the
    variable, before any claim runs (it was taken as on, silently)."""
    monkeypatch.setenv("RESACCT_REQUIRE_TIMING", value)
    pytester.path.joinpath("one.claims.yaml").write_text(
        "area: dtypes\nsource: test\nclaims:\n  - id: one\n    says: one.\n    measure: dtypes.element_size\n"
        "    given: {dtype: float32}\n    law: 4\n", encoding="utf-8")
    # in-process runs (pytester.runpytest): the plugin's check reads the environment at configure time, as in a fresh process
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"RESACCT_REQUIRE_TIMING={value!r}: expected 1" in result.stderr.str()
    monkeypatch.setenv("RESACCT_REQUIRE_TIMING", "0")
    assert pytester.runpytest("-p", "no:cacheprovider", "-q").ret == 0
