"""One generated token's forward traced on meta (``resacct/account/gpu/tracing/decode_trace.py``): ``infer --device`` prices a
decode step by it. Measured against PyTorch: the same model with real weights on the CPU, prefilled, then one more
token's forward under torch's FlopCounterMode and a dispatch recorder — sdpa held to its math kernel there, which
FlopCounterMode counts (it does not count the CPU's fused flash kernel) and which meta tensors take too."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from resacct.account.gpu.tracing.decode_trace import cache_of, serving_forward, trace_decode_ops
from resacct.account.gpu.tracing.op_costs import OpCosts
from resacct.errors import ResacctError

transformers = pytest.importorskip("transformers")

BATCH, CONTEXT = 2, 24


def _config(kind: str) -> Any:
    if kind == "llama-gqa":  # grouped-query attention, rotary positions: the cache's cat and one position's rotary
        return transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                        vocab_size=160, max_position_embeddings=256)
    return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=160, n_positions=128)


def _models(kind: str) -> tuple[Any, Any]:
    config = _config(kind)
    torch.manual_seed(0)
    real = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(config).eval()
    return real, meta


def _cpu_decode(real: Any) -> tuple[list[Any], int]:
    """The CPU's decode step, measured: every aten op (FLOPs and bytes as the trace counts them) and FlopCounterMode's total."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        cache = cache_of(serving_forward(real, torch.randint(0, 160, (BATCH, CONTEXT))))
        token = torch.randint(0, 160, (BATCH, 1))
        with FlopCounterMode(display=False) as flops, OpCosts() as ops:
            logits = serving_forward(real, token, cache).logits
    assert logits.shape[:2] == (BATCH, 1)  # one position's logits: generate's next token
    return ops.ops, flops.get_total_flops()


@pytest.mark.parametrize("kind", ["llama-gqa", "gpt2"])
def test_the_traced_decode_is_the_cpu_decode_op_for_op(kind: str) -> None:
    real, meta = _models(kind)
    measured_ops, measured_flops = _cpu_decode(real)
    traced = trace_decode_ops(meta, batch=BATCH, context=CONTEXT, kernel=None)
    assert [op.op for op in traced] == [op.op for op in measured_ops]
    assert [(op.flops, op.bytes) for op in traced] == [(op.flops, op.bytes) for op in measured_ops]
    assert sum(op.flops for op in traced) == measured_flops > 0


def _prefill_ops(meta: Any) -> list[Any]:
    from resacct.account.gpu.answers.command_answers import predict_prefill

    ops: list[Any] = []
    predict_prefill(meta, batch=BATCH, context=CONTEXT, kernel=None, ops=ops)
    return ops


def test_attention_to_the_whole_context_is_counted_not_the_prefills_average() -> None:
    """The old estimate (the prefill's FLOPs ÷ its positions) counted a token's attention to half the context on
    average; the traced decode counts one query against all ``CONTEXT + 1`` keys, as the CPU measures."""
    real, meta = _models("llama-gqa")
    _, measured_flops = _cpu_decode(real)
    config = real.config
    head_dim = config.hidden_size // config.num_attention_heads
    attention = 4 * BATCH * config.num_attention_heads * (CONTEXT + 1) * head_dim * config.num_hidden_layers  # QKᵀ and AV, one query
    traced = sum(op.flops for op in trace_decode_ops(meta, batch=BATCH, context=CONTEXT, kernel="flash"))
    assert traced == measured_flops  # the flash kernel's call counted as the math kernel's matmuls
    one_earlier = sum(op.flops for op in trace_decode_ops(meta, batch=BATCH, context=1, kernel="flash"))  # attends to 2 positions
    assert traced - one_earlier == attention // (CONTEXT + 1) * (CONTEXT - 1)  # only attention grows with the context
    assert sum(op.flops for op in _prefill_ops(meta)) / CONTEXT < traced


def test_the_boards_kernel_runs_the_attention_and_a_mask_moves_flash_to_efficient(monkeypatch: pytest.MonkeyPatch) -> None:
    _, meta = _models("llama-gqa")
    names = [op.op for op in trace_decode_ops(meta, batch=BATCH, context=CONTEXT, kernel="flash")]
    assert names.count("aten._scaled_dot_product_flash_attention.default") == meta.config.num_hidden_layers
    names = [op.op for op in trace_decode_ops(meta, batch=BATCH, context=CONTEXT, kernel="efficient")]
    # grouped-query attention: the memory-efficient kernel refuses it (an H200, torch 2.11), sdpa runs its math path
    assert "aten._scaled_dot_product_efficient_attention.default" not in names
    assert names.count("aten._safe_softmax.default") == meta.config.num_hidden_layers
    import resacct.account.gpu.tracing.cuda_step as cuda_step

    calls: list[str] = []
    real_routing = cuda_step._CudaAttention

    class MaskedOnFlash(real_routing):  # type: ignore[misc, valid-type]
        """A board's flash refusing the call (a padded batch's mask): the trace goes to the efficient kernel, from the same cache."""

        def __init__(self, kernel: str, capability: Any = None, *, forced: bool = False) -> None:
            calls.append(kernel)
            super().__init__(kernel, capability, forced=forced)

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.nn.functional.scaled_dot_product_attention and self.kernel == "flash":
                raise ResacctError("attention='flash' with an attention mask: CUDA's flash kernel takes none")
            return super().__torch_function__(func, types, args, kwargs)

    monkeypatch.setattr(cuda_step, "_CudaAttention", MaskedOnFlash)
    retried = trace_decode_ops(meta, batch=BATCH, context=CONTEXT, kernel="flash")
    assert calls == ["flash", "efficient"]
    assert [op.op for op in retried] == names  # the refused attempt grew no layer's cache


def test_bad_input_is_refused_in_one_line() -> None:
    real, meta = _models("gpt2")
    with pytest.raises(ResacctError, match="expected a model on the meta device"):
        trace_decode_ops(real, batch=1, context=4, kernel=None)
    with pytest.raises(ResacctError, match="batch 0, context 4: expected at least one sequence"):
        trace_decode_ops(meta, batch=0, context=4, kernel=None)
    with pytest.raises(ResacctError, match="returned no KV cache"):
        cache_of({"logits": None})
