"""resacct.formulas.napkin: laws between its functions and errors that name the offending argument,
written to kill the mutants mutmut left alive (docs/mutation.md).

Napkin math has no torch measurement; the expectations here are relations between the functions
(time × rate = work) and the documented error contract ("NAME is VALUE; expected ..."), never
a restated formula.
"""

from __future__ import annotations

import pytest

from resacct.formulas import napkin
from resacct.errors import ResacctError, UnknownNameError

GOOD = {"parameters": 7e9, "tokens": 1e12, "flops_per_token_per_parameter": 6, "devices": 8, "seconds": 3600.0,
        "peak_flops_per_sec": 989.5e12, "mfu": 0.4, "total_flops": 1e23, "memory_bytes_per_device": 80e9,
        "bytes_per_parameter": 16, "tokens_per_sec": 3000.0, "run_flops": 1e24}

CALLS = {
    napkin.training_flops: ["parameters", "tokens", "flops_per_token_per_parameter"],
    napkin.flops_per_day: ["devices", "peak_flops_per_sec", "mfu"],
    napkin.cluster_flops: ["devices", "seconds", "peak_flops_per_sec", "mfu"],
    napkin.training_seconds: ["total_flops", "devices", "peak_flops_per_sec", "mfu"],
    napkin.training_days: ["total_flops", "devices", "peak_flops_per_sec", "mfu"],
    napkin.device_hours: ["total_flops", "peak_flops_per_sec", "mfu"],
    napkin.training_time: ["total_flops", "devices", "peak_flops_per_sec", "mfu"],
    napkin.max_parameters: ["devices", "memory_bytes_per_device", "bytes_per_parameter"],
    napkin.throughput_mfu: ["parameters", "tokens_per_sec", "peak_flops_per_sec", "devices", "flops_per_token_per_parameter"],
    napkin.compare_to_thresholds: ["run_flops"],
}
CASES = [(function, argument) for function, arguments in CALLS.items() for argument in arguments]


@pytest.mark.parametrize(("function", "argument"), CASES, ids=[f"{f.__name__}-{a}" for f, a in CASES])
def test_a_bad_argument_is_named_in_the_error(function, argument):
    kwargs = {name: GOOD[name] for name in CALLS[function]}
    function(**kwargs)  # the good values are accepted
    for bad in (-1.0, 0, float("nan"), float("inf")):
        with pytest.raises(ResacctError, match=rf"^{argument} is {bad!r}; expected "):
            function(**{**kwargs, argument: bad})


def test_cluster_flops_at_an_mfu_is_the_work_training_seconds_takes_that_long_for():
    for mfu in (0.25, 0.5, 1.0):
        work = napkin.cluster_flops(devices=8, seconds=3600, peak_flops_per_sec=1e15, mfu=mfu)
        assert napkin.training_seconds(work, devices=8, peak_flops_per_sec=1e15, mfu=mfu) == pytest.approx(3600)
    assert napkin.cluster_flops(8, 3600, 1e15, 0.5) == pytest.approx(napkin.cluster_flops(8, 3600, 1e15) / 2)


def test_unknown_threshold_names_the_kind_and_the_known_keys():
    with pytest.raises(UnknownNameError, match=r"^unknown compute threshold 'eu'.*eu_ai_act") as error:
        napkin.get_threshold("eu")
    assert error.value.kind == "compute threshold"
    for key in error.value.known:
        assert napkin.get_threshold(key).key == key
