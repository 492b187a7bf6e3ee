"""Which sharded engines this torch traces (resacct.account.peak.sharded_gaps), for the tests that launch or predict them."""

from __future__ import annotations

import pytest


def sharded_gap(*engines: str) -> str | None:
    """Why one of ``engines`` (default: every engine) cannot be traced on this torch, or None."""
    from resacct.account.peak.sharded import ENGINES, engine_gap

    return next((gap for engine in engines or ENGINES if (gap := engine_gap(engine)) is not None), None)


#: Skips a test where some sharded engine is not traced (torch 2.6: none is; 2.4: no FSDP2 at all), saying why.
needs_every_sharded_engine = pytest.mark.skipif(sharded_gap() is not None, reason=f"{sharded_gap()}")


#: torch 2.7 to 2.9 (measured 2026-11-30): the gloo ranks' CPU allocators see 8 bytes more in FSDP's optimizer step than
#: the prediction (AdamW over DTensors; 2.10 on: none). The step's peak is elsewhere (the backward or forward), exact.
FSDP_OPTIMIZER_STEP_UNMODELLED_BYTES_BEFORE_2_10 = 8


def assert_phase_peaks_equal(predicted: dict, measured: dict, engine: str) -> None:
    """Each phase's peak predicted equals the allocator's, to the byte — but for FSDP's optimizer step on torch 2.7 to
    2.9, which is up to :data:`FSDP_OPTIMIZER_STEP_UNMODELLED_BYTES_BEFORE_2_10` under."""
    import torch

    if engine == "zero1" or torch.__version__ >= (2, 10):
        assert predicted == measured, engine
        return
    assert {phase: peak for phase, peak in predicted.items() if phase != "optimizer step"} == \
        {phase: peak for phase, peak in measured.items() if phase != "optimizer step"}, engine
    assert 0 <= measured["optimizer step"] - predicted["optimizer step"] <= FSDP_OPTIMIZER_STEP_UNMODELLED_BYTES_BEFORE_2_10, engine


def fsdp2_peaks_elsewhere() -> bool:
    """torch 2.12 (measured 2026-11-30 on 2.12.1): FSDP2's step peaks in the backward with both layers' reduce-scatter inputs
    live and no layer gathered, and its backward runs different ops at the same point of different depths — a
    ``--layers sampled`` account traces every layer, saying so. Every other torch from 2.7 peaks with one layer gathered."""
    import torch
    from packaging.specifiers import SpecifierSet

    return SpecifierSet("==2.12.*").contains(torch.__version__, prereleases=True)


def assert_sampled_or_said_why(notes: list[str], sampled: str, layers: int) -> None:
    """A ``--layers sampled`` sharded account's notes: traced at the sample depths (``sampled``, the note's start) —
    or, on the torch whose FSDP2 backward is not always the same at every depth (:func:`fsdp2_peaks_elsewhere`; 2.12.1:
    the 7-layer Llama and the 9-layer DeepSeek-V3 are not, the 12-layer Gemma-2 is), every layer traced, saying why."""
    if fsdp2_peaks_elsewhere() and not any(note.startswith(sampled) for note in notes):
        assert any(note.startswith(f"all {layers} layers traced: segment") and "different ops at different depths" in note for note in notes), notes
    else:
        assert any(note.startswith(sampled) for note in notes), notes
