"""Where CUDA's flash kernel refuses a call, sdpa runs the memory-efficient one — and so do resacct's CUDA predictions
(``resacct/account/gpu/tracing/cuda_step.py``, ``flash_refusal``): a head size over 256 anywhere; in training on sm86/89 (A10,
L4, RTX 4090) and sm120/121, a head size in (192, 224], or over 224 with dropout (PyTorch's sdp_utils.cpp,
``check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120``). A board's compute capability comes from
the datasheet table (``compute_capability``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from resacct.account.gpu.tracing.cuda_step import flash_refusal, predict_cuda_step_memory
from resacct.errors import ResacctError
from resacct.facts.hardware import _parse_accelerator, accelerators, get_accelerator


@pytest.mark.parametrize(("head_dim", "training", "dropout", "capability", "refused"), [
    (128, True, 0.1, (8, 6), False),
    (192, True, 0.1, (8, 9), False),  # 192 itself is allowed
    (193, True, 0.0, (8, 6), True), (224, True, 0.0, (12, 0), True),
    (224, False, 0.0, (8, 6), False),  # no backward: no constraint
    (224, True, 0.0, (8, 0), False), (224, True, 0.0, (9, 0), False),  # A100, H100: flash's backward takes it
    (256, True, 0.0, (8, 9), False), (256, True, 0.1, (8, 9), True), (256, True, 0.1, (12, 1), True),
    (288, False, 0.0, (9, 0), True),  # over 256: refused everywhere
])
def test_flash_refuses_what_pytorchs_sdp_utils_refuses(head_dim: int, training: bool, dropout: float, capability: tuple[int, int],
                                                       refused: bool) -> None:
    assert (flash_refusal(head_dim, head_dim, training=training, dropout=dropout, capability=capability) is not None) is refused
    assert flash_refusal(64, 32, training=False, dropout=0.0, capability=(9, 0)) == "query head_dim 64 != value head_dim 32"


class _Attention(nn.Module):
    """One sdpa call of 2 heads of ``head_dim``, bf16, causal."""

    def __init__(self, head_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.head_dim, self.dropout = head_dim, dropout
        self.project = nn.Linear(2 * head_dim, 3 * 2 * head_dim, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x).unflatten(-1, (3, 2, self.head_dim)).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)


def _traced(head_dim: int, capability: tuple[int, int], *, dropout: float = 0.0, training: bool = True) -> tuple[str, set[str]]:
    model = _Attention(head_dim, dropout).to("meta")
    x = torch.empty(2, 64, 2 * head_dim, dtype=torch.bfloat16, device="meta")
    ops: list = []
    optimizer = None if not training else (lambda params: torch.optim.AdamW(params, foreach=True))

    def loss(module: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        if training:
            return module(batch).float().square().mean()
        with torch.no_grad():
            return module(batch).float().square().mean().requires_grad_()

    predicted = predict_cuda_step_memory(model, x, loss, optimizer, attention="flash", capability=capability, ops=ops)
    return predicted.attention, {op.op for op in ops}


def _cuda_attention_on_meta() -> bool:
    """Whether this torch traces CUDA's fused attention kernels on meta tensors (torch 2.4 registers no meta kernel for them)."""
    q = torch.empty(1, 1, 8, 16, device="meta")
    try:
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, False)
        torch.ops.aten._scaled_dot_product_flash_attention(q.half(), q.half(), q.half())
    except (NotImplementedError, RuntimeError):
        return False
    return True


def test_a_training_step_on_an_ada_board_runs_the_efficient_kernel_where_flash_refuses() -> None:
    """head_dim 208: on sm89 (L4) flash has no backward for it — the step's sdpa is the efficient kernel, its label says
    why; on sm90 (H100) the same step runs flash."""
    if not _cuda_attention_on_meta():
        pytest.skip(f"torch {torch.__version__} registers no meta kernel for CUDA's fused attention")
    ada, ada_ops = _traced(208, (8, 9))
    hopper, hopper_ops = _traced(208, (9, 0))
    assert ada == "flash; efficient for 1 of 1 calls (flash refuses head_dim 208 in (192, 224], training on sm89)"
    assert any("efficient_attention" in op for op in ada_ops) and not any("flash_attention" in op for op in ada_ops)
    assert hopper == "flash" and any("flash_attention" in op for op in hopper_ops)
    assert _traced(128, (8, 9))[0] == "flash"  # a common head size: flash on the Ada board too
    assert _traced(256, (8, 9), dropout=0.1)[0].startswith("flash; efficient for 1 of 1 calls (flash refuses head_dim 256 > 224 with dropout")
    assert _traced(208, (8, 9), training=False)[0] == "flash"  # no gradients: flash's forward takes any head size up to 256


def test_every_nvidia_board_has_its_compute_capability_and_others_none() -> None:
    nvidia = ("volta", "ampere", "ada", "hopper", "blackwell")
    for board in accelerators().values():
        assert (board.compute_capability is not None) is (board.family in nvidia), board.name
    assert [get_accelerator(name).compute_capability for name in ("a100", "a10", "l4", "rtx-4090", "h100", "b200", "v100")] == \
        [(8, 0), (8, 6), (8, 9), (8, 9), (9, 0), (10, 0), (7, 0)]
    entry = {"display_name": "x", "family": "ada", "memory_bytes": 1, "memory_bandwidth_bytes_per_sec": 1.0, "source": "s", "confidence": "datasheet", "peaks_tera_per_sec": {"fp32": {"dense": 1, "sparse": None}},
             "compute_capability": 8.9}
    with pytest.raises(ResacctError, match=r"accelerators.yaml: odd.compute_capability is 8.9; expected a quoted 'major.minor'"):
        _parse_accelerator("odd", entry)


def test_resacct_devices_shows_a_boards_compute_capability(capsys: pytest.CaptureFixture[str]) -> None:
    from resacct.cli import main

    found = {}
    for name in ("l4", "tpu-v4"):
        assert main(["devices", name, "--json"]) == 0
        (found[name],) = [board["compute_capability"] for board in json.loads(capsys.readouterr().out)["devices"]]
    assert found == {"l4": "8.9", "tpu-v4": None}
    assert main(["devices", "rtx-4090"]) == 0
    assert "  compute_capability: 8.9" in capsys.readouterr().out.splitlines()


@pytest.mark.slow  # 2.0 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_account_on_an_ada_board_says_flash_refused_the_head_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command: a Llama-shaped config of head size 208 in bf16 — on an L4 its sdpa calls run the efficient kernel, on
    an A100 flash; --json's gpu.attention says which and why."""
    pytest.importorskip("transformers")
    from resacct.cli import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 128, "hidden_size": 416, "intermediate_size": 512, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False}))
    attention = {}
    for board in ("l4", "a100"):
        assert main(["account", "--hf-config", str(config), "--batch", "1", "--seq", "32", "--recipe", "bf16", "--device", board, "--json"]) == 0
        attention[board] = json.loads(capsys.readouterr().out)["gpu"]["attention"]
    assert attention["l4"].startswith("flash; efficient for 2 of 2 calls (flash refuses head_dim 208 in (192, 224], training on sm89)")
    assert attention["a100"].startswith("flash") and "efficient" not in attention["a100"]
