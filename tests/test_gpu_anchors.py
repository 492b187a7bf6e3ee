"""benchmarks/gpu_anchors.py (issue 31): torch's MemTracker and RuntimeEstimator run on the record's
smallest step — the anchors docs/gpu.md sets beside resacct's predictions and the H100 record."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_anchors.py"


def _needs(module: str) -> pytest.MarkDecorator:
    """Skip where this torch has no ``module`` (torch 2.4.1 has neither anchor's)."""
    import torch

    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return pytest.mark.skipif(not found, reason=f"torch {torch.__version__} has no {module}")


@pytest.fixture(scope="module")
def anchors():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_anchors", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@_needs("torch.distributed._tools.mem_tracker")
def test_memtracker_sees_the_recorded_forward_backward_within_one_percent(anchors) -> None:  # type: ignore[no-untyped-def]
    from resacct.account.gpu.records.recorded import load_gpu_record, recorded_value
    from resacct.training.gpt import get_gpt_config

    tiny = {key: value for key, value in vars(get_gpt_config("gpt-tiny")).items() if key != "attention"}
    tracked = anchors.memtracker_peak_above_start(tiny, 8, 128, optimizer=False)
    recorded = recorded_value(anchors.RECORD, load_gpu_record(anchors.RECORD), "gpu_claims", "gpu-step-peak-predicted")
    assert recorded == 56_240_128
    assert tracked == pytest.approx(recorded, rel=0.01) and tracked != recorded  # unrounded CPU bytes: not the allocator's blocks


@_needs("torch.utils._runtime_estimation")
def test_runtime_estimator_runs_on_fake_tensors_with_the_datasheet_as_its_device(anchors) -> None:  # type: ignore[no-untyped-def]
    from resacct.training.gpt import get_gpt_config

    tiny = {key: value for key, value in vars(get_gpt_config("gpt-tiny")).items() if key != "attention"}
    estimated = anchors.runtime_estimator_ms(tiny, 8, 128)
    assert 0.05 < estimated < 10.33  # a roofline of the GPU's work alone: below the host-bound 10.33 ms the H100 took
