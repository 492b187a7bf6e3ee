"""Issue 32: the floor torch pyproject admits (2.4) must be green. What that torch lacks is a skip or
a one-line refusal naming the version, never a traceback. These tests make each missing piece
appear on any torch (by patching), so they fail on the newest torch too if the handling breaks."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.harness.registry import NotMeasurable
from resacct.measurement import torch_limits

_REQUIRES = ['huggingface-hub<2.0,>=1.3.0', 'torch>=2.6; extra == "torch"', 'accelerate>=1.1.0; extra == "torch"']


@pytest.fixture(autouse=True)
def _metadata_read_afresh():
    """transformers_unusable reads the distribution's metadata once a process: each test here fakes
    its own, so the read is forgotten before and after (the tests after read the real one)."""
    torch_limits._installed_transformers.cache_clear()
    yield
    torch_limits._installed_transformers.cache_clear()


def _fake_transformers(monkeypatch: pytest.MonkeyPatch, torch_version: str, requires: list[str] | None = None) -> None:
    monkeypatch.setattr(torch_limits.importlib.metadata, "version", lambda name: "5.24.0")
    monkeypatch.setattr(torch_limits.importlib.metadata, "requires", lambda name: _REQUIRES if requires is None else requires)
    monkeypatch.setattr(torch_limits.torch, "__version__", torch_version)


def test_transformers_under_an_older_torch_than_its_torch_extra_is_named_with_both_versions(monkeypatch):
    _fake_transformers(monkeypatch, "2.4.1+cu121")
    reason = torch_limits.transformers_unusable()
    assert reason is not None and "transformers 5.24.0" in reason and "torch>=2.6" in reason and "2.4.1+cu121" in reason


@pytest.mark.parametrize("version", ["2.6.0", "2.13.0+cpu", "2.14.0.dev20261101"])
def test_transformers_under_a_torch_its_extra_admits_is_usable(monkeypatch, version):
    _fake_transformers(monkeypatch, version)
    assert torch_limits.transformers_unusable() is None


def test_no_torch_requirement_or_no_transformers_is_not_a_version_problem(monkeypatch):
    _fake_transformers(monkeypatch, "2.4.1", requires=["huggingface-hub>=1.3"])
    assert torch_limits.transformers_unusable() is None

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(torch_limits.importlib.metadata, "version", missing)
    assert torch_limits.transformers_unusable() is None


def test_the_installed_transformers_is_judged_against_the_installed_torch():
    """Where transformers is installed here, the answer agrees with what transformers itself decides."""
    transformers = pytest.importorskip("transformers")
    assert (torch_limits.transformers_unusable() is None) == transformers.utils.is_torch_available()


REASON = "transformers 9.9.9 needs torch>=9.0 and this torch is 2.4.1 (transformers disables PyTorch under it); expected torch>=9.0 for the HF models"


@pytest.fixture
def unusable(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(torch_limits, "transformers_unusable", lambda: REASON)
    return REASON


def test_hf_claims_skip_naming_the_versions(unusable):
    from resacct.checks.finetune import lora_step
    from resacct.checks.hf import shipped_parameters, small_model
    from resacct.checks.offload import largest_module_parameters
    from resacct.checks.plan import hf_config_parameters

    for call in (lambda: shipped_parameters("gpt2"), lambda: small_model("llama", "parameters", 8, 1, 2, 8, 16),
                 lambda: hf_config_parameters("gpt2"), lambda: largest_module_parameters("gpt2"),
                 lambda: lora_step("trainable_parameters", 4, "q_proj", 16, 1, 2, 1, 32, 64)):
        with pytest.raises(NotMeasurable) as raised:
            call()
        assert str(raised.value) == unusable


def test_hf_commands_refuse_in_one_line_naming_the_versions(unusable, capsys):
    assert main(["account", "--hf-config", "gpt2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and unusable in err


def test_an_hf_peak_model_refuses_naming_the_versions(unusable):
    from resacct.account.peak.models import peak_model

    with pytest.raises(ResacctError, match="transformers 9.9.9 needs torch>=9.0"):
        peak_model("llama-sdpa", batch=1, seq=4)


def test_selective_checkpointing_is_refused_where_torch_lacks_it(monkeypatch):
    """torch 2.4 has no torch.utils.checkpoint.create_selective_checkpoint_contexts."""
    import torch.utils.checkpoint

    from resacct.account.peak.models import peak_model, selective_checkpointing_missing

    monkeypatch.delattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts", raising=False)
    assert f"torch {torch.__version__} has no torch.utils.checkpoint.create_selective_checkpoint_contexts" in selective_checkpointing_missing()
    with pytest.raises(ResacctError, match="create_selective_checkpoint_contexts"):
        peak_model("gpt-checkpointed-selective", batch=1, seq=4)
    model, inputs, loss_fn = peak_model("gpt-checkpointed-first-block", batch=1, seq=4)  # plain checkpointing needs no policy
    loss_fn(model, inputs).backward()


def test_the_phase_ranges_end_where_the_profiler_says():
    """torch 2.4's _KinetoEvent has no end_ns; the end is start + duration, equal to end_ns where it exists."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from resacct.measurement.memory_timeline import phase_ranges

    with profile(activities=[ProfilerActivity.CPU]) as recording:
        with record_function("resacct:forward"):
            torch.ones(64).sum()
    events = list(recording.profiler.kineto_results.events())
    (start, end, phase), = phase_ranges(events)
    assert phase == "forward" and end > start
    (event,) = [e for e in events if e.name() == "resacct:forward"]
    if hasattr(event, "end_ns"):
        assert end == event.end_ns()
