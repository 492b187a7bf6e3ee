"""``resacct plan``'s parameter count for a Hugging Face config (grouped-query attention
included), run as a user runs it — ``resacct plan --hf-config NAME --json`` in-process — against
the parameters of the model transformers builds from the same config on the meta device (distinct
storages). Skipped (not measurable) when transformers is not installed.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os

from resacct.harness.registry import NotMeasurable, Outcome, check

_NO_TRANSFORMERS = "transformers is not installed (the optional extra: pip install 'resacct[hf]')"


@check("plan.hf_config_parameters", evidence="measured", quantities=("layers", "hidden", "heads", "kv_heads", "head_dim", "mlp", "vocab", "plan_parameters"))
def hf_config_parameters(config: str) -> Outcome:
    """Parameters of a shipped config's model built by transformers on meta (distinct storages);
    predicted: the ``parameters`` field of ``resacct plan --hf-config CONFIG --json``. Quantities:
    the config's shape (layers, hidden, heads, kv_heads, head_dim, mlp, vocab) and plan's count."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise NotMeasurable(_NO_TRANSFORMERS) from None
    return _hf_config_parameters(config)


@functools.lru_cache(maxsize=8)
def _hf_config_parameters(config: str) -> Outcome:
    from resacct.checks.hf import meta_model_parameters
    from resacct.cli import main
    from resacct.formulas.hf_formulas import architecture_of

    model, measured = meta_model_parameters(config)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["plan", "--hf-config", config, "--seq", "4096", "--memory-gb", "80", "--json"])
    if status != 0:
        raise RuntimeError(f"resacct plan --hf-config {config} exited {status}")
    planned = json.loads(printed.getvalue())["parameters"]
    a = architecture_of(model.config)
    shape = {"layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "mlp": a.mlp,
             "vocab": a.vocab, "plan_parameters": planned}
    return Outcome(measured=measured, predicted=planned, quantities=shape)
