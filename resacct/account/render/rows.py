"""The rows every account is laid out in — ``resacct account``'s table and ``--json`` — shared by
the GPT path (:mod:`resacct.account.render.step_account`), any module (:mod:`resacct.account.answers.generic`) and
Hugging Face configs (:mod:`resacct.account.answers.hf`): one :class:`Row` per quantity, predicted beside
measured, and the JSON sections built from them (units in the field names).

>>> row = Row("FLOPs", "step", 100, 100, "FLOPs", "FlopCounterMode")
>>> row.ratio, sections_of([row])
(1.0, {'flops': [{'quantity': 'step', 'predicted_flops': 100, 'measured_flops': 100, 'ratio': 1.0, 'note': 'FlopCounterMode'}]})
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Row", "ModuleRow", "json_key", "UNIT_SUFFIX", "sections_of", "traced_flops_note"]


@dataclass(frozen=True)
class Row:
    """One line of the account: ``measured / predicted`` is the ratio (1.000 when exact)."""

    section: str
    quantity: str
    predicted: float | None
    measured: float | None
    unit: str
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.predicted in (None, 0) or self.measured is None:
            return None
        return self.measured / self.predicted


@dataclass(frozen=True)
class ModuleRow:
    """FLOPs and saved bytes of one module (its own, children apart); predicted None: no formula."""

    module: str
    predicted_forward_flops: int | None
    traced_forward_flops: int
    predicted_backward_flops: int | None
    traced_backward_flops: int
    predicted_saved_bytes: int | None
    measured_saved_bytes: int


def json_key(text: str) -> str:
    """A section or unit as a JSON key: ``"training state"`` → ``training_state``."""
    cleaned = "".join(ch if ch.isalnum() else "_" for ch in text.lower())
    return "_".join(part for part in cleaned.split("_") if part)


UNIT_SUFFIX = {"FLOPs": "flops", "bytes": "bytes", "B/param": "bytes_per_parameter", "s": "sec", "FLOP/s": "flops_per_sec", "days": "days", "": "fraction"}


def sections_of(rows: Iterable[Row]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by section for JSON: ``predicted_<unit>``, ``measured_<unit>``, ``ratio``, ``note``."""
    sections: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        unit = UNIT_SUFFIX.get(row.unit, json_key(row.unit))
        sections.setdefault(json_key(row.section), []).append(
            {"quantity": row.quantity, f"predicted_{unit}": row.predicted, f"measured_{unit}": row.measured, "ratio": row.ratio, "note": row.note})
    return sections


def traced_flops_note(flops: Any, *, counter: str = "FlopCounterMode", whole_step: bool = False) -> str:
    """Where a traced FLOP figure comes from: ``counter`` alone; FlopCounterMode plus what resacct
    filled in from the sdpa calls' shapes for a fused attention kernel it counts as 0 (how much of
    the step, on the ``whole_step`` row); or nothing traced (a step that could not run).

    >>> from resacct.account.trace.step_measurements import StepFlopTrace
    >>> traced_flops_note(StepFlopTrace(300, 600, {}, {}), counter="FlopCounterMode (matmuls)")
    'FlopCounterMode (matmuls)'
    >>> traced_flops_note(StepFlopTrace(300, 600, {}, {}, gap_filled_flops=96), whole_step=True)
    "FlopCounterMode + resacct's sdpa fill (96 of 900 FLOPs)"
    """
    if flops.step_flops is None:
        return "not traced (see the note)"
    if not flops.gap_filled_flops:
        return counter
    filled = "FlopCounterMode + resacct's sdpa fill"
    return f"{filled} ({flops.gap_filled_flops:,} of {flops.step_flops:,} FLOPs)" if whole_step else filled
