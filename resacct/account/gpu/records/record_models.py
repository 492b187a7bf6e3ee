"""The models of a GPU record's steps (issue 31), built the one way the recorder built them and the
replay predicts them: resacct's GPT by name, or a transformers causal LM from the config the record
holds (no weights, no network), its experts implementation and LoRA adapters as the step names.

The recorder (``tools/gpu_record.py``) builds each step's model here on the board; a recorded claim
(:mod:`resacct.checks.gpu_record_steps`) and ``--compare`` build the same step here on meta tensors
and predict it (:func:`predict_record_step`): the step is described by the record itself (``family``,
``model_config``, ``recipe``, ``attention``, ``batch``, ``seq``, ``extra``), so a record stays
predictable when the recorder's matrix changes. A dry run (on a CPU, ``tiny``) shrinks every model to
:data:`TINY`'s sizes, and its record keeps the shrunk config (:func:`built_config`).

>>> net, loss = build_record_model("resacct", "gpt2-small", "math", {}, tiny=True, device="meta")
>>> net.config.n_layers, net.config.d_model, sum(p.numel() for p in net.parameters())
(2, 64, 120576)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

from resacct.errors import ResacctError

__all__ = ["TINY", "FAMILIES", "built_config", "build_record_model", "predict_record_step", "parse_capability", "served_model", "materialize_in_order",
           "predict_record_serving", "ServingPrediction", "library_env", "predict_step_of_record", "predict_serving_of_record"]

#: the sizes a dry run shrinks every model to (a CPU runs its steps in seconds)
TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16,
        "num_key_value_heads": 2, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "num_local_experts": 4}

#: what a step's ``family`` names: resacct's GPT (``model`` a preset name), a transformers causal LM (``model`` its
#: config), or that LM with LoRA r=16 on q_proj and v_proj (peft)
FAMILIES = ("resacct", "hf", "lora")


def built_config(family: str, model: Any, *, tiny: bool) -> dict[str, Any]:
    """The config a step's model is built from, as the record keeps it (``model_config``): resacct's GPT's
    fields (``model`` a preset name, or those fields), or the transformers config's values; ``tiny``:
    shrunk to :data:`TINY`'s sizes (a dry run) — so a record names the model that ran, whatever its matrix said."""
    from dataclasses import asdict

    if family not in FAMILIES:
        raise ResacctError(f"recorded step family {family!r}: expected one of {', '.join(FAMILIES)}")
    if family == "resacct":
        from resacct.training.gpt import GPTConfig, get_gpt_config

        if isinstance(model, str):
            config = get_gpt_config(model)
        elif isinstance(model, dict):
            try:
                config = GPTConfig(**model)
            except TypeError as error:
                raise ResacctError(f"recorded step of resacct's GPT: model_config {model!r} is not a GPTConfig ({error})") from None
        else:
            raise ResacctError(f"recorded step of resacct's GPT: model {model!r}; expected a preset name such as 'gpt2-small' or its fields")
        if tiny:
            config = replace(config, vocab_size=256, context_length=64, n_layers=2, n_heads=4, d_model=64)
        return asdict(config)
    if not isinstance(model, dict) or "model_type" not in model:
        raise ResacctError(f"recorded step of a transformers model: model_config {model!r}; expected a config with model_type")
    values = dict(model)
    if tiny:
        values.update({key: value for key, value in TINY.items() if key in values or key == "head_dim" and values["model_type"] != "gpt2"})
    return values


def build_record_model(family: str, model: Any, attention: str, extra: dict[str, Any], *, tiny: bool, device: str) -> tuple[Any, Any]:
    """The model of a recorded step on ``device`` and its loss ``(model, (tokens, targets)) → loss``, from
    :func:`built_config` (``tiny``: :data:`TINY`'s sizes). ``attention``: ``math`` builds resacct's GPT with its
    own matmuls, ``eager`` a transformers model with transformers' (anything else: sdpa)."""
    import torch

    values = built_config(family, model, tiny=tiny)
    if family == "resacct":
        from resacct.training.gpt import GPTConfig, build_gpt

        net = build_gpt(GPTConfig(**values), device=device, attention="math" if attention == "math" else "sdpa")

        def gpt_loss(m: Any, batch: Any) -> Any:
            logits = m(batch[0])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[1].flatten())
        return net, gpt_loss
    from resacct.account.load.hf_models import HfConfigSpec, build_hf_model

    spec = HfConfigSpec(name=f"recorder-{values['model_type']}", source="tools/gpu_record.py", values=values)
    net = build_hf_model(spec, device=device, attention="eager" if attention == "eager" else "sdpa")
    if extra.get("experts"):
        experts = extra["experts"]
        if experts == "eager" and device == "meta":  # its routing asks the data: on meta, the same loop over an even spread
            from resacct.account.gpu.tracing.eager_experts import register_even_eager_experts

            experts = register_even_eager_experts()
        net.config._experts_implementation = experts
        for module in net.modules():
            if hasattr(module, "config") and hasattr(module.config, "_experts_implementation"):
                module.config._experts_implementation = experts
    if family == "lora":
        try:
            import peft
        except ImportError:
            raise ResacctError("a recorded LoRA step needs peft; expected it installed: pip install 'resacct[finetune]'") from None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers' is_gradient_checkpointing, raised inside peft (as lora_step)
            net = peft.get_peft_model(net, peft.LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))

    def hf_loss(m: Any, batch: Any) -> Any:
        return m(input_ids=batch[0], labels=batch[1]).loss
    return net, hf_loss


def predict_record_step(step: dict[str, Any], *, dry_run: bool, capability: str | None = None, env: dict[str, str] | None = None,
                        ops: list[Any] | None = None, multiprocessors: int | None = None, window: list[Any] | None = None,
                        replay: bool = True) -> Any:
    """The measured step of the process a record describes (``step``: its ``family``, ``model_config``, ``recipe``,
    ``attention``, ``batch``, ``seq``, ``extra`` and ``allocator_settings``), predicted on meta as the recorder ran it —
    the model built, the batch made, the recipe's copy, two warm-up steps, then the step
    (:func:`~resacct.account.gpu.records.recorded_history.predict_recorded_process`): the same model, recipe, batch, attention
    kernel and allocator settings (``model_config``: the config built, a dry run's already tiny). On a board's record
    (``capability`` "9.0" …) the cuBLAS/cuBLASLt workspaces PyTorch's source gives it are allocated at the first matmuls,
    ``env`` the library probe's variables. ``ops``: a list that receives the measured step's aten ops with their FLOPs and
    bytes (the step time's input, from the same pass). ``multiprocessors``: the board's (the record's
    ``multi_processor_count``): its reduction kernels' staging buffers are allocated
    (:mod:`~resacct.account.gpu.tracing.cuda_scratch`); None leaves them out. ``window``: a list that receives the measured
    step's allocator events with the op of each (``predict_recorded_process``'s). ``replay``: the measured step replays the
    last warm-up step's allocator calls (:mod:`~resacct.account.gpu.records.steady_replay`); False traces it."""
    from resacct.account.gpu.records.record import allocator_config_of
    from resacct.account.gpu.records.recorded_history import predict_recorded_process

    missing = [key for key in ("family", "model_config", "recipe", "attention", "batch", "seq") if key not in step]
    if missing:
        raise ResacctError(f"recorded step {step.get('name')!r} lacks {', '.join(missing)}; expected what ran, as tools/gpu_record.py records it")
    attention = step["attention"]
    kernel = attention if attention in ("flash", "efficient") and not dry_run else None  # a dry run ran the CPU's kernels: sdpa's choice
    major_minor = parse_capability(capability)
    cublas_bytes = cublaslt_bytes = 0
    if major_minor and not dry_run:
        from resacct.account.gpu.allocator.library_workspaces import cublas_workspace_bytes, cublaslt_workspace_bytes

        cublas_bytes, cublaslt_bytes = cublas_workspace_bytes(major_minor[0], env or {}), cublaslt_workspace_bytes(major_minor[0], env or {})
    def build() -> tuple[Any, Any]:
        return build_record_model(step["family"], step["model_config"], attention, step.get("extra") or {}, tiny=False, device="meta")

    return predict_recorded_process(step, build, config=allocator_config_of(step.get("allocator_settings")), cublas_bytes=cublas_bytes,
                                    cublaslt_bytes=cublaslt_bytes, kernel=kernel, capability=major_minor, ops=ops,
                                    multiprocessors=None if dry_run else multiprocessors, window=window, replay=replay)


def parse_capability(capability: str | None) -> tuple[int, int] | None:
    """A record's ``capability`` ("9.0", as ``torch.cuda.get_device_properties`` gave it) as (major, minor); None stays None.

    >>> parse_capability("8.6"), parse_capability(None)
    ((8, 6), None)
    """
    if capability is None:
        return None
    major, _, minor = str(capability).partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ResacctError(f"GPU record capability {capability!r}: expected 'major.minor' such as '9.0'")
    return int(major), int(minor)


def served_model(model_config: dict[str, Any], weights: str) -> Any:
    """A recorded serving entry's model on meta, as ``infer --device`` builds it
    (:func:`~resacct.account.gpu.answers.command_answers.prefill_model`: experts grouped, weights in ``weights``, eval)."""
    from resacct.account.gpu.answers.command_answers import prefill_model
    from resacct.account.load.hf_models import HfConfigSpec

    spec = HfConfigSpec(name=f"recorder-{model_config.get('model_type')}", source="tools/gpu_record.py", values=dict(model_config))
    return prefill_model(spec, weights)[0]


def materialize_in_order(model: Any, device: str) -> Any:
    """``model`` (on meta) given storage on ``device`` as the predictions load it: every parameter in the module's order
    (each tied storage once), then every buffer — floating ones drawn from N(0, 0.02), the rest zero (no checkpoint: the
    recorder's weights are random; a board's time and memory do not depend on their values)."""
    import torch

    def real(tensor: Any) -> Any:
        made = torch.empty_like(tensor, device=device)
        return made.normal_(0.0, 0.02) if made.is_floating_point() else made.zero_()

    with torch.no_grad():
        done: dict[int, Any] = {}
        for module in model.modules():
            for name, parameter in list(module._parameters.items()):
                if parameter is not None:
                    if id(parameter) not in done:
                        done[id(parameter)] = torch.nn.Parameter(real(parameter), requires_grad=parameter.requires_grad)
                    module._parameters[name] = done[id(parameter)]
        for module in model.modules():
            for name, buffer in list(module._buffers.items()):
                if buffer is not None:
                    if id(buffer) not in done:
                        done[id(buffer)] = real(buffer)
                    module._buffers[name] = done[id(buffer)]
    return model


@dataclass(frozen=True)
class ServingPrediction:
    """A recorded serving entry predicted on meta: the CUDA peaks of its weights and first prefill, the prefill's ops,
    the next token's forward's ops, and what that decode step reads (the weights, the KV cache at the context)."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    attention: str | None
    ops: list[Any]
    weight_bytes: int
    kv_cache_bytes: int
    decode_ops: list[Any]


def predict_record_serving(entry: dict[str, Any], *, dry_run: bool, capability: str | None = None, env: dict[str, str] | None = None,
                           multiprocessors: int | None = None) -> ServingPrediction:
    """A recorded serving entry (``model_config``, ``weights``, ``attention``, ``batch``, ``context``) as ``infer --device``
    predicts it: the model built the same way, the prefill traced on meta with the recorded sdpa kernel and the cuBLAS
    workspaces of the board's ``capability``; the KV cache's bytes from the model's own cache after a meta forward; the
    next token's forward traced on meta (:func:`~resacct.account.gpu.tracing.decode_trace.trace_decode_ops`); the reduction kernels'
    staging sized by the board's ``multiprocessors``, as ``infer --device`` sizes it from the datasheet (None: not predicted)."""
    from resacct.account.gpu.answers.command_answers import predict_prefill, weight_bytes
    from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard
    from resacct.account.gpu.tracing.decode_trace import trace_decode_ops
    from resacct.account.load.meta_facts import model_kv_cache_elements

    missing = [key for key in ("model_config", "weights", "attention", "batch", "context") if key not in entry]
    if missing:
        raise ResacctError(f"recorded serving entry {entry.get('name')!r} lacks {', '.join(missing)}; expected what ran, as tools/gpu_record.py records it")
    model = served_model(entry["model_config"], entry["weights"])
    attention = entry["attention"]
    kernel = attention if attention in ("flash", "efficient") and not dry_run else None
    major_minor = parse_capability(capability)
    workspaces: tuple[int, ...] = ()
    if major_minor and not dry_run:
        from resacct.account.gpu.allocator.library_workspaces import step_workspaces

        workspaces = step_workspaces(model, major=major_minor[0], backward=False, env=env or {}).sizes
    ops: list[Any] = []
    predicted = predict_prefill(model, batch=entry["batch"], context=entry["context"], kernel=kernel, workspaces=workspaces, ops=ops,
                                capability=major_minor, reductions=None if dry_run else ReductionBoard.sized(multiprocessors, major_minor))
    kv_cache = model_kv_cache_elements(model, entry["context"]) * entry["batch"] * next(model.parameters()).element_size()
    decode_ops = trace_decode_ops(model, batch=entry["batch"], context=entry["context"], kernel=kernel, capability=major_minor)
    return ServingPrediction(predicted.peak_allocated_bytes, predicted.peak_reserved_bytes, predicted.attention, ops, weight_bytes(model), kv_cache,
                             decode_ops)


def library_env(record: dict[str, Any]) -> dict[str, str]:
    """The environment variables the record's library probe saw set on the board (the cuBLAS workspaces' settings)."""
    return {key: value for key, value in ((record.get("library_probe") or {}).get("env") or {}).items() if value is not None}


def predict_step_of_record(record: dict[str, Any], step: dict[str, Any], *, ops: list[Any] | None = None, window: list[Any] | None = None,
                           replay: bool = True) -> Any:
    """:func:`predict_record_step` of ``step`` with the board ``record`` names: its capability, its library probe's
    environment, its multiprocessors (a dry run's: the CPU's kernels, none of the board's)."""
    return predict_record_step(step, dry_run=bool(record.get("dry_run")), capability=record.get("capability"), env=library_env(record), ops=ops,
                               multiprocessors=record.get("multi_processor_count"), window=window, replay=replay)


def predict_serving_of_record(record: dict[str, Any], entry: dict[str, Any]) -> ServingPrediction:
    """:func:`predict_record_serving` of a served ``entry`` with the board ``record`` names."""
    return predict_record_serving(entry, dry_run=bool(record.get("dry_run")), capability=record.get("capability"), env=library_env(record),
                                  multiprocessors=record.get("multi_processor_count"))
