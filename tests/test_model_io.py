"""resacct.account.load.model_io: the inputs resacct builds for any model (made where the model is: nothing
on the CPU for a meta model) and the loss it reads from any output."""

from __future__ import annotations

import resource

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from resacct.account.answers.generic import account_named_model
from resacct.errors import ResacctError
from resacct.account.load.model_io import default_inputs, loss_of_output, output_tensor, resolve_loss


class _CpuTensorsMade(TorchDispatchMode):
    """Bytes of every CPU tensor an op returns (a meta model's step must make none of size)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest_cpu_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        for value in result if isinstance(result, (tuple, list)) else (result,):
            # the predicted step peak runs on fake CPU tensors (FakeTensorMode): they own no memory
            if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not isinstance(value, FakeTensor):
                self.largest_cpu_bytes = max(self.largest_cpu_bytes, value.numel() * value.element_size())
        return result


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def test_a_meta_account_of_a_huge_batch_allocates_no_input_on_the_cpu():
    """Issue 12: 2.7 GB of RSS for a big batch "on meta". An MLP of width 64 on 2**23 rows would
    take a 2 GiB float32 input on the CPU; on meta the whole account makes no CPU tensor above
    1 MiB and the process's peak RSS grows by less than 256 MiB."""
    batch = 2**23
    assert batch * 64 * 4 == 2 * 2**30
    before = _max_rss_bytes()
    with _CpuTensorsMade() as made:
        account = account_named_model("resacct.account.answers.generic:mlp", model_args={"dim": 64, "hidden": 64}, batch=batch, measure=False)
    assert account.device == "meta" and account.input_shape == (batch, 64)
    assert account.saved.activation_bytes == account.predicted.saved_bytes == 4 * batch * (64 + 2 * 64)  # sizes still measured
    assert made.largest_cpu_bytes < 2**20
    assert _max_rss_bytes() - before < 256 * 2**20


def test_default_inputs_of_a_linear_first_model_follow_batch_and_seq():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    assert default_inputs(model, batch=2).shape == (2, 8)
    assert default_inputs(model, batch=2, seq=5).shape == (2, 5, 8)
    assert default_inputs(model, batch=2, input_shape=(3, 8), input_dtype="int64").dtype == torch.int64
    with pytest.raises(ResacctError, match="more than a torch tensor can hold"):
        default_inputs(model, batch=2**62, seq=4, device="meta")


def test_outputs_of_every_shape_give_their_tensor_or_their_loss():
    logits = torch.ones(2, 3, requires_grad=True)

    class Output:  # a transformers ModelOutput has attributes
        def __init__(self, loss):
            self.loss, self.logits = loss, logits

    own = (logits * 2).mean()
    assert output_tensor((logits, "cache")) is logits and output_tensor({"logits": logits}) is logits
    assert resolve_loss(Output(own), "auto") == "model" and loss_of_output(Output(own), "auto") is not None
    assert resolve_loss(Output(None), "auto") == "mean" and loss_of_output(Output(None), "sum").item() == 6
    with pytest.raises(ResacctError, match="returned a dict; expected a tensor"):
        output_tensor({"hidden": 1})
    with pytest.raises(ResacctError, match="--loss model: the model returned a Tensor without a .loss"):
        loss_of_output(logits, "model")
