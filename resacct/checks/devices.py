"""Measuring where tensors live and what moving them costs the allocator."""

from __future__ import annotations

import torch

from resacct.harness.registry import Outcome, check
from resacct.measurement.tensors import tensor_bytes


@check("devices.default_device", evidence="measured")
def default_device() -> Outcome:
    """``torch.zeros(32, 32).device.type`` with no device given."""
    return Outcome(measured=torch.zeros(32, 32).device.type, predicted="cpu")


@check("devices.cuda_allocated_bytes", evidence="measured")
def cuda_allocated_bytes(rows: int = 32, cols: int = 32, tensors: int = 2) -> Outcome:
    """Growth of ``torch.cuda.memory_allocated()`` after moving one float32 tensor to the GPU
    and creating the others there (the caching allocator rounds each block up to 512 bytes)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    kept = [torch.zeros(rows, cols).to("cuda:0")]
    kept += [torch.zeros(rows, cols, device="cuda:0") for _ in range(tensors - 1)]
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    block = 512
    per_tensor = -(-tensor_bytes((rows, cols), "float32") // block) * block
    del kept
    return Outcome(measured=grown, predicted=tensors * per_tensor)


@check("devices.moved_device", evidence="measured")
def moved_device() -> Outcome:
    """The device of ``torch.zeros(32, 32).to("cuda:0")``."""
    return Outcome(measured=str(torch.zeros(32, 32).to("cuda:0").device), predicted="cuda:0")
