"""CUDA autocast on meta tensors (issue 31): :class:`CudaAutocast` casts as ``torch.autocast("cuda")``
does — judged by torch's own CUDA autocast test lists and by a real ``torch.autocast("cpu")`` step
(where the CPU and CUDA policies agree) — so ``predict_cuda_step_memory`` and ``--device BOARD``
predict the bf16-autocast recipe, and the bf16 recipe with fp32 master weights."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
from resacct.account.gpu.tracing.cuda_autocast import CudaAutocast
from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory
from resacct.measurement.memory_timeline import make_optimizer_state, run_training_step


def _torch_cuda_autocast_lists() -> object:
    """torch's ``AutocastTestLists`` (the ops its CUDA autocast tests expect in each precision), built
    on meta tensors; its module imports ``common_utils`` (which needs ``expecttest``) for two names only."""
    stub = types.ModuleType("torch.testing._internal.common_utils")
    stub.TEST_WITH_ROCM, stub.TestCase = False, object  # type: ignore[attr-defined]
    saved = sys.modules.get(stub.__name__)
    sys.modules[stub.__name__] = stub
    try:
        from torch.testing._internal.autocast_test_lists import AutocastTestLists
    except ImportError as error:
        pytest.skip(f"torch {torch.__version__} has no autocast_test_lists ({error})")
    finally:
        sys.modules.pop("torch.testing._internal.autocast_test_lists", None)
        if saved is None:
            sys.modules.pop(stub.__name__, None)
        else:
            sys.modules[stub.__name__] = saved
    return AutocastTestLists(torch.device("meta"))


@pytest.mark.skipif(tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5),
                    reason=f"torch {torch.__version__} has no meta kernels for 9 of the 98 ops of its autocast lists (torch 2.4.1)")
# torch's own lists call chain_matmul and cross without dim, both deprecated: torch's warnings about its own test lists
@pytest.mark.filterwarnings("ignore:torch.chain_matmul is deprecated:UserWarning", "ignore:Using torch.cross without specifying the dim:UserWarning")
def test_the_casts_match_torchs_own_cuda_autocast_test_lists() -> None:
    lists = _torch_cuda_autocast_lists()
    cases = [(torch, entry, torch.float16) for entry in lists.torch_fp16] + [(torch._C._nn, entry, torch.float16) for entry in lists.nn_fp16]
    cases += [(torch._C._linalg, entry, torch.float16) for entry in lists.linalg_fp16] + [(None, entry, torch.float16) for entry in lists.methods_fp16]
    cases += [(torch, entry, torch.float32) for entry in lists.torch_fp32] + [(torch._C._nn, entry, torch.float32) for entry in lists.nn_fp32]
    cases += [(None, entry, torch.float32) for entry in lists.methods_fp32]
    cases += [(torch, entry, torch.float32) for entry in lists.torch_need_autocast_promote]  # fp16 beside fp32 inputs: the widest
    checked, wrong, unjudged = 0, [], set()
    for where, (name, args, *_), expected in cases:
        function = getattr(args[0], name) if where is None else getattr(where, name)
        arguments = args[1:] if where is None else args
        try:
            function(*arguments)  # without autocast: an op with no meta kernel here (cuDNN's) is not judged
        except (NotImplementedError, TypeError, RuntimeError):
            unjudged.add(name)
            continue
        with CudaAutocast(torch.float16):
            out = function(*arguments)
        out = out[0] if isinstance(out, tuple) else out
        checked += 1
        if out.dtype != expected:
            wrong.append(f"{name}: {out.dtype}, torch's list expects {expected}")
    assert not wrong, wrong
    # what cannot run on meta tensors without autocast, each for a named reason; any other op left unjudged fails here
    cannot_run = {"cudnn_convolution", "cudnn_convolution_transpose"}  # cuDNN's own ops: no meta kernel
    cannot_run |= {"einsum", "bilinear", "dot", "vdot", "tensordot", "scatter_add"}  # the promote list's mixed dtypes: they need autocast
    if _torch_below(2, 13):  # torch 2.8.0 and 2.11.0: "convolution_overrideable not implemented" on meta; 2.13 and 2.14 run it
        cannot_run.add("_convolution")
    assert unjudged <= cannot_run, f"ops of torch's lists that did not run on meta: {sorted(unjudged - cannot_run)}"
    assert checked >= 87, f"only {checked} of {len(cases)} ops of torch's lists ran on meta"  # 90 on torch 2.13 and 2.14, 87 on 2.8 and 2.11


def _torch_below(major: int, minor: int) -> bool:
    return tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (major, minor)


class _Net(nn.Module):
    """Ops whose CPU and CUDA autocast policies agree: linear, bmm and matmul (lower precision),
    gelu and add (none), cross_entropy (float32)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.head = nn.Linear(64, 256), nn.Linear(256, 64), nn.Linear(64, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(F.gelu(self.up(x)))
        return self.head(torch.bmm(h, h.transpose(1, 2)) @ h + x)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 32, 64), torch.randint(0, 100, (8, 32))


def _recorded_step(autocast: object) -> tuple[list, int, int]:
    torch.manual_seed(0)
    net, batch = _Net(), _batch()
    optimizer = torch.optim.AdamW(net.parameters(), foreach=True)
    make_optimizer_state(net, optimizer)

    def loss(model: nn.Module, step_batch: tuple) -> torch.Tensor:
        with autocast():  # type: ignore[operator]
            return _loss(model, step_batch)

    with AllocationRecorder(device="cpu") as recorder:
        recorder.start_window()
        run_training_step(net, batch, loss, optimizer)
    events = [(event.action, event.size) for event in recorder.allocator.events[recorder.window_start:]]
    return events, recorder.allocator.peak_allocated_bytes, recorder.allocator.peak_reserved_bytes


def test_a_step_under_it_allocates_as_under_torch_autocast_cpu() -> None:
    """The same step on real CPU tensors, under ``torch.autocast("cpu", bfloat16)`` and under
    :class:`CudaAutocast`: the same allocations in the same order, the same frees, the same peaks.
    Only the order in which autocast's exit frees its cached casts differs (C++ frees them in
    hash-map order)."""
    real, emulated = _recorded_step(lambda: torch.autocast("cpu", dtype=torch.bfloat16)), _recorded_step(lambda: CudaAutocast(torch.bfloat16))
    assert [e for e in real[0] if e[0] == "alloc"] == [e for e in emulated[0] if e[0] == "alloc"]
    assert sorted(real[0]) == sorted(emulated[0])
    assert real[1:] == emulated[1:] and real[1] > 0
    plain = _recorded_step(lambda: torch.autocast("cpu", enabled=False))
    assert plain[1] != real[1]  # autocast changes what the step holds: the comparison can fail


def test_the_meta_trace_under_it_equals_the_real_step_under_it() -> None:
    """``predict_cuda_step_memory`` over meta tensors with CUDA autocast's casts = the real CPU step
    under the same casts, through the same allocator model (parameters and optimizer state first)."""
    torch.manual_seed(0)
    net, batch = _Net(), _batch()

    def loss(model: nn.Module, step_batch: tuple) -> torch.Tensor:
        with CudaAutocast(torch.bfloat16):
            return _loss(model, step_batch)

    predicted = predict_cuda_step_memory(net, batch, loss, lambda params: torch.optim.AdamW(params, foreach=True))
    optimizer = torch.optim.AdamW(net.parameters(), foreach=True)
    make_optimizer_state(net, optimizer)
    moments = [value for state in optimizer.state.values() for key, value in state.items() if key != "step"]  # CUDA keeps the step counts on the CPU
    with AllocationRecorder(device="cpu") as recorder:
        for tensor in [*net.parameters(), *batch, *moments]:
            recorder.track(tensor)
        start = recorder.allocator.allocated_bytes
        recorder.start_window()
        run_training_step(net, batch, loss, optimizer)
    assert (predicted.start_allocated_bytes, predicted.peak_allocated_bytes, predicted.peak_reserved_bytes) == (
        start, recorder.allocator.peak_allocated_bytes, recorder.allocator.peak_reserved_bytes)


def test_the_cast_cache_keeps_one_copy_of_a_parameter_per_region() -> None:
    weight = nn.Parameter(torch.randn(16, 16, device="meta"))
    x = torch.randn(4, 16, device="meta")
    with CudaAutocast(torch.bfloat16) as autocast:
        first, second = F.linear(x, weight), F.linear(x, weight)
        assert first.dtype == second.dtype == torch.bfloat16
        assert autocast.casts == 3  # the weight once (cached), the input twice (not a leaf that requires grad)
    assert autocast._cache == {}


@pytest.mark.slow  # 1.0-1.4 CPU s a recipe: the step traced twice (measured with 5 agents on 2 cores)
@pytest.mark.parametrize("recipe", ["bf16-autocast", "bf16-fp32-master"])
def test_a_mixed_precision_recipe_gets_cuda_peaks(recipe: str) -> None:
    pytest.importorskip("transformers")
    from resacct.account.gpu.answers.device_answer import gpu_step_answer
    from resacct.account.load.hf_models import build_hf_model, load_hf_config
    from resacct.account.load.model_io import call_model, default_inputs, loss_of_output
    from resacct.facts.hardware import get_accelerator
    from resacct.facts.recipes import get_recipe

    model = build_hf_model(load_hf_config("gpt2"), device="meta")
    model.train()
    inputs = default_inputs(model, batch=1, seq=32, device="meta")
    answer = gpu_step_answer(model, inputs, lambda m, b: loss_of_output(call_model(m, b), "model"), recipe=get_recipe(recipe),
                             optimizer="adamw", board=get_accelerator("h100"))
    assert answer.gap is None and answer.attention == "flash"
    assert answer.reserved_bytes >= answer.allocated_bytes > 124_439_808 * 4  # above the float32 weights (autocast) or masters
