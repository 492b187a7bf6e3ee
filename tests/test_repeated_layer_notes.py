"""A note whose numbers grow with depth (oneDNN's "30 matmul call(s) too large to probe" at 3 layers,
39 at 4, 48 at 5, on a machine whose bf16 matmuls run through oneDNN) is extrapolated like any number —
on a line through the three depths, checked on the third — instead of sending the whole account back to
every layer traced (``resacct account --hf-config llama-2-7b --recipe bf16`` traced all 32 layers on an
AMX Xeon for it: "notes[1] ... differ between depths")."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from resacct.account.peak.layer_segments import NotRepeating
from resacct.account.trace.repeated_layers import _affine_text, extrapolate_dataclass

NOTE = "bfloat16 matmuls run through oneDNN; {} matmul call(s) too large to probe (over 256 MiB or 2e+10 FLOPs) are left out"


def test_the_numbers_that_change_with_depth_are_extrapolated_and_the_others_kept() -> None:
    assert _affine_text([NOTE.format(30), NOTE.format(39), NOTE.format(48)], 32, "note") == NOTE.format(291)
    assert _affine_text(["1,024 B held, 3 kinds", "2,048 B held, 3 kinds", "3,072 B held, 3 kinds"], 80, "note") == "79,872 B held, 3 kinds"
    assert _affine_text(["depth 3", "depth 4", "depth 5"], 5, "note") == "depth 5"  # at a sample depth: that sample's text


@pytest.mark.parametrize("samples", [
    [NOTE.format(30), NOTE.format(39), NOTE.format(49)],  # off the line
    ["30 calls left out", "39 calls kept", "48 calls left out"],  # other words
    ["30 calls", "39 calls, 2 kinds", "48 calls"],  # another count of numbers
])
def test_a_note_that_does_not_repeat_is_refused(samples: list[str]) -> None:
    with pytest.raises(NotRepeating):
        _affine_text(samples, 32, "note")


@dataclass
class _Answer:
    bytes_held: int
    notes: list[str] = field(default_factory=list)


def test_an_answer_with_such_a_note_extrapolates_instead_of_failing() -> None:
    samples = [_Answer(100 + 10 * depth, ["recipe bf16", NOTE.format(3 + 9 * depth)]) for depth in (3, 4, 5)]
    assert extrapolate_dataclass(samples, 32) == _Answer(420, ["recipe bf16", NOTE.format(291)])
