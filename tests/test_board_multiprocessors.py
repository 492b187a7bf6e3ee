"""A board's multiprocessors (the datasheet's ``multiprocessors``) size the staging buffer a CUDA reduction kernel takes inside
the op (resacct/account/gpu/tracing/cuda_scratch.py): the ``--device`` answers predict it where the count is known and say
where it is not."""

from __future__ import annotations

import copy
import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from resacct.account.gpu.answers.device_answer import gpu_step_answer, reductions_text
from resacct.account.gpu.tracing.cuda_scratch import MAX_THREADS_PER_MULTIPROCESSOR, ReductionBoard, reduction_gap
from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory
from resacct.cli import main
from resacct.errors import ResacctError
from resacct.facts.hardware import _parse_accelerator, accelerator_for_cuda_name, get_accelerator, raw_accelerator_entry
from resacct.facts.recipes import get_recipe

H200_RECORD = Path(__file__).resolve().parents[1] / "docs" / "gpu" / "2026-11-30-h200-record.json.gz"


def test_the_h200_datasheet_count_is_what_torch_reported_on_the_recorded_board() -> None:
    record = json.loads(gzip.decompress(H200_RECORD.read_bytes()))
    board = accelerator_for_cuda_name(record["board"])
    assert board is not None and board.name == "h200-sxm"
    assert board.multiprocessors == record["multi_processor_count"] == 132
    assert ReductionBoard.of(board) == ReductionBoard(132, 2048)


@pytest.mark.parametrize(("name", "expected"), [("h100-sxm", (132, 2048)), ("h100-pcie", (114, 2048)), ("a100", (108, 2048)),
                                                ("v100-sxm2-16gb", (80, 2048)), ("rtx-4090", (128, 1536))])
def test_each_listed_count_meets_its_capabilitys_threads(name: str, expected: tuple[int, int]) -> None:
    board = get_accelerator(name)
    reductions = ReductionBoard.of(board)
    assert reductions is not None and (reductions.multiprocessors, reductions.max_threads_per_multiprocessor) == expected
    assert board.multiprocessors_source and reduction_gap(board) is None


def test_a_board_without_a_count_or_a_known_capability_says_so() -> None:
    l4 = get_accelerator("l4")
    assert ReductionBoard.of(l4) is None and reduction_gap(l4) == "no multiprocessor count for l4 in resacct's datasheet"
    assert reductions_text(l4).startswith("not in the peaks above (no multiprocessor count for l4")
    b300 = replace(get_accelerator("b300"), multiprocessors=160, multiprocessors_source="a test")
    assert (10, 3) not in MAX_THREADS_PER_MULTIPROCESSOR and ReductionBoard.of(b300) is None
    assert reduction_gap(b300) == "compute capability 10.3 of b300: its threads per multiprocessor are not in resacct's table"
    assert ReductionBoard.of(get_accelerator("tpu-v5p")) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"multiprocessors_source": None}, "h100-sxm.multiprocessors is given without multiprocessors_source"),
    ({"multiprocessors": None}, "h100-sxm.multiprocessors_source is given without multiprocessors"),
    ({"multiprocessors": 131.5}, "h100-sxm.multiprocessors is 131.5; expected a whole number > 0"),
    ({"multiprocessors": 0}, "h100-sxm.multiprocessors is 0; expected a whole number > 0"),
])
def test_a_count_without_its_source_or_not_a_count_is_refused(change: dict, message: str) -> None:
    entry = copy.deepcopy(raw_accelerator_entry("h100-sxm"))
    for key, value in change.items():
        if value is None:
            entry.pop(key)
        else:
            entry[key] = value
    with pytest.raises(ResacctError, match=message.replace(".", r"\.")):
        _parse_accelerator("h100-sxm", entry)


def _mlp_step() -> tuple[nn.Module, torch.Tensor]:
    """Two 768-wide Linears over 4,096 rows: each bias gradient is a sum over 4,096 rows, which stages on a board."""
    return nn.Sequential(nn.Linear(768, 768), nn.GELU(), nn.Linear(768, 768)), torch.empty(4096, 768, device="meta")


def _loss(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return module(inputs).square().mean()


def test_the_staging_moves_the_reserved_peak() -> None:
    model, inputs = _mlp_step()
    without = predict_cuda_step_memory(model, inputs, _loss, None)
    staged = predict_cuda_step_memory(model, inputs, _loss, None, reductions=ReductionBoard(132))
    # a 768-wide bias over 4,096 rows stages 25,165,824 B on 132 multiprocessors (the H200 record's `alloc 25165824`,
    # tests/test_cuda_scratch.py): a segment of its own at that moment — the reserved peak moves, the allocated one not
    assert staged.peak_allocated_bytes == without.peak_allocated_bytes
    assert staged.peak_reserved_bytes - without.peak_reserved_bytes == 25_165_824


def test_the_device_answer_predicts_the_staging_where_the_datasheet_gives_the_count() -> None:
    model, inputs = _mlp_step()
    h200 = get_accelerator("h200")
    answer = gpu_step_answer(model, inputs, _loss, recipe=get_recipe("fp32"), optimizer="adamw", board=h200)
    blind = gpu_step_answer(model, inputs, _loss, recipe=get_recipe("fp32"), optimizer="adamw",
                            board=replace(h200, multiprocessors=None, multiprocessors_source=""))
    assert answer.allocated_bytes == blind.allocated_bytes and answer.reserved_bytes > blind.reserved_bytes
    assert answer.reductions == "in the peaks above, sized by 132 multiprocessors × 2,048 threads (where the count was read: resacct devices h200-sxm)"
    assert f"  reduction kernels' staging: {answer.reductions}" in answer.lines(str)
    assert answer.to_dict()["reductions"] == answer.reductions and blind.reductions.startswith("not in the peaks above")


def test_devices_prints_the_count_and_where_it_was_read(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["devices", "h200", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)["devices"][0]
    assert fields["multiprocessors"] == 132 and "multi_processor_count" in fields["multiprocessors_source"]
    assert main(["devices", "l4"]) == 0
    assert "multiprocessors" not in capsys.readouterr().out


def test_the_answer_modules_still_load_without_torch() -> None:
    """The --device answers' modules import the reduction model only when they trace (a cached answer renders without torch)."""
    import subprocess
    import sys

    probe = ("import sys, resacct.account.gpu.answers.command_answers, resacct.account.gpu.answers.device_answer; "
             "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]
