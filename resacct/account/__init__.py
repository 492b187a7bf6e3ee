"""One training step of a model, accounted. The stage folders are the pipeline, in order:

1. :mod:`~resacct.account.load` — the model (a ``module:factory``, a transformers config on the meta
   device) and its inputs, loss and optimizer;
2. :mod:`~resacct.account.trace` — the step traced once: FLOPs per op and module, saved tensors,
   training state; traced answers cached on disk;
3. :mod:`~resacct.account.peak` — the step's peak memory predicted before it runs, per rank when sharded;
4. :mod:`~resacct.account.fit` — the largest batch or sequence that fits a budget, from a few traces;
5. :mod:`~resacct.account.answers` — each model family's account, predicted beside measured;
6. :mod:`~resacct.account.render` — the rows and records an account prints;

and :mod:`~resacct.account.gpu`, the same step for a GPU this machine does not have (the CUDA
caching allocator model, the CUDA step on meta tensors, the recorded GPU truth).

``from resacct.account import account_gpt, account_named_model`` keeps working: this package re-exports
the GPT account's API and, lazily, the generic one.
"""

from typing import Any

from resacct.account.answers.gpt_step import *  # noqa: F401,F403  (the GPT account's API)
from resacct.account.answers.gpt_step import __all__ as _GPT_STEP_ALL

__all__ = [*_GPT_STEP_ALL, "ModelAccount", "account_named_model", "account_module"]

_GENERIC = ("ModelAccount", "account_named_model", "account_module")


def __getattr__(name: str) -> Any:
    """The generic path (:mod:`resacct.account.answers.generic`), lazily: it builds on
    :mod:`resacct.account.trace.step_measurements`, never on :mod:`resacct.account.answers.gpt_step`."""
    if name in _GENERIC:
        from resacct.account.answers import generic

        return getattr(generic, name)
    raise AttributeError(f"module 'resacct.account' has no attribute {name!r}")
