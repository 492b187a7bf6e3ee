"""Within one test process, the same LoRA step of a 7B is traced once (issue 34, quick tier).

``resacct lora --hf-config llama-2-7b ...`` traces the whole step on fake tensors
(:func:`resacct.account.trace.lora_step.trace_lora_step`: ~13 CPU s, more under the type-checking hook),
and a dozen quick-tier tests ask the command the same question several times over — with and
without ``--json``, ``--units binary``, ``--memory-gb 24`` or a 24 GB board's name. Those flags
change what the command prints, never what it traces, so the fixture :func:`memoized_lora_trace`
keeps each traced step by its whole question: the config's values and every keyword argument. A
different rank, target list, base, batch, sequence length, dropout or checkpointing is a different
key and is traced afresh. The largest-batch search's peaks (:func:`resacct.account.fit.lora_batch.lora_batch_peaks`)
are kept the same way, by question and batch. :class:`~resacct.account.trace.lora_step.LoraStep` is a frozen dataclass; the
command only reads it.

The tests that use it run in one xdist group (``lora-7b``), so each question is traced once per run
instead of once per worker that happens to get one of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = ["INFER_8B_GROUP", "LORA_7B_GROUP", "memoized_infer_gpu_answer", "memoized_lora_trace", "question_key"]

LORA_7B_GROUP = "lora-7b"
INFER_8B_GROUP = "infer-8b"

_TRACED: dict[tuple[Any, ...], Any] = {}


def question_key(config: Any, keywords: dict[str, Any]) -> tuple[Any, ...]:
    """The whole question: the config's values (as transformers writes them; a shipped config's name as
    given) and every keyword (a board by its dataclass repr: every field)."""
    values = config if isinstance(config, str) else config.to_json_string(use_diff=False)
    return (type(config).__name__, values, tuple(sorted((name, repr(value)) for name, value in keywords.items())))


def _memoized(function: Callable[..., Any], calls: list[tuple[Any, ...]]) -> Callable[..., Any]:
    @functools.wraps(function)
    def traced_once(config: Any, **keywords: Any) -> Any:
        key = question_key(config, keywords)
        calls.append(key)
        if key not in _TRACED:
            _TRACED[key] = function(config, **keywords)
        return _TRACED[key]

    return traced_once


@pytest.fixture
def memoized_lora_trace(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """``trace_lora_step`` answers a question it has traced before in this process from memory; yields
    the keys asked for during the test (the memo's own test reads them)."""
    from resacct.account.fit import lora_batch
    from resacct.account.trace import lora_step

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(lora_step, "trace_lora_step", _memoized(lora_step.trace_lora_step, calls))
    monkeypatch.setattr(lora_batch, "lora_batch_peaks", _memoized_peaks(lora_batch.lora_batch_peaks))
    yield calls


_PEAKS: dict[tuple[Any, ...], Any] = {}


def _memoized_peaks(function: Callable[..., Any]) -> Callable[..., Any]:
    """``lora_batch_peaks`` whose ``peak_of(batch)`` answers a batch of the same question traced before
    in this process (the largest-batch search of ``lora --memory-gb``) from memory (kept apart from
    ``_TRACED``: a peak is not a traced step)."""
    @functools.wraps(function)
    def peaks(config: Any, *, model: Any = None, **keywords: Any) -> Callable[[int], Any]:
        fresh = function(config, model=model, **keywords)

        def peak_of(batch: int) -> Any:
            key = question_key(config, {**keywords, "batch": batch})
            if key not in _PEAKS:
                _PEAKS[key] = fresh(batch)
            return _PEAKS[key]

        return peak_of

    return peaks


@pytest.fixture
def memoized_infer_gpu_answer(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """``infer --device BOARD``'s traced prefill (:func:`resacct.account.gpu.answers.command_answers.infer_gpu_answer`,
    a frozen ``GpuStepAnswer``) answered from memory for a question asked before: the same config name,
    batch, context, formats and board; ``--json`` and ``--units`` change only what is printed."""
    from resacct.account.gpu.answers import command_answers

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(command_answers, "infer_gpu_answer", _memoized(command_answers.infer_gpu_answer, calls))
    yield calls
