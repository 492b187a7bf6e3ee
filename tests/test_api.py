"""The public Python API (``import resacct``): account_model, its report, and what it refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import resacct
from resacct.errors import ResacctError


def test_public_names_resolve_and_import_resacct_stays_light():
    assert set(resacct.__all__) == {"ResacctError", "account_model", "Quantity", "TrainingReport", "__version__"}
    for name in resacct.__all__:
        assert getattr(resacct, name) is not None
    probe = "import sys, resacct; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "False"


@pytest.mark.slow  # 0.94 s idle on 2026-11-28
def test_a_gpt_name_on_the_meta_device_predicts_what_it_measures():
    report = resacct.account_model("gpt-nano", batch=1, seq=8, recipe="mixed-adam", measure=False)
    assert report.optimizer == "adam" and report.recipe == "bf16-fp32-master"
    assert report.flops.predicted == report.flops.measured and report.flops.ratio == 1.0
    assert report.state.predicted == report.state.measured and report.state_between_steps.measured < report.state.measured
    assert report.activations.predicted == report.activations.measured
    assert report.peak.measured is None  # meta: no allocator
    assert report.render().splitlines()[0].startswith("gpt-nano: batch 1 × seq 8 = 8 tokens")
    assert report.to_dict()["recipe"] == "bf16-fp32-master"
    assert str(report).splitlines()[1].startswith("  flops                predicted ")


def test_an_example_input_is_used_as_given():
    model = torch.nn.Linear(4, 3)
    report = resacct.account_model(model, example_input=torch.randn(5, 4), optimizer="sgd")
    assert report.flops.measured == 2 * 5 * 4 * 3 * 2  # forward, and the weight gradient (no input gradient)
    assert report.state.measured == 2 * 4 * (4 * 3 + 3)  # SGD: parameters and gradients, float32
    assert report.account.input_shape == (5, 4)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: resacct.account_model(42), "model int: expected an nn.Module, a resacct.training.gpt config name or 'module:factory'"),
        (lambda: resacct.account_model(torch.nn.ReLU()), "the model ReLU has no parameters"),
        (lambda: resacct.account_model("gpt-nano", example_input=torch.zeros(1)), "example_input goes with an nn.Module"),
        (lambda: resacct.account_model(torch.nn.Linear(2, 2), recipe="2+2+12"), "bytes per parameter have no dtypes to run with"),
        (lambda: resacct.account_model(torch.nn.Linear(2, 2), recipe="mixed-adam", optimizer="sgd"), "recipe 'mixed-adam' is trained with adam"),
        (lambda: resacct.account_model(torch.nn.Linear(2, 2), recipe="fp33"), "unknown precision recipe 'fp33'; did you mean 'fp32'"),
    ],
)
def test_bad_calls_are_one_resacct_error(call, message):
    import beartype.roar
    import jaxtyping

    with pytest.raises((ResacctError, jaxtyping.TypeCheckError, beartype.roar.BeartypeException)) as error:
        call()
    if isinstance(error.value, ResacctError):
        assert message in str(error.value) and "\n" not in str(error.value)


class _TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = torch.nn.Linear(4, 3), torch.nn.Linear(2, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(y)


class _TokenModel(torch.nn.Module):  # token ids in, but the forward's argument is not called input_ids
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


@pytest.mark.parametrize("as_given", [tuple, list], ids=["tuple", "list"])
def test_a_tuple_of_inputs_is_passed_as_positional_arguments(as_given):
    """Issue 21: a tuple example_input crashed with a raw AttributeError."""
    model = _TwoInputs()
    report = resacct.account_model(model, example_input=as_given([torch.randn(5, 4), torch.randn(5, 2)]), optimizer="sgd")
    assert report.flops.measured == 2 * 5 * 3 * (4 + 2) * 2  # both Linears forward, and their weight gradients
    assert report.state.measured == 2 * 4 * (4 * 3 + 3 + 2 * 3 + 3)


def test_seq_makes_token_ids_for_a_model_with_an_embedding_first():
    """Issue 21: seq= was ignored unless the forward took input_ids."""
    report = resacct.account_model(_TokenModel(), batch=2, seq=7, optimizer="sgd")
    assert report.account.input_shape == (2, 7)
    assert report.flops.measured == 2 * 14 * 8 * 50 * 3  # the head: forward, weight and input gradients (the embedding trains); a lookup costs none


def test_input_dtype_makes_integer_inputs_from_a_shape():
    report = resacct.account_model(_TokenModel(), input_shape=(3, 5), input_dtype="int64", optimizer="sgd")
    assert report.account.input_shape == (3, 5)


@pytest.mark.parametrize(("given", "shown"), [
    ("not a tensor", "example_input is str"),
    ((torch.randn(2, 4), "x"), "example_input is a tuple of Tensor, str"),
    ({"x": 1}, "example_input is a dict of int"),
    ((), "example_input is a tuple of nothing"),
])
def test_a_bad_example_input_is_one_line_saying_what_is_expected(given, shown):
    with pytest.raises(ResacctError) as error:
        resacct.account_model(torch.nn.Linear(4, 3), example_input=given)
    message = str(error.value)
    assert message.startswith(shown) and "expected a tensor (model(x)), a tuple of tensors (model(*xs)) or a dict" in message and "\n" not in message


def test_a_missing_seq_is_worded_for_python_callers_too():
    class NoContext(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.embed(tokens)

    with pytest.raises(ResacctError, match=r"expected seq=N \(--seq N on the command line\)"):
        resacct.account_model(NoContext(), batch=2)
