"""ZeRO-Offload / ZeRO-3 model-state memory: the GiB DeepSpeed's own estimators print in its docs
(the figure, given as ``reported``) against resacct's reproduction of those estimators
(:mod:`resacct.formulas.offload`). DeepSpeed is not needed: the figures are its published output.
"""

from __future__ import annotations

from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check

Number = float | int


@check("offload.deepspeed_estimate", evidence="published")
def deepspeed_estimate(stage: int, parameters: Number, gpus_per_node: int, side: str, reported: Number, nodes: int = 1,
                       largest_layer_parameters: Number = 0, offload_optimizer: bool = True, offload_param: bool = False,
                       zero_init: bool = True, estimator: str = "docs") -> Outcome:
    """One figure DeepSpeed's memory estimator printed, in GiB (``side`` cpu: per host; gpu: per
    GPU), against resacct's ZeRO-2 / ZeRO-3 estimate for the same setup (``estimator``: the
    figure's — ``docs``, the table of DeepSpeed's memory docs, or ``current``, DeepSpeed ≥ 0.14.3)."""
    from resacct.formulas.offload import deepspeed_zero2_bytes, deepspeed_zero3_bytes

    if side not in ("cpu", "gpu") or stage not in (2, 3):
        raise ResacctError(f"side {side!r} / stage {stage!r}: expected cpu or gpu / 2 or 3")
    if stage == 2:
        cpu, gpu = deepspeed_zero2_bytes(parameters, gpus_per_node=gpus_per_node, nodes=nodes, offload_optimizer=offload_optimizer,
                                         estimator=estimator)
    else:
        cpu, gpu = deepspeed_zero3_bytes(parameters, largest_layer_parameters, gpus_per_node=gpus_per_node, nodes=nodes,
                                         offload_optimizer=offload_optimizer, offload_param=offload_param, zero_init=zero_init)
    return Outcome(measured=float(reported), predicted=(cpu if side == "cpu" else gpu) / 2**30)


@check("offload.largest_module_parameters", evidence="measured", quantities=("hidden", "vocab", "mlp", "experts"))
def largest_module_parameters(config: str) -> Outcome:
    """DeepSpeed's ``largest_layer_params`` of a shipped config's model as transformers builds it on
    meta: the most parameters one module holds directly (``model_to_params`` in
    deepspeed/runtime/zero/stage3.py: ``sum(p.numel() for p in m.parameters(recurse=False))``, the
    largest over ``model.modules()``); predicted: :func:`resacct.formulas.offload.largest_module_parameters`,
    what ``resacct offload --hf-config`` uses."""
    import os

    from resacct.harness.registry import NotMeasurable

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from resacct.measurement.torch_limits import transformers_unusable

    if problem := transformers_unusable():
        raise NotMeasurable(problem)
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise NotMeasurable("transformers is not installed (the optional extra: pip install 'resacct[hf]')") from None
    from resacct.account.load.hf_models import build_hf_model, load_hf_config
    from resacct.formulas.hf_formulas import architecture_of
    from resacct.formulas.offload import largest_module_parameters as predicted

    model = build_hf_model(load_hf_config(config), device="meta")
    measured = max(sum(p.numel() for p in module.parameters(recurse=False)) for module in model.modules())
    a = architecture_of(model.config)
    return Outcome(measured=measured, predicted=predicted(a), quantities={"hidden": a.hidden, "vocab": a.vocab, "mlp": a.mlp, "experts": a.experts})
