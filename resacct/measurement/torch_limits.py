"""Known limits of a torch version's own measuring tools, named when a check runs into one: the
claim is then *not measurable here* (a skip naming the limit), never a failure of the claim.

- torch 2.11's ``FlopCounterMode`` asserts in ``sdpa_flop_count`` ("query/key/value shapes are
  incompatible") on ``scaled_dot_product_attention`` with grouped-query attention (fewer key/value
  heads than query heads, as Llama, Mistral and Mixtral use); torch 2.12.1 and later count it. Seen on the GPU
  tier's H100 (torch 2.11.0+cu130), 2026-11-26; torch 2.8 and 2.9 assert the same without a message (the H200
  record's grouped-query steps predicted there, 2026-11-30).
- transformers 5.x needs torch >= 2.6 (its ``torch`` extra): under an older torch it imports but
  disables PyTorch, and its model classes (and peft, which imports them) fail. Seen with torch 2.4.1
  and transformers 5.24.0, 2026-11-28: :func:`transformers_unusable` names the two versions.
"""

from __future__ import annotations

import functools
import importlib.metadata

import torch

__all__ = ["torch_limitation", "transformers_unusable", "gqa_attention_flops_countable", "GQA_FLOPS_LIMIT"]

#: (function in torch's traceback, text of the assertion) → what cannot be measured.
_GQA_FLOPS = ("FlopCounterMode cannot count scaled_dot_product_attention with grouped-query attention (fewer key/value heads than "
              "query heads); torch 2.12.1 and later can (docs/matrix.md)")
def _named(what: str) -> str:
    """A limit as a skip or a gap names it: this torch's version, then what it cannot do."""
    return f"torch {torch.__version__}'s {what}"


GQA_FLOPS_LIMIT = _named(_GQA_FLOPS)
_KNOWN = (("sdpa_flop_count", "query/key/value shapes are incompatible", _GQA_FLOPS),
          ("sdpa_flop_count", "", _GQA_FLOPS))  # torch 2.8 and 2.9: the same assertion, without its message


def torch_limitation(error: BaseException) -> str | None:
    """The known torch limit ``error`` comes from (an AssertionError raised inside torch), or None.

    >>> def sdpa_flop_count():
    ...     raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
    >>> try:
    ...     sdpa_flop_count()
    ... except AssertionError as error:
    ...     torch_limitation(error).startswith(f"torch {torch.__version__}'s FlopCounterMode cannot count")
    True
    >>> def sdpa_flop_count():  # torch 2.8 and 2.9: a bare assert
    ...     assert 2 == 4
    >>> try:
    ...     sdpa_flop_count()
    ... except AssertionError as error:
    ...     torch_limitation(error).endswith("torch 2.12.1 and later can (docs/matrix.md)")
    True
    """
    if not isinstance(error, AssertionError):
        return None
    frames, traceback = [], error.__traceback__
    while traceback is not None:
        frames.append(traceback.tb_frame.f_code.co_name)
        traceback = traceback.tb_next
    for function, text, what in _KNOWN:
        if function in frames[-3:] and (text in str(error) if text else not str(error).strip()):  # "": a bare assert only
            return _named(what)
    return None


def transformers_unusable() -> str | None:
    """Why the installed transformers cannot build models with this torch (the torch its ``torch``
    extra asks for is newer), or None: also None when transformers is not installed (an import
    says that). Reads the distribution's metadata once a process (a one-process verify asked 263
    times: 0.82 CPU s reading each time, 0.02 once; issue 34); nothing is imported. Every HF claim
    asks, so the verdict on what was read is kept per process too (parsing its ~240 requirements was
    ~15 ms a call)."""
    installed = _installed_transformers()
    return None if installed is None else _unusable_under(*installed, torch.__version__)


@functools.cache
def _installed_transformers() -> tuple[str, tuple[str, ...]] | None:
    """(version, requirements) of the installed transformers distribution, read once a process: a
    package installed or upgraded under a running process is not what it imported either."""
    try:
        return importlib.metadata.version("transformers"), tuple(importlib.metadata.requires("transformers") or ())
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=32)
def _unusable_under(version: str, requirements: tuple[str, ...], torch_version: str) -> str | None:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    try:
        installed = Version(torch_version)
    except InvalidVersion:
        return None
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.name != "torch" or (requirement.marker is not None and not requirement.marker.evaluate({"extra": "torch"})):
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            return (f"transformers {version} needs torch{requirement.specifier} and this torch is {torch_version} "
                    f"(transformers disables PyTorch under it); expected torch{requirement.specifier} for the HF models")
    return None


@functools.lru_cache(maxsize=1)
def gqa_attention_flops_countable() -> bool:
    """Whether this torch's FLOP counter counts attention with fewer key/value heads than query heads: its own
    ``sdpa_flop_count`` asked once on such shapes (torch 2.8 to 2.11 assert; 2.12.1 and later count). The tests that trace
    a grouped-query model's attention with its FLOPs counted skip on it; the commands name the limit from the error
    (:func:`torch_limitation`)."""
    from torch.utils import flop_counter

    count = getattr(flop_counter, "sdpa_flop_count", None)
    if count is None:
        return False
    try:
        count((1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16))
    except AssertionError:
        return False
    return True
