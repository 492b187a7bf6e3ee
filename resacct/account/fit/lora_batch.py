"""``resacct lora``'s largest batch by few traces: the LoRA step's predicted peak
(:mod:`resacct.account.trace.lora_step`: peft on the model built on meta, the whole step on fake
tensors) searched as ``fit`` searches it (:func:`resacct.account.fit.lines.largest_fitting`) —
the peaks at batch 1 and at a second batch give each phase's line, its answer ``b`` is traced and
``b + 1`` too: ``b`` fits and ``b + 1`` does not, both traced, never estimated. The second batch is
what one trace says (the budget over the peak's growth per sequence): where that is ``b`` already,
``b + 1`` is the only other trace. Where the peak is not
affine in the batch (another phase takes the peak over) the search goes on from the probes made.
The command's own batch (1 by default) is reused, not traced again, and is the search's first size
(where it fits, so does every smaller batch: batch 1 is not traced): two traces where one trace's
guess is the answer, three where the line through it names another (up to 64 × the guess: one more
per × 64 beyond, as in ``fit``). The peft model is built once for the search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from resacct.account.fit.lines import FitProbe, affine_deviation_bytes, largest_fitting, probed_peak_bytes

__all__ = ["LoraBatchAnswer", "MAX_LORA_BATCH", "largest_lora_batch", "lora_batch_peaks"]

#: The largest batch the search tries (a bound on its growth, not a property of any model): fit's.
MAX_LORA_BATCH = 1 << 20


@dataclass(frozen=True)
class LoraBatchAnswer:
    """The largest batch whose predicted LoRA step peak is within ``budget_bytes`` (0: not even 1),
    every probe of the search (``traced``: how many of them were traced here, the rest reused)."""

    largest: int
    budget_bytes: float
    probes: tuple[FitProbe, ...]
    traced: int
    limit: int
    #: where the search gave up tracing three depths for a deep stack of layers, why (None: it did not)
    layers_note: str | None = None

    @property
    def peak_bytes(self) -> int | None:
        """The predicted step peak at the answer (None: not even batch 1 fits)."""
        return probed_peak_bytes(self.probes, self.largest) if self.largest else None

    @property
    def next_peak_bytes(self) -> int | None:
        """The predicted step peak at one batch more than the answer (None: the answer is the limit)."""
        return probed_peak_bytes(self.probes, self.largest + 1)

    @property
    def checked(self) -> bool:
        """The answer fits and one more does not, both traced (or the answer is the search's limit)."""
        fits = self.largest == 0 or (self.peak_bytes is not None and self.peak_bytes <= self.budget_bytes)
        over = self.largest == self.limit or (self.next_peak_bytes is not None and self.next_peak_bytes > self.budget_bytes)
        return fits and over

    def to_dict(self) -> dict[str, Any]:
        """``--json``: the search's probes, peaks in bytes (no seconds: the same question, the same answer)."""
        return {"budget_bytes": self.budget_bytes, "largest": self.largest, "checked": self.checked, "traces": self.traced,
                "limit": self.limit, "layers_note": self.layers_note, "predicted_peak_bytes": self.peak_bytes, "next_predicted_peak_bytes": self.next_peak_bytes,
                "affine_deviation_bytes": affine_deviation_bytes(list(self.probes)),
                "probes": [{"batch": p.size, "predicted_peak_bytes": p.peak_bytes, "fits": p.fits} for p in self.probes]}

    def text(self, why_none: str = "") -> str:
        """How the answer was found, for the command's line: the traces and the two that check it;
        where not even batch 1 fits, ``why_none`` (the command's reason) in the same parentheses."""
        if self.largest == 0:
            return "(traced: batch 1's step peak is over the budget" + (f"; {why_none}" if why_none else "") + ")"
        past = f"batch {self.largest + 1} does not" if self.next_peak_bytes is not None else "the search's limit"
        reused = len(self.probes) - self.traced
        return (f"(checked: batch {self.largest}'s traced step peak fits, {past}; {self.traced} trace{'s' * (self.traced != 1)}"
                + (f" + {reused} reused" if reused else "") + f" at batches {', '.join(str(p.size) for p in self.probes)})")


def lora_batch_peaks(config: Any, *, rank: int, targets: tuple[str, ...], base: str, seq: int, dropout: float = 0.0,
                     gradient_checkpointing: bool = False, model: Any = None, layers: str = "auto",
                     said: dict[str, str] | None = None) -> Callable[[int], Any]:
    """``peak_of(batch)``: the predicted peak (:class:`~resacct.account.peak.models.PredictedStepPeak`)
    of the LoRA step at ``batch`` × ``seq`` — the step traced on fake tensors a call
    (:func:`~resacct.account.trace.lora_layers.lora_step_peak`: the whole model, or a deep stack of
    identical layers at depths 3, 4 and 5, as ``layers`` plans it), the peft model(s) built on meta at
    the first (``model``: a :class:`~resacct.account.trace.lora_step.LoraStep`'s, already built). A batch
    whose three depths do not repeat is traced whole, and every batch after it (``said["how"]`` says why)."""
    from resacct.account.trace.lora_layers import ShallowLoraModels, lora_layer_plan, lora_step_peak
    from resacct.account.trace.lora_step import adamw_over, build_lora_model, lora_loss, lora_step_inputs

    built: list[Any] = [] if model is None else [model]

    def build(config_at_depth: Any) -> Any:
        return build_lora_model(config_at_depth, rank=rank, targets=targets, base=base, dropout=dropout, gradient_checkpointing=gradient_checkpointing)

    def peak_of(batch: int) -> Any:
        if not built:
            plan = lora_layer_plan(config, layers)
            if plan.sample:
                from resacct.account.load.hf_models import config_with_depth

                built.append(ShallowLoraModels(plan.depth, tuple(build(config_with_depth(config, count)) for count in plan.sample_layers()), plan.prefix,
                                               plan.period))
            else:
                built.append(build(config))
        def inputs_of(size: int) -> Any:
            return lora_step_inputs(config, batch=size, seq=seq)

        if isinstance(built[0], ShallowLoraModels):
            from resacct.account.peak.layer_segments import NotRepeating

            try:
                return lora_step_peak(built[0], inputs_of, lora_loss, adamw_over, batch)
            except NotRepeating as error:
                if said is not None:
                    said["how"] = f"every layer traced: at batch {batch} the layers did not repeat ({error})"
                built[0] = build(config)
        return lora_step_peak(built[0], inputs_of, lora_loss, adamw_over, batch)

    return peak_of


def largest_lora_batch(config: Any, *, rank: int, targets: tuple[str, ...], base: str, seq: int, budget_bytes: float,
                       dropout: float = 0.0, gradient_checkpointing: bool = False, known: dict[int, Any] | None = None,
                       model: Any = None, limit: int = MAX_LORA_BATCH, layers: str = "auto",
                       on_probe: Callable[[FitProbe], None] | None = None, on_probe_start: Callable[[int], None] | None = None) -> LoraBatchAnswer:
    """The largest batch (at most ``limit``) whose LoRA step (see :func:`lora_batch_peaks`) peaks within
    ``budget_bytes``, by :func:`~resacct.account.fit.lines.largest_fitting`; ``known``: predicted peaks
    already traced, by batch (reused); ``model``: the peft model on meta (or the three shallow ones), if
    already built; ``layers``: how a deep stack is traced when the models are built here (:func:`lora_batch_peaks`);
    ``on_probe``: called with each probe traced here, as it is made (the command's progress lines); ``on_probe_start``: told
    of each batch before it is traced here (``lora --device`` traces the board's step there beside it)."""
    import warnings

    from resacct.account.fit.search import phase_peaks_bytes

    peaks: dict[int, Any] = dict(known or {})
    said: dict[str, str] = {}
    reused = set(peaks)
    trace = lora_batch_peaks(config, rank=rank, targets=targets, base=base, seq=seq, dropout=dropout,
                             gradient_checkpointing=gradient_checkpointing, model=model, layers=layers, said=said)

    def peak_of(batch: int) -> int:
        if batch not in peaks:
            if on_probe_start is not None:
                on_probe_start(batch)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # transformers' and peft's, as in the traced step
                peaks[batch] = trace(batch)
        return int(peaks[batch].peak_bytes)

    first = min((batch for batch in peaks if batch <= limit), default=1)  # the command's own batch: the line runs through it
    largest, probes = largest_fitting(peak_of, budget_bytes, limit=limit, phase_peaks_of=lambda batch: phase_peaks_bytes(peaks[batch]),
                                      second=_one_trace_guess(peaks, budget_bytes), first=first,
                                      on_probe=None if on_probe is None else lambda probe: None if probe.size in reused else on_probe(probe))
    return LoraBatchAnswer(largest=largest or 0, budget_bytes=budget_bytes, probes=tuple(probes),
                           traced=sum(probe.size not in reused for probe in probes), limit=limit, layers_note=said.get("how"))


def _one_trace_guess(peaks: dict[int, Any], budget_bytes: float) -> int:
    """The search's second batch: what one traced step says — (budget − the step's start) ÷ its peak's
    growth per sequence at its batch (the first of ``peaks``; 2 without one, or where that says less).
    Where it is the answer, two traces settle it: it fits and one more does not."""
    for batch, predicted in peaks.items():
        start = predicted.timeline.start_bytes
        growth = (predicted.peak_bytes - start) / batch
        if growth > 0:
            return max(2, min(MAX_LORA_BATCH, int((budget_bytes - start) // growth)))
    return 2
