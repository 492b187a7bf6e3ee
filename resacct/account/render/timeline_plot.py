"""``resacct account --timeline step.png``: the memory of one training step over time — resacct's
prediction (fake tensors) and, where the step ran on the CPU, the allocator's measurement — with
the phases marked and the peak annotated with what is live at it (matplotlib, no display needed).

Each phase gets an equal band of the x axis; inside it, the events of each timeline are spread
evenly (the predicted one counts aten ops, the measured one allocator events, so only the
phases line up, not single events).

>>> import tempfile, torch, pathlib
>>> from resacct.account.peak.step_peak import predict_step_peak
>>> model = torch.nn.Linear(8, 4)
>>> predicted = predict_step_peak(model, torch.ones(2, 8), lambda m, x: m(x).sum(), lambda p: torch.optim.AdamW(p, lr=1e-3))
>>> path = pathlib.Path(tempfile.mkdtemp()) / "step.png"
>>> write_timeline_png(path, predicted, None, title="Linear(8, 4)")
>>> path.read_bytes()[:4] == b"\\x89PNG"
True
"""

from __future__ import annotations

from pathlib import Path

from resacct.account.peak.step_peak import PredictedStepPeak
from resacct.errors import ResacctError
from resacct.measurement.memory_timeline import STEP_PHASES, MemoryTimeline

__all__ = ["write_timeline_png", "check_timeline_path", "phase_positions", "write_reference_step_timeline_png", "REFERENCE_STEP"]

#: the step drawn in verify's report (step-timeline.png): a :data:`resacct.account.peak.models.PEAK_MODELS` name, batch, seq
REFERENCE_STEP = ("gpt-sdpa", 4, 32)


def check_timeline_path(path: str | Path) -> Path:
    """The PNG path ``--timeline`` names, refused with one line when it cannot be written.

    >>> check_timeline_path("/no/such/folder/step.png")
    Traceback (most recent call last):
    resacct.errors.ResacctError: --timeline /no/such/folder/step.png: folder /no/such/folder does not exist; expected a .png path in an existing folder
    """
    chosen = Path(path)
    if chosen.suffix.lower() != ".png":
        raise ResacctError(f"--timeline {path}: expected a path ending in .png (e.g. step.png)")
    if not chosen.parent.is_dir():
        raise ResacctError(f"--timeline {path}: folder {chosen.parent} does not exist; expected a .png path in an existing folder")
    if chosen.is_dir():
        raise ResacctError(f"--timeline {path}: is a folder; expected a .png file path")
    return chosen


def phase_positions(timeline: MemoryTimeline) -> list[float]:
    """x of each point: phase ``i`` of :data:`STEP_PHASES` spans [i, i + 1), its points evenly inside.

    >>> t = MemoryTimeline(("forward", "forward", "backward"), (1, 2, 3), 0, 3, "backward", "test")
    >>> phase_positions(t)
    [0.0, 0.5, 1.0]
    """
    counts = {phase: timeline.phases.count(phase) for phase in STEP_PHASES}
    seen = dict.fromkeys(STEP_PHASES, 0)
    positions = []
    for phase in timeline.phases:
        index = STEP_PHASES.index(phase)
        positions.append(index + seen[phase] / max(counts[phase], 1))
        seen[phase] += 1
    return positions


def write_timeline_png(path: str | Path, predicted: PredictedStepPeak | None, measured: MemoryTimeline | None, *, title: str) -> None:
    """Draw the step's memory (MB) over its phases to ``path``: predicted (solid), measured (dashed),
    the peak marked and labelled with the phase, op and the three largest kinds live at it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if predicted is None and measured is None:
        raise ResacctError("--timeline: nothing to draw (no predicted and no measured timeline); expected a step resacct could predict or run")
    figure, axes = plt.subplots(figsize=(10, 5))
    for index, phase in enumerate(STEP_PHASES):
        axes.axvspan(index, index + 1, color=("#f2f2f2" if index % 2 else "#ffffff"), zorder=0)
        axes.text(index + 0.5, 1.0, phase, transform=axes.get_xaxis_transform(), ha="center", va="bottom", fontsize=9)
    if predicted is not None:
        timeline = predicted.timeline
        axes.step(phase_positions(timeline), [value / 1e6 for value in timeline.bytes_held], where="post", color="#1f77b4",
                  label="predicted: resacct, fake CPU tensors", linewidth=1.6)
        peak_x = phase_positions(timeline)[timeline.bytes_held.index(max(timeline.bytes_held))]
        kinds = sorted(predicted.peak.bytes_by_kind.items(), key=lambda item: -item[1])[:3]
        label = (f"predicted peak {predicted.peak_bytes / 1e6:,.3f} MB\nat {predicted.peak.phase}: {predicted.peak.op}\n"
                 + "\n".join(f"{kind}: {value / 1e6:,.3f} MB" for kind, value in kinds))
        axes.annotate(label, xy=(peak_x, predicted.peak_bytes / 1e6), xytext=(0.02, 0.55), textcoords="axes fraction", fontsize=8,
                      arrowprops={"arrowstyle": "->", "color": "#1f77b4"}, bbox={"boxstyle": "round", "fc": "white", "ec": "#1f77b4"})
    if measured is not None:
        axes.step(phase_positions(measured), [value / 1e6 for value in measured.bytes_held], where="post", color="#d62728",
                  linestyle="--", label=f"measured: CPU allocator, peak {measured.peak_bytes / 1e6:,.3f} MB", linewidth=1.2)
    axes.set_xlim(0, len(STEP_PHASES))
    axes.set_xticks([])
    axes.set_ylabel("memory held (MB)")
    axes.set_title(title, pad=18, fontsize=10)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_reference_step_timeline_png(path: str | Path) -> Path:
    """``resacct verify``'s step-timeline.png: one AdamW step of :data:`REFERENCE_STEP` (gpt-nano,
    sdpa) predicted on fake tensors beside the CPU allocator's measurement of the same step, in the
    same run — what the peak claims check, as a picture (about a second)."""
    import torch

    from resacct.account.peak.step_peak import measure_step_peak, predict_step_peak
    from resacct.account.peak.models import PEAK_MODELS, peak_model

    name, batch, seq = REFERENCE_STEP
    model, inputs, loss_fn = peak_model(name, batch=batch, seq=seq)

    def adamw(parameters: list) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=1e-3)

    predicted = predict_step_peak(model, inputs, loss_fn, adamw)
    measured = measure_step_peak(model, inputs, loss_fn, adamw)
    agreement = "equal to the byte" if predicted.peak_bytes == measured.peak_bytes else f"{predicted.peak_bytes / measured.peak_bytes:.4f}× measured"
    write_timeline_png(path, predicted, measured, title=f"one AdamW step of {name} ({PEAK_MODELS[name].split(',')[0]}), "
                                                         f"batch {batch} × {seq} tokens: predicted peak {agreement}")
    return Path(path)
