"""cuBLAS/cuBLASLt workspaces in the CUDA prediction (issue 31): their sizes as PyTorch's source reads
them, which steps take which, where they go in the allocator model, the probe the GPU recorder runs to
confirm them, and the attention label of a model that runs eager attention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory
from resacct.account.gpu.allocator.library_workspaces import (
    cublas_workspace_bytes,
    cublaslt_workspace_bytes,
    probe_library_allocations,
    step_workspaces,
)
from resacct.errors import ResacctError
from resacct.facts.hardware import get_accelerator

MIB = 2**20


def test_workspace_sizes_follow_the_environment_as_torch_parses_it() -> None:
    # pytorch/pytorch#95668 saw 8,519,680 B left allocated by one nn.Linear forward on an A10G (sm86): ":4096:2:16:8"
    assert cublas_workspace_bytes(8, {}) == 8_519_680 == cublas_workspace_bytes(9, {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"})
    assert cublas_workspace_bytes(9, {}) == 32 * MIB and cublas_workspace_bytes(7, {}) == 8_519_680
    assert cublas_workspace_bytes(9, {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == 128 * 1024  # the deterministic setting cuBLAS documents
    assert cublas_workspace_bytes(8, {"CUBLAS_WORKSPACE_CONFIG": "garbage"}) == 8_519_680  # torch warns and keeps its default
    assert cublaslt_workspace_bytes(9, {}) == MIB and cublaslt_workspace_bytes(9, {"CUBLASLT_WORKSPACE_SIZE": "4096"}) == 4 * MIB
    # the unified size limit: never more than the cuBLAS workspace; with the unified workspace itself, no block at all
    assert cublaslt_workspace_bytes(9, {"CUBLASLT_WORKSPACE_SIZE": "65536"}) == 32 * MIB
    assert cublaslt_workspace_bytes(9, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}) == 0


def test_which_steps_take_which_workspaces() -> None:
    h100, a100 = get_accelerator("h100"), get_accelerator("a100")
    biased, plain = nn.Sequential(nn.Linear(8, 8)), nn.Sequential(nn.Linear(8, 8, bias=False))
    training = step_workspaces(biased, board=h100, backward=True, env={})
    assert training.sizes == (32 * MIB, 32 * MIB, MIB) and "backward thread" in training.blocks[1][0] and "cuBLASLt" in training.blocks[2][0]
    assert step_workspaces(plain, board=h100, backward=False, env={}).sizes == (32 * MIB,)
    assert step_workspaces(plain, board=a100, backward=True, env={}).sizes == (8_519_680, 8_519_680)
    none = step_workspaces(nn.Sequential(nn.ReLU()), board=h100, backward=True, env={})
    assert none.sizes == () and none.lines()[0].startswith("  cuBLAS workspaces: none")
    first, where = training.lines()
    assert first.startswith("  cuBLAS workspaces: 65 MiB in the peaks above = ") and "confirmed on an H200" in where  # sm90: the H200 record's probe
    assert "unconfirmed on a board" in step_workspaces(plain, board=a100, backward=True, env={}).lines()[1]  # sm80: PyTorch's source only
    assert training.lines(", on each rank")[0].endswith(", on each rank")  # a suffix ends the first line, not the source's
    with pytest.raises(ResacctError, match="tpu-v5p.*expected an NVIDIA board"):
        step_workspaces(biased, board=get_accelerator("tpu-v5p"), backward=True)


def _step(model: nn.Module, workspaces: tuple[int, ...]):  # type: ignore[no-untyped-def]
    return predict_cuda_step_memory(model, torch.randn(16, 64), lambda m, x: m(x).square().mean(), workspaces=workspaces)


def test_workspaces_are_kept_from_the_steps_start_in_the_allocator_model() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    bare, hopper = _step(model, ()), _step(model, (32 * MIB, 32 * MIB))
    # a 32 MiB block is a segment of its own, never freed: both peaks and the start grow by exactly its bytes
    assert hopper.start_allocated_bytes - bare.start_allocated_bytes == 64 * MIB
    assert hopper.peak_allocated_bytes - bare.peak_allocated_bytes == 64 * MIB == hopper.peak_reserved_bytes - bare.peak_reserved_bytes
    assert hopper.live_at_peak_bytes[:2] == [32 * MIB, 32 * MIB]
    # 8,519,680 B sits in a 20 MiB segment whose other 11.875 MiB later blocks may take: reserved grows by at most 20 MiB
    ampere = _step(model, (8_519_680,))
    assert ampere.peak_allocated_bytes - bare.peak_allocated_bytes == 8_519_680
    assert 0 <= ampere.peak_reserved_bytes - bare.peak_reserved_bytes <= 20 * MIB


def test_the_recorders_library_probe_runs_on_a_cpu() -> None:
    """The probe ``tools/gpu_record.py`` runs on the board (dry here: the same calls, no CUDA stats)."""
    probe = probe_library_allocations("cpu")
    assert [stage["stage"] for stage in probe["stages"]] == ["inputs", "first mm (cuBLAS)", "first linear with a bias (cuBLASLt)",
                                                             "first backward (autograd's device thread)"]
    assert all(stage["allocated"] is None for stage in probe["stages"]) and probe["trace"] == []
    assert set(probe["env"]) >= {"CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "TORCH_CUBLASLT_UNIFIED_WORKSPACE"}
    json.dumps(probe)


@pytest.mark.parametrize("model_type", ["bloom", "gemma2"])
def test_a_model_running_eager_attention_is_labelled_eager(model_type: str, tmp_path: Path) -> None:
    """Gemma-2 and BLOOM get transformers' eager attention (no sdpa there): the label said "sdpa's choice … (math)"."""
    pytest.importorskip("transformers")
    from resacct.account.load.hf_models import build_hf_model, load_hf_config

    config = {"model_type": model_type, "vocab_size": 128, "hidden_size": 32, "n_embed": 32, "n_layer": 1, "n_head": 2, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = build_hf_model(load_hf_config(str(path)), device="meta")
    assert model.config._attn_implementation == "eager"
    ids = torch.zeros(1, 8, dtype=torch.long)
    prediction = predict_cuda_step_memory(model, ids, lambda m, x: m(input_ids=x).logits.float().mean(), None)
    assert prediction.attention.startswith("eager") and "sdpa's choice" not in prediction.attention
    sdpa = nn.Sequential(nn.Linear(4, 4))
    assert predict_cuda_step_memory(sdpa, torch.zeros(2, 4), lambda m, x: m(x).sum(), None).attention.startswith("no sdpa call")
