"""What a check that builds transformers models needs before it measures: transformers importable and
usable with this torch — else the claim is skipped (``NotMeasurable``) with the reason, not failed."""

from __future__ import annotations

import os

from resacct.harness.registry import NotMeasurable

__all__ = ["NO_TRANSFORMERS", "require_transformers"]

NO_TRANSFORMERS = "transformers is not installed (the optional extra: pip install 'resacct[hf]')"


def require_transformers() -> None:
    """Raise ``NotMeasurable`` where transformers is missing or unusable with this torch (hub lookups off: nothing downloads)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from resacct.measurement.torch_limits import transformers_unusable

    if problem := transformers_unusable():
        raise NotMeasurable(problem)
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise NotMeasurable(NO_TRANSFORMERS) from None
