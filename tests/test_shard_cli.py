"""``resacct shard``: each rank's step peak of any model under ZeRO-1/2/3, predicted on fake tensors
(resacct.account.answers.sharded) — equal, rank by rank, to the CPU allocators of real gloo ranks
running the same step (the launches resacct.checks.peak_sharded caches for the claims)."""

from __future__ import annotations

import json

import pytest
import torch

from resacct.account.peak.sharded import ENGINES, fsdp_units
from resacct.account.fit.search import ModelSource
from resacct.account.answers.sharded import ALL_RANKS_UP_TO, account_sharded_step, default_ranks
from resacct.checks import peak_sharded as checks
from resacct.cli import main
from resacct.cli.shard import ENGINE_CHOICES
from resacct.errors import ResacctError
from tests.sharded_engines import assert_phase_peaks_equal, needs_every_sharded_engine

MLP = ["--model", "resacct.account.answers.generic:mlp", "--model-arg", "dim=64", "--model-arg", "hidden=256", "--batch", "16"]
#: the launches are cached per process: on the worker that runs peak_sharded.claims.yaml (--dist loadgroup), they are shared
same_worker_as_the_claims = pytest.mark.xdist_group("claims:peak_sharded.claims.yaml")


def test_the_cli_lists_every_engine_without_importing_torch():
    assert set(ENGINE_CHOICES) == set(ENGINES) and len(ENGINE_CHOICES) == len(ENGINES)


def test_default_ranks_are_all_up_to_eight_then_the_first_two_and_the_last():
    assert default_ranks(2) == (0, 1) and default_ranks(ALL_RANKS_UP_TO) == tuple(range(ALL_RANKS_UP_TO))
    assert default_ranks(64) == (0, 1, 63)


@pytest.mark.slow
def test_fsdp_units_are_a_gpt_s_blocks_a_transformers_models_decoder_layers_else_every_linear():
    from resacct.account.answers.generic import mlp
    from resacct.training.gpt import GPT, get_gpt_config

    with torch.device("meta"):
        gpt = GPT(get_gpt_config("gpt-nano"))
        net = mlp(dim=8, hidden=16)
    assert fsdp_units(gpt) == list(gpt.blocks)
    assert fsdp_units(net) == [module for module in net if isinstance(module, torch.nn.Linear)]
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4)
    with torch.device("meta"):
        llama = transformers.LlamaForCausalLM(config)
    assert fsdp_units(llama) == list(llama.model.layers)


@pytest.mark.parametrize(("argv", "message"), [
    (["--devices", "1", *MLP], "--devices 1: expected 2 or more ranks"),
    (["--devices", "2", "--rank", "2", *MLP], "--rank 2: expected ranks 0 to 1 of --devices 2"),
    (["--devices", "2"], "exactly one of --hf-config"),
    (["--hf-config", "gpt2", "--model-arg", "dim=4"], "--model-arg apply to --model"),
    (["--engine", "zero3", *MLP], "invalid choice: 'zero3'"),
    (["--memory-gb", "0", *MLP], "--memory-gb 0: expected a memory above 0 GB"),
    (["--device", "h100", "--memory-gb", "80", *MLP], "not both"),
    (["--devices", "9", "--measure", *MLP], "expected at most 8 ranks"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    try:
        code = main(["shard", *argv])
    except SystemExit as stopped:  # argparse's own refusals
        code = stopped.code
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1, error


@pytest.mark.slow
def test_a_model_the_step_cannot_run_is_one_line():
    pytest.importorskip("transformers")  # a transformers Llama (torch 2.4: transformers 5.x cannot build it)
    with pytest.raises(ResacctError, match="seq 99999 is longer than"):
        account_sharded_step(ModelSource(factory="tests.fixtures_hf_models:tiny_llama"), engine="fsdp2", world_size=2, batch=1, seq=99999)


@pytest.mark.slow
@pytest.mark.distributed
@same_worker_as_the_claims
@needs_every_sharded_engine
@pytest.mark.parametrize("engine", ["zero1", "fsdp2"])
def test_the_cli_predicts_each_gloo_ranks_allocator_peak_to_the_byte(engine, capsys):
    """The same MLP (64 → 256 → 64, batch 16 a rank, mean loss) as the claims' launch: the command's
    prediction, through its own child process and model factory, equals each real rank's peak.
    (Not bf16: the command's mean loss upcasts a bf16 output first, the claims' MLP does not.)"""
    assert main(["shard", *MLP, "--engine", engine, "--devices", "2", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    measured = [rank["allocator"] for rank in checks.sharded_peak_measurements(2, "mlp", 16, 1)[engine]["measured"]]
    assert [rank["predicted_peak_bytes"] for rank in fields["ranks"]] == [rank["peak_bytes"] for rank in measured]
    assert [rank["peak_phase"] for rank in fields["ranks"]] == [rank["phase"] for rank in measured]
    for rank, each in zip(fields["ranks"], measured):
        assert_phase_peaks_equal(rank["phase_peak_bytes"], each["phase_peak_bytes"], engine)
    assert fields["largest_predicted_peak_bytes"] > fields["zero_formula_state_bytes"] > 0 and fields["fits"] is None


@pytest.mark.slow
@pytest.mark.distributed
@needs_every_sharded_engine
def test_measure_puts_each_gloo_ranks_allocator_beside_its_prediction_in_the_text_and_the_json(capsys):
    """``--measure`` on a transformers Llama (GQA, sdpa, its own loss; fully_shard on each decoder
    layer; made real on each rank, uninitialised): every rank's prediction equals its allocator in
    every phase; the text names each rank, what is live, the formula and the fit."""
    pytest.importorskip("transformers")
    argv = ["shard", "--model", "tests.fixtures_hf_models:tiny_llama", "--batch", "2", "--seq", "16", "--devices", "2", "--measure",
            "--memory-gb", "0.001", "--json"]
    assert main(argv) == 0
    fields = json.loads(capsys.readouterr().out)
    ranks = fields["ranks"]
    assert [rank["predicted_peak_bytes"] for rank in ranks] == [rank["measured_peak_bytes"] for rank in ranks]
    for rank in ranks:
        assert_phase_peaks_equal(rank["phase_peak_bytes"], rank["measured_phase_peak_bytes"], "fsdp2")
    assert fields["fsdp_units"] == 2 and fields["fits"] is False
    from resacct.account.answers.sharded import RankPeak, ShardedAccount
    from resacct.cli.shard import _text

    account = ShardedAccount(model=fields["model"], engine="fsdp2", engine_text=fields["engine_description"], world_size=2, batch=2, seq=16,
                             parameters=fields["parameters"], units=2, formula_state_bytes=fields["zero_formula_state_bytes"],
                             formula_text=fields["zero_formula"], seconds=fields["seconds"], notes=fields["notes"],
                             ranks=[RankPeak(rank=r["rank"], peak_bytes=r["predicted_peak_bytes"], phase=r["peak_phase"], op=r["peak_op"],
                                             where=r["peak_where"], bytes_by_kind=r["live_at_peak_bytes"], phase_peak_bytes=r["phase_peak_bytes"],
                                             start_bytes=r["start_bytes"], measured={"peak_bytes": r["measured_peak_bytes"],
                                                                                     "phase": r["measured_peak_phase"]}) for r in ranks])
    text = _text(account, 1e6, None, "decimal")
    assert [line.split(":")[0].strip() for line in text.splitlines() if line.strip().startswith("rank ")] == ["rank 0", "rank 1"]
    assert "2 FSDP units and the root" in text and "at rank " in text and "parameter shards" in text and "ratio 1.0000" in text
    assert "the ZeRO paper's state per rank (ZeRO-3: 16Ψ/N (fp32 AdamW))" in text
    assert "the largest rank does not fit" in text
