"""The step ``resacct lora`` prices, traced: the transformers causal LM of a config built on the
meta device in the base's dtype, wrapped by ``peft.get_peft_model`` (float32 adapters over a
bf16/fp16 base, as peft keeps them), one AdamW step over the adapters predicted on fake tensors
(:func:`resacct.account.peak.step_peak.predict_step_peak`: forward, backward, optimizer step, zero_grad).
The same step :func:`resacct.account_model` accounts and a real peft step on the CPU measures
(``tests/test_one_answer.py``).

NF4 (QLoRA) is not traced (bitsandbytes' 4-bit kernels do not run on fake tensors): no peak.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import nn

from resacct.errors import ResacctError

__all__ = ["LoraStep", "build_lora_model", "default_lora_targets", "lora_step_inputs", "trace_lora_step", "TRACED_BASES"]

#: base formats whose step is traced, and the dtype the base is built in
TRACED_BASES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class LoraStep:
    """A LoRA step traced on the meta device and on fake tensors: the built model's frozen and
    trainable parameters, the state an AdamW step over the adapters holds, FlopCounterMode's
    FLOPs, the bytes autograd saves, and the whole step's predicted peak (``peak``:
    :class:`~resacct.account.peak.models.PredictedStepPeak`). ``targets``: the modules peft adapted;
    ``model``: the peft model on meta it traced (a search over the batch traces it again, unbuilt)."""

    targets: tuple[str, ...]
    base_parameters: int
    base_bytes: int
    adapter_parameters: int
    adapter_tensors: int
    adapter_bytes: int
    forward_flops: int
    backward_flops: int
    saved_activation_bytes: int | None  # None where it could not be recorded on meta (gradient checkpointing; LoRA on expert weights)
    peak: Any
    model: Any = field(default=None, compare=False, repr=False)
    #: how the layers were traced, when not simply all of them (from three depths, or all of them and why)
    layers_note: str | None = field(default=None, compare=False)

    @property
    def gradient_bytes(self) -> int:
        return self.adapter_bytes  # one gradient per adapter, in its dtype

    @property
    def optimizer_state_bytes(self) -> int:
        return 2 * self.adapter_bytes + 4 * self.adapter_tensors  # AdamW's two moments in the adapters' dtype + a float32 step counter each

    @property
    def state_bytes(self) -> int:
        return self.base_bytes + self.adapter_bytes + self.gradient_bytes + self.optimizer_state_bytes

    @property
    def step_flops(self) -> int:
        return self.forward_flops + self.backward_flops

    @property
    def peak_bytes(self) -> int:
        return int(self.peak.peak_bytes)

    @property
    def start_bytes(self) -> int:
        return int(self.peak.timeline.start_bytes)


def build_lora_model(config: Any, *, rank: int, targets: tuple[str, ...], base: str, dropout: float = 0.0, device: str = "meta",
                     gradient_checkpointing: bool = False) -> nn.Module:
    """``config``'s causal LM (a transformers config object) in ``base``'s dtype on ``device``, wrapped by peft
    (``lora_alpha`` 2r; ``targets`` peft's ``target_modules``, ``("all-linear",)`` for every linear layer)."""
    from resacct.account.load.hf_models import causal_lm_from_config

    if base not in TRACED_BASES:
        raise ResacctError(f"base {base!r}: the step is traced for {', '.join(TRACED_BASES)} (NF4's bitsandbytes kernels do not run on fake tensors)")
    from resacct.measurement.torch_limits import transformers_unusable

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if problem := transformers_unusable():  # peft imports transformers' models, which fail under it
        raise ResacctError(problem)
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ResacctError("the traced LoRA step needs transformers and peft; expected them installed: pip install 'resacct[hf]' peft") from None
    from resacct.account.load.hf_models import import_before_device_modes

    import_before_device_modes()
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' is_gradient_checkpointing, raised inside peft
        # peft ≥ 0.21 converts a fused-experts MoE (DeepSeek-V3, Qwen3-MoE: experts.gate_up_proj a 3-D parameter) into
        # target_parameters with rank_pattern {".*\.gate_up_proj": 2r} (gate and up packed), then warns that the key matched
        # no targeted *module* and was ignored — it was applied (gate_up_proj's lora_A holds 2r rows per expert, measured
        # on a tiny DeepSeek-V3: tests/test_lora_moe_warning.py). resacct never sets a pattern: the warning is peft's about itself.
        warnings.filterwarnings("ignore", message=r"The following (rank|alpha)_pattern keys did not match any targeted module", category=RuntimeWarning)
        base_model = causal_lm_from_config(config, dtype=TRACED_BASES[base])
        if gradient_checkpointing:
            base_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        target_modules: Any = "all-linear" if tuple(targets) == ("all-linear",) else list(targets)
        # GPT-2's layers are transformers' Conv1D (weights stored in × out): peft wants fan_in_fan_out for
        # them and otherwise sets it itself with a UserWarning per layer kind that reached the user
        from transformers.pytorch_utils import Conv1D

        fan_in_fan_out = any(isinstance(module, Conv1D) for module in base_model.modules())
        model = get_peft_model(base_model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout, target_modules=target_modules,
                                                      fan_in_fan_out=fan_in_fan_out))
    model.train()
    return model


def lora_step_inputs(config: Any, *, batch: int, seq: int, device: str = "meta") -> dict[str, Int[torch.Tensor, "batch seq"]]:
    """``input_ids`` and ``labels`` of ``batch`` × ``seq`` tokens (zeros: a valid id of any vocabulary)."""
    ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
    return {"input_ids": ids, "labels": ids}


def lora_loss(model: nn.Module, inputs: dict[str, Int[torch.Tensor, "batch seq"]]) -> Float[torch.Tensor, ""]:
    """The model's own next-token loss."""
    return model(**inputs).loss


def adamw_over(parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
    """torch.optim.AdamW (its default implementation) over the adapters."""
    return torch.optim.AdamW(parameters, lr=1e-4)


def default_lora_targets(config: Any) -> tuple[str, ...]:
    """peft's default targets for the config's ``model_type`` (its ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``:
    q_proj, v_proj for Llama; query_key_value for Falcon, GPT-NeoX and BLOOM; c_attn for GPT-2); where peft
    has none, q_proj and v_proj if the model has them, else every linear layer of its attention
    (DeepSeek's MLA: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj)."""
    from resacct.measurement.torch_limits import transformers_unusable

    if problem := transformers_unusable():  # importing peft imports transformers' models, which fail under it
        raise ResacctError(problem)
    try:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping
    except ImportError:
        return ("q_proj", "v_proj")
    if mapping.get(getattr(config, "model_type", "")):
        return tuple(mapping[config.model_type])
    from resacct.account.load.hf_models import causal_lm_from_config

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = causal_lm_from_config(config)
    linear = {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    leaves = {name.split(".")[-1] for name in linear}
    if {"q_proj", "v_proj"} <= leaves:
        return ("q_proj", "v_proj")
    attention = sorted({name.split(".")[-1] for name in linear if ".self_attn." in name or ".attention." in name})
    return tuple(attention) or ("all-linear",)


def trace_lora_step(config: Any, *, rank: int, targets: tuple[str, ...], base: str, batch: int, seq: int, dropout: float = 0.0,
                    gradient_checkpointing: bool = False, layers: str = "auto") -> LoraStep:
    """One LoRA step of ``config``'s model (see the module doc), nothing allocated: the parameters of the
    peft model built on meta and the tensors its forward saves there; the whole step's peak on fake CPU
    tensors (:func:`resacct.account.peak.step_peak.predict_step_peak`) and, on that same pass,
    FlopCounterMode's FLOPs of its forward and backward (the CPU's sdpa kernel, counted from its shapes:
    :class:`~resacct.account.trace.fake_pass.FakeStepRecorder`).
    ``layers`` (``auto``, ``sampled``, ``all``): a stack of identical layers deeper than 16 (``sampled``:
    5) is traced at depths 3, 4 and 5 and extrapolated, checked (:mod:`resacct.account.trace.lora_layers`)."""
    import dataclasses

    from resacct.account.load.hf_models import config_with_depth
    from resacct.account.peak.layer_segments import SAMPLE_DEPTHS, NotRepeating, segmenting
    from resacct.account.trace.lora_layers import ShallowLoraModels, lora_layer_plan
    from resacct.account.trace.repeated_layers import extrapolate_dataclass, sampled_note

    plan = lora_layer_plan(config, layers)
    why_whole = plan.why_whole
    traced = {"rank": rank, "targets": targets, "base": base, "batch": batch, "seq": seq, "dropout": dropout,
              "gradient_checkpointing": gradient_checkpointing}
    if plan.sample:
        samples = []
        for repeated, built in zip(SAMPLE_DEPTHS, plan.sample_layers()):
            with segmenting(repeated, plan.prefix, plan.period):
                samples.append(_traced_lora_step(config_with_depth(config, built), **traced))
        try:
            step = extrapolate_dataclass([dataclasses.replace(sample, model=None) for sample in samples], plan.depth, plan.prefix, plan.period)
        except NotRepeating as error:
            why_whole = str(error)
        else:
            return dataclasses.replace(step, model=ShallowLoraModels(plan.depth, tuple(sample.model for sample in samples), plan.prefix, plan.period),
                                       layers_note=sampled_note(plan.depth, "the step", plan.prefix, plan.period))
    step = _traced_lora_step(config, **traced)
    return step if why_whole is None else dataclasses.replace(step, layers_note=f"all {plan.depth} layers traced: {why_whole}")


def _traced_lora_step(config: Any, *, rank: int, targets: tuple[str, ...], base: str, batch: int, seq: int, dropout: float,
                      gradient_checkpointing: bool) -> LoraStep:
    """:func:`trace_lora_step` of every layer of ``config``'s model."""
    from resacct.account.peak.step_peak import predict_step_peak
    from resacct.account.trace.fake_pass import FakeStepRecorder
    from resacct.measurement.activations import record_saved_activations
    from resacct.measurement.memory import distinct_storage_bytes

    model = build_lora_model(config, rank=rank, targets=targets, base=base, dropout=dropout, gradient_checkpointing=gradient_checkpointing)
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    adapted = tuple(sorted({name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A") and len(module.lora_A)}))
    inputs = lora_step_inputs(config, batch=batch, seq=seq)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        saved_bytes: int | None = None
        if not gradient_checkpointing:  # checkpoint's recomputation bookkeeping calls .item(), which meta tensors refuse
            try:
                with record_saved_activations(model) as saved:  # on meta: the tensors autograd keeps, by storage
                    lora_loss(model, inputs)
                saved_bytes = int(saved.activation_bytes)
            except RuntimeError:  # peft's LoRA on expert weights enters torch.autocast("meta"), which torch refuses
                saved_bytes = None
        recorder = FakeStepRecorder(model, None, "adamw")  # trace once: the FLOPs counted on the peak's own fake CPU pass
        peak = predict_step_peak(model, inputs, lora_loss, adamw_over, recorder=recorder)
    if not recorder.done:  # a recorder with no recipe is done once it has the FLOPs
        raise ResacctError(f"the LoRA step of {type(model).__name__} never reached its optimizer step on fake tensors; expected a forward, "
                           "a backward and AdamW's step")
    flops = recorder.flops
    return LoraStep(targets=adapted, base_parameters=sum(p.numel() for p in frozen), base_bytes=distinct_storage_bytes(frozen),
                    adapter_parameters=sum(p.numel() for p in trainable), adapter_tensors=len(trainable), adapter_bytes=distinct_storage_bytes(trainable),
                    forward_flops=flops.forward_flops, backward_flops=flops.backward_flops,
                    saved_activation_bytes=saved_bytes, peak=peak, model=model)
