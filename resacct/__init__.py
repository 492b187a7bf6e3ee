"""resacct — resource accounting for PyTorch training, verified.

Can this run? How much memory? How many FLOPs? How long? Where is the bottleneck?
Every answer here is backed by a claim in ``resacct/specs/`` that is checked against PyTorch.

In three lines, one training step of your model — FLOPs, training state, activations, peak,
predicted beside measured (:mod:`resacct.api`)::

    report = resacct.account_model(model, batch=8, recipe="mixed")
    print(report.render())                       # the table `resacct account` prints
    report.flops.predicted, report.flops.measured, report.state.measured

Everything else lives in its area (``resacct.facts.dtypes``, ``resacct.formulas.flops``, ``resacct.measurement.memory``,
``resacct.facts.recipes``, ``resacct.formulas.sharding`` …). Importing this package imports nothing heavy:
``account_model`` and the report types load torch when first used.
"""

from typing import Any

from resacct.errors import ResacctError

__all__ = ["ResacctError", "account_model", "Quantity", "TrainingReport", "__version__"]
__version__ = "0.1.0"

_API = {"account_model", "Quantity", "TrainingReport"}


def __getattr__(name: str) -> Any:
    if name in _API:
        from resacct import api

        return getattr(api, name)
    raise AttributeError(f"module 'resacct' has no attribute {name!r}")
