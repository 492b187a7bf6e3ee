"""benchmarks/engine_floor.py: its three ways step the same model and its table has a row per model (the seconds
themselves are a benchmark's: nothing here asserts a speed)."""

from __future__ import annotations

import pytest

from tests.script_modules import load_script


@pytest.mark.parametrize("argv", [["--layers", "0"], ["--rounds", "0"]])
def test_nothing_to_step_is_refused_with_exit_2(argv, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        load_script("benchmarks/engine_floor.py").main(argv)
    assert stopped.value.code == 2
    assert "expected whole numbers of 1 or more" in capsys.readouterr().err


@pytest.mark.slow  # builds two transformers models and steps each three ways, twice (~3 CPU s)
def test_each_model_gets_its_three_ways_and_their_ratios(capsys) -> None:
    pytest.importorskip("transformers")
    script = load_script("benchmarks/engine_floor.py")
    assert script.main(["--layers", "1", "--rounds", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["llama-gqa", "gpt2"]
    for row in rows:
        meta, fake, resacct, resacct_over_fake, fake_over_meta = map(float, row[1:])
        assert min(meta, fake, resacct) > 0
        assert resacct_over_fake == pytest.approx(resacct / fake, rel=0.05)  # the seconds are printed to the millisecond
        assert fake_over_meta == pytest.approx(fake / meta, rel=0.05)


def test_the_resacct_way_predicts_a_peak_of_the_steps_parameters_and_state() -> None:
    """The timed resacct call is the real pass: its peak holds at least the fp32 parameters, their gradients and
    AdamW's two moments (16 bytes a parameter)."""
    pytest.importorskip("transformers")
    script = load_script("benchmarks/engine_floor.py")
    model = script._meta_model(script._configs(1)["llama-gqa"])
    parameters = sum(p.numel() for p in model.parameters())
    assert script._ways(model)["resacct"]() >= 16 * parameters
