"""LoRA fine-tuning measured with a real ``peft`` step on the CPU: a tiny LlamaForCausalLM built
from a config (no weights downloaded) wrapped by ``peft.get_peft_model``, one forward, backward and
``torch.optim.AdamW`` step over the trainable parameters, every piece of state counted by storage
— beside :mod:`resacct.formulas.lora`. Skipped (not measurable) when transformers or peft is not
installed.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

from resacct.errors import ResacctError
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.measurement.memo import shared_measurement
from resacct.training.seeding import seed_torch

_MISSING = "{name} is not installed (the optional extra: pip install 'resacct[finetune]')"
_DTYPES = {"float32": (torch.float32, "fp32"), "bfloat16": (torch.bfloat16, "bf16"), "float16": (torch.float16, "fp16")}
_QUANTITIES = ("trainable_parameters", "trainable_tensors", "adapter_element_bytes", "frozen_bytes", "adapter_bytes", "gradient_bytes",
               "frozen_gradients", "optimizer_state_bytes", "state_bytes", "saved_activation_bytes", "saved_activation_ratio", "forward_flops",
               "backward_flops", "step_flops_ratio")


def _require(name: str) -> None:
    from resacct.measurement.torch_limits import transformers_unusable

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if problem := transformers_unusable():
        raise NotMeasurable(problem)
    try:
        __import__(name)
    except ImportError:
        raise NotMeasurable(_MISSING.format(name=name)) from None


@check("finetune.lora_step", evidence="measured", quantities=("base_parameters", "adapter_parameters", "adapter_tensors", "head_dim", "tokens",
                                                               "element_bytes", "full_saved_activation_bytes", "full_step_flops"))
def lora_step(quantity: str, rank: int, targets: str, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, mlp: int = 96,
              vocab: int = 128, dtype: str = "bfloat16", dropout: float = 0.0, batch: int = 2, seq: int = 16, attention: str = "sdpa") -> Outcome:
    """One quantity of a real peft LoRA step (rank ``rank`` on the comma-separated ``targets``,
    or ``all-linear``) on a tiny Llama in ``dtype``, with torch.optim.AdamW: trainable parameters
    and tensors, the adapters' element bytes, the bytes of the frozen base, of the adapters, of
    every gradient (``frozen_gradients``: how many frozen parameters got one), of the optimizer
    state (step counters included) and all of it (``state_bytes``), and the bytes autograd saved
    in the forward (``saved_activation_bytes``, by storage; ``saved_activation_ratio``: over what
    the fully trainable model saves), the step's matmul FLOPs under FlopCounterMode
    (``forward_flops``, ``backward_flops``; sdpa's CPU kernel, which FlopCounterMode counts as 0,
    filled from its shapes by resacct.measurement's tracer; ``attention: eager`` needs no fill) and
    ``step_flops_ratio``: the LoRA step's FLOPs over the fully trainable model's. Quantities: the
    base's and the adapters' parameters (measured), adapter tensors, head size, tokens (b·s), the
    base's element bytes, and what the same model saves and costs without adapters when fully
    trainable (``full_saved_activation_bytes``, ``full_step_flops``)."""
    _require("peft")  # first: peft needs transformers, and a missing peft is then said at no import cost
    _require("transformers")
    if quantity not in _QUANTITIES or dtype not in _DTYPES or attention not in ("sdpa", "eager"):
        raise ResacctError(f"quantity {quantity!r} / dtype {dtype!r} / attention {attention!r}: expected one of {', '.join(_QUANTITIES)} / "
                           f"{', '.join(_DTYPES)} / sdpa, eager")
    outcome = _lora_step(rank, targets, hidden, layers, heads, kv_heads, mlp, vocab, dtype, dropout, batch, seq, attention)
    return outcome[quantity]


def _config(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, max_position_embeddings=64, tie_word_embeddings=False)


@shared_measurement
def _full_step(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int, dtype: str, batch: int, seq: int,
               attention: str) -> tuple[int, int, torch.Tensor]:
    """The fully trainable twin of a LoRA step (no adapters): (bytes autograd saves in its forward,
    its step's FLOPs, torch's RNG state after it — the LoRA model is built from that state, as
    when both ran in one go). Built with seed 0; shared by every LoRA claim on the same base."""
    from transformers import LlamaForCausalLM

    from resacct.account.trace.step_measurements import trace_step_flops
    from resacct.measurement.activation_recording import record_saved_activations

    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    seed_torch(0)
    full = LlamaForCausalLM._from_config(_config(hidden, layers, heads, kv_heads, mlp, vocab), dtype=_DTYPES[dtype][0], attn_implementation=attention)
    with record_saved_activations(full) as full_saved:
        full(input_ids=ids, labels=ids).loss
    fill = attention == "sdpa"  # FlopCounterMode counts the CPU flash kernel as 0: resacct's tracer fills it from the call's shapes
    full_flops = trace_step_flops(full, lambda: full(input_ids=ids, labels=ids).loss, fill_tracer_gaps=fill)
    return full_saved.activation_bytes, full_flops.step_flops, torch.get_rng_state()


@shared_measurement
def _lora_step(rank: int, targets: str, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int, dtype: str, dropout: float,
               batch: int, seq: int, attention: str) -> dict[str, Outcome]:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from resacct.account.trace.step_measurements import trace_step_flops
    from resacct.measurement.activation_recording import record_saved_activations
    from resacct.formulas.config_shapes import architecture_from_values
    from resacct.formulas.hf_formulas import predict_step_flops
    from resacct.formulas.lora import lora_step_flops, lora_training_memory, predict_lora_saved_bytes
    from resacct.measurement.memory import distinct_storage_bytes, optimizer_state_tensors

    torch_dtype, base_format = _DTYPES[dtype]
    config = _config(hidden, layers, heads, kv_heads, mlp, vocab)
    target_list = [t.strip() for t in targets.split(",")]
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    full_saved_bytes, full_step_flops, rng_state = _full_step(hidden, layers, heads, kv_heads, mlp, vocab, dtype, batch, seq, attention)
    torch.set_rng_state(rng_state)
    fill = attention == "sdpa"  # FlopCounterMode counts the CPU flash kernel as 0: resacct's tracer fills it from the call's shapes
    with warnings.catch_warnings():  # transformers' FutureWarning about is_gradient_checkpointing, raised inside peft
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(LlamaForCausalLM._from_config(config, dtype=torch_dtype, attn_implementation=attention),
                               LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout,
                                          target_modules="all-linear" if target_list == ["all-linear"] else target_list))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    with record_saved_activations(model) as saved:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    state = optimizer_state_tensors(optimizer)
    architecture = architecture_from_values(config.to_dict())
    predicted = lora_training_memory(architecture, rank=rank, targets=tuple(target_list), base_format=base_format)
    shape = dict(rank=rank, targets=tuple(target_list), batch=batch, seq=seq)
    predicted_flops = lora_step_flops(architecture, attention=attention, **shape)
    predicted_saved = predict_lora_saved_bytes(architecture, dtype=dtype, attention=attention, dropout=dropout, **shape)
    adapter_parameters = sum(p.numel() for p in trainable)
    frozen_gradients = sum(p.grad is not None for p in frozen)
    flops = trace_step_flops(model, lambda: model(input_ids=ids, labels=ids).loss, fill_tracer_gaps=fill)  # last: it sets every .grad to None
    quantities = {"base_parameters": sum(p.numel() for p in frozen), "adapter_parameters": adapter_parameters, "adapter_tensors": len(trainable),
                  "head_dim": hidden // heads, "tokens": batch * seq, "element_bytes": torch_dtype.itemsize,
                  "full_saved_activation_bytes": full_saved_bytes, "full_step_flops": full_step_flops}
    measured = {
        "trainable_parameters": (adapter_parameters, predicted.adapter_parameters),
        "trainable_tensors": (len(trainable), predicted.adapter_tensors),
        "adapter_element_bytes": (trainable[0].element_size(), predicted.adapter_element_bytes),
        "frozen_bytes": (distinct_storage_bytes(frozen), predicted.base_bytes),
        "adapter_bytes": (distinct_storage_bytes(trainable), predicted.adapter_bytes),
        "gradient_bytes": (distinct_storage_bytes(gradients), predicted.gradient_bytes),
        "frozen_gradients": (frozen_gradients, 0),
        "optimizer_state_bytes": (distinct_storage_bytes(state), predicted.optimizer_state_bytes),
        "state_bytes": (distinct_storage_bytes([*model.parameters(), *gradients, *state]), predicted.state_bytes),
        "saved_activation_bytes": (saved.activation_bytes, predicted_saved),
        "saved_activation_ratio": (saved.activation_bytes / full_saved_bytes, None),
        "forward_flops": (flops.forward_flops, predicted_flops.forward_flops),
        "backward_flops": (flops.backward_flops, predicted_flops.backward_flops),
        "step_flops_ratio": (flops.step_flops / full_step_flops,
                             predicted_flops.step_flops / predict_step_flops(architecture, batch=batch, seq=seq).step_flops),
    }
    return {name: Outcome(measured=value, predicted=guess, quantities=quantities) for name, (value, guess) in measured.items()}


# ── QLoRA's 4-bit base, measured with bitsandbytes on the CPU ─────────────────────────────────────
# bitsandbytes ≥ 0.48 quantises and runs Linear4bit (NF4, double quantisation) on the CPU; it is not
# a dependency of resacct: without it these claims skip.

_BNB_MISSING = ("bitsandbytes is not installed (pip install bitsandbytes; 0.50.2 quantises NF4 with double quantisation "
                "on the CPU), so QLoRA's 4-bit base cannot be measured here")
_QLORA_QUANTITIES = ("packed_weight_bytes", "absmax_bytes", "nested_absmax_bytes", "constant_bytes", "quantized_weight_bytes",
                     "bf16_bytes", "frozen_bytes")


@check("finetune.qlora_base_bytes", evidence="measured", quantities=("quantized_parameters", "quantized_layers", "base_parameters"))
def qlora_base_bytes(quantity: str, hidden: int = 128, layers: int = 2, heads: int = 4, kv_heads: int = 4, mlp: int = 256,
                     vocab: int = 128) -> Outcome:
    """Bytes of QLoRA's frozen base as transformers loads it with bitsandbytes
    (``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)``,
    ``device_map="cpu"``) from a tiny bf16 Llama saved to a temporary folder, counted by storage:
    ``packed_weight_bytes`` (two NF4 codes a byte), ``absmax_bytes`` (the uint8 double-quantised
    constant of each block of 64), ``nested_absmax_bytes`` (the float32 constant of each block of
    256 of those), ``constant_bytes`` (per quantised layer: the 16-entry NF4 code, the 256-entry
    code of the nested quantisation and the absmax mean, all float32), ``quantized_weight_bytes``
    (the first three: what QLoRA's 4 + 8/64 + 32/(64·256) bits per weight count), ``bf16_bytes``
    (embeddings, norms, LM head) and ``frozen_bytes`` (all of it). Predicted by resacct
    (resacct.formulas.lora): ``quantized_weight_bytes`` (quantized_linear_parameters ·
    NF4_DOUBLE_QUANT_BITS / 8), ``constant_bytes`` (1,092 per quantised layer), ``bf16_bytes`` and
    ``frozen_bytes`` (lora_training_memory(base_format="nf4").base_bytes). Quantities:
    quantised weights and layers, all base parameters (a quantised weight counted by its shape)."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise NotMeasurable(_BNB_MISSING) from None
    _require("transformers")
    if quantity not in _QLORA_QUANTITIES:
        raise ResacctError(f"quantity {quantity!r}: expected one of {', '.join(_QLORA_QUANTITIES)}")
    return _qlora_base(hidden, layers, heads, kv_heads, mlp, vocab)[quantity]


@functools.lru_cache(maxsize=4)
def _qlora_base(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int) -> dict[str, Outcome]:
    import logging
    import math
    import tempfile

    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from resacct.formulas.config_shapes import architecture_from_values
    from resacct.formulas.hf_formulas import predict_parameters
    from resacct.formulas.lora import (NF4_CONSTANT_BYTES_PER_LINEAR, NF4_DOUBLE_QUANT_BITS, lora_training_memory, quantized_linear_layers,
                                       quantized_linear_parameters)
    from resacct.measurement.memory import distinct_storage_bytes

    config = _config(hidden, layers, heads, kv_heads, mlp, vocab)
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.bfloat16)
    seed_torch(0)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with tempfile.TemporaryDirectory() as folder:
            LlamaForCausalLM._from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
            model = LlamaForCausalLM.from_pretrained(folder, quantization_config=quantization, device_map="cpu", dtype=torch.bfloat16)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    layers4 = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    states = [m.weight.quant_state for m in layers4]
    if not layers4 or any(s is None or s.state2 is None or s.quant_type != "nf4" for s in states):
        raise NotMeasurable(f"bitsandbytes {bnb.__version__} did not quantise this model to NF4 with double quantisation on the CPU")
    packed = [m.weight.data for m in layers4]
    others = [p for p in model.parameters() if not isinstance(p, bnb.nn.Params4bit)]
    quantized = sum(math.prod(s.shape) for s in states)
    parts = {"packed_weight_bytes": distinct_storage_bytes(packed),
             "absmax_bytes": distinct_storage_bytes([s.absmax for s in states]),
             "nested_absmax_bytes": distinct_storage_bytes([s.state2.absmax for s in states]),
             "constant_bytes": distinct_storage_bytes([t for s in states for t in (s.code, s.offset, s.state2.code)]),
             "bf16_bytes": distinct_storage_bytes(others)}
    parts["quantized_weight_bytes"] = parts["packed_weight_bytes"] + parts["absmax_bytes"] + parts["nested_absmax_bytes"]
    parts["frozen_bytes"] = distinct_storage_bytes([*packed, *others, *(t for s in states for t in (s.absmax, s.code, s.offset, s.state2.absmax,
                                                                                                      s.state2.code))])
    architecture = architecture_from_values(config.to_dict())
    predicted_quantized = quantized_linear_parameters(architecture)
    predicted = {"quantized_weight_bytes": predicted_quantized * NF4_DOUBLE_QUANT_BITS / 8,
                 "constant_bytes": quantized_linear_layers(architecture) * NF4_CONSTANT_BYTES_PER_LINEAR,
                 "bf16_bytes": (predict_parameters(architecture) - predicted_quantized) * 2,
                 "frozen_bytes": lora_training_memory(architecture, rank=1, targets=("q_proj",), base_format="nf4").base_bytes}
    quantities = {"quantized_parameters": quantized, "quantized_layers": len(layers4), "base_parameters": quantized + sum(p.numel() for p in others)}
    return {name: Outcome(measured=value, predicted=predicted.get(name), quantities=quantities) for name, value in parts.items()}


# ── resacct lora's largest batch, checked against the CPU allocator ───────────────────────────────


@check("finetune.lora_largest_batch", evidence="measured",
       quantities=("largest_batch", "measured_peak_bytes", "next_measured_peak_bytes", "predicted_peak_bytes", "next_predicted_peak_bytes",
                   "traces"))
def lora_largest_batch(budget_bytes: int, base: str = "fp32", rank: int = 4, targets: str = "q_proj,v_proj", seq: int = 16, hidden: int = 64,
                       layers: int = 2, heads: int = 4, kv_heads: int = 2, mlp: int = 96, vocab: int = 128) -> Outcome:
    """``resacct lora``'s largest batch within ``budget_bytes`` (:func:`resacct.account.fit.lora_batch.largest_lora_batch`,
    the search the command runs: the step's predicted peak traced on fake tensors at a few batches) for a
    peft LoRA step (AdamW over the adapters) of a tiny Llama over a ``base`` (fp32, bf16, fp16) base, then
    the real step on the CPU at that batch and one more, its peak by torch's CPU allocator
    (:func:`resacct.account.peak.step_peak.measure_step_peak`). Measured: [the peak at the answer ≤ the
    budget, the peak at the answer + 1 > the budget]; predicted: the same pair from the search's own
    traced peaks. Quantities: the answer, both measured and both predicted peaks, the traces it took."""
    _require("peft")
    _require("transformers")
    if base not in ("fp32", "bf16", "fp16"):
        raise ResacctError(f"base {base!r}: expected fp32, bf16 or fp16 (the traced LoRA step's bases)")
    from resacct.account.fit.lora_batch import largest_lora_batch
    from resacct.account.peak.step_peak import measure_step_peak
    from resacct.account.trace.lora_step import adamw_over, build_lora_model, lora_loss

    config = _config(hidden, layers, heads, kv_heads, mlp, vocab)
    target_list = tuple(t.strip() for t in targets.split(","))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        answer = largest_lora_batch(config, rank=rank, targets=target_list, base=base, seq=seq, budget_bytes=budget_bytes)
        if answer.largest == 0:
            raise NotMeasurable(f"not even batch 1 fits {budget_bytes} bytes: no answer to check; expected a budget above batch 1's peak")
        seed_torch(0)
        model = build_lora_model(config, rank=rank, targets=target_list, base=base, device="cpu")
    measured = []
    for batch in (answer.largest, answer.largest + 1):
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
        measured.append(measure_step_peak(model, {"input_ids": ids, "labels": ids}, lora_loss, adamw_over).peak_bytes)
    predicted = (answer.peak_bytes, answer.next_peak_bytes)
    return Outcome(measured=[measured[0] <= budget_bytes, measured[1] > budget_bytes],
                   predicted=[predicted[0] is not None and predicted[0] <= budget_bytes, predicted[1] is not None and predicted[1] > budget_bytes],
                   quantities={"largest_batch": answer.largest, "measured_peak_bytes": measured[0], "next_measured_peak_bytes": measured[1],
                               "predicted_peak_bytes": predicted[0], "next_predicted_peak_bytes": predicted[1], "traces": answer.traced})
