"""One training step of a model, accounted: load → trace → measure → predict → compare and render.

The pipeline, module by module:

- **load** the model and its inputs: :mod:`~resacct.account.model_factory` (``--model module:factory``),
  :mod:`~resacct.account.user_code` (a user's file, errors with their file:line),
  :mod:`~resacct.account.model_io` (example inputs, token batches), :mod:`~resacct.account.hf_models`
  (transformers models from a config, no weights);
- **trace and measure** one step: :mod:`~resacct.account.step_measurements` (FLOPs by
  FlopCounterMode, saved tensors by saved_tensors_hooks, training state, allocator peak);
- **predict** with one provider per model family: :mod:`~resacct.account.providers` (which formula
  predicts a raw model, or the one line that says none does), :mod:`~resacct.account.gpt_step`
  (resacct's GPT), :mod:`~resacct.account.hf` (transformers causal LMs);
- **compare and render**: :mod:`~resacct.account.rows`, :mod:`~resacct.account.step_account` (the GPT account),
  :mod:`~resacct.account.optimizers`; any ``nn.Module``: :mod:`~resacct.account.generic`.

``from resacct.account import account_gpt, account_named_model`` keeps working: this package re-exports
the GPT account's API and, lazily, the generic one.
"""

from typing import Any

from resacct.account.gpt_step import *  # noqa: F401,F403  (the GPT account's API)
from resacct.account.gpt_step import __all__ as _GPT_STEP_ALL

__all__ = [*_GPT_STEP_ALL, "ModelAccount", "account_named_model", "account_module"]

_GENERIC = ("ModelAccount", "account_named_model", "account_module")


def __getattr__(name: str) -> Any:
    """The generic path (:mod:`resacct.account.generic`), lazily: it builds on
    :mod:`resacct.account.step_measurements`, never on :mod:`resacct.account.gpt_step`."""
    if name in _GENERIC:
        from resacct.account import generic

        return getattr(generic, name)
    raise AttributeError(f"module 'resacct.account' has no attribute {name!r}")
