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

``from resacct.account import account_gpt, account_named_model`` keeps working: this package re-exports,
lazily, the GPT account's API (:mod:`resacct.account.answers.gpt_step`) and the generic one
(:mod:`resacct.account.answers.generic`). Importing a stage module (``resacct.account.trace.cache``,
``resacct.account.load.user_code``) imports neither, nor torch: a command answered from the trace cache
never pays torch's import.
"""

import importlib
from typing import Any

_GENERIC = ("ModelAccount", "account_named_model", "account_module")
_GPT_STEP = "resacct.account.answers.gpt_step"


def __getattr__(name: str) -> Any:
    """The re-exported names, imported when first asked for: the generic path builds on
    :mod:`resacct.account.trace.step_measurements`, never on :mod:`resacct.account.answers.gpt_step`."""
    if name in _GENERIC:
        from resacct.account.answers import generic

        return getattr(generic, name)
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module 'resacct.account' has no attribute {name!r}")
    gpt_step = importlib.import_module(_GPT_STEP)
    if name == "__all__":
        return [*gpt_step.__all__, *_GENERIC]
    if name in gpt_step.__all__:
        return getattr(gpt_step, name)
    raise AttributeError(f"module 'resacct.account' has no attribute {name!r}")
