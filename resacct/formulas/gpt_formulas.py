"""Exact FLOPs and saved-activation bytes of one training step of :mod:`resacct.training.gpt`'s decoder.

The formulas follow the model matmul by matmul and saved tensor by saved tensor, so that they
equal what PyTorch measures — FlopCounterMode for FLOPs, ``saved_tensors_hooks`` for activations
(checked in ``resacct/specs/account.claims.yaml``). Beside them, the conventions people quote:

- **6N** FLOPs per token (the lecture's rule, :func:`six_n_step_flops`);
- **6N + 12·L·d·T** per token (PaLM appendix B; nanoGPT's ``estimate_mfu``, N without the
  position embedding: :func:`palm_step_flops`);
- **s·b·h·(34 + 5·a·s/h)** bytes of activations per layer (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", §4.1: 16-bit activations, with dropout;
  :func:`korthikanti_layer_activation_bytes`) and where this model differs from it
  (:func:`korthikanti_differences`).

The FLOPs live in :mod:`resacct.formulas.gpt_flop_formulas`, the saved activations in
:mod:`resacct.formulas.gpt_activation_formulas`; every name is importable from here.

Notation: b batch, s sequence, d model width (Korthikanti's h), a heads, L layers, V vocabulary,
r MLP ratio, T = b·s tokens, E bytes per activation element.

>>> from resacct.training.gpt import get_gpt_config
>>> small = get_gpt_config("gpt2-small")
>>> flops = predict_gpt_step_flops(small, batch=1, seq=1024)
>>> flops.forward_flops, flops.backward_flops == 2 * flops.forward_flops
(291648307200, True)
>>> korthikanti_layer_activation_bytes(seq=1024, batch=1, hidden=768, heads=12)
89653248
"""

from __future__ import annotations

from resacct.formulas.gpt_activation_formulas import (
    SavedTerm,
    gpt_layer_saved_bytes,
    gpt_outside_layers_saved_bytes,
    gpt_saved_terms,
    korthikanti_differences,
    korthikanti_layer_activation_bytes,
    layer_norm_stats_bytes,
    predict_gpt_saved_bytes,
)
from resacct.formulas.gpt_flop_formulas import (
    GptStepFlops,
    ModuleMatmul,
    gpt_matmul_parameter_count,
    gpt_matmuls,
    nanogpt_parameter_count,
    palm_step_flops,
    predict_gpt_step_flops,
    six_n_step_flops,
)

from resacct.formulas import gpt_flop_formulas
from resacct.formulas import gpt_activation_formulas

__all__ = [*gpt_flop_formulas.__all__, *gpt_activation_formulas.__all__]  # every name of both parts, re-exported
