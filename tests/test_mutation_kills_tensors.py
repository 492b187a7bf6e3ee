"""resacct.measurement.tensors against torch, written to kill the mutants mutmut left alive (docs/mutation.md)."""

from __future__ import annotations

import pytest
import torch

from resacct.measurement import tensors
from resacct.errors import ResacctError, UnknownNameError


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0, 2), (2, 3, 0)])
def test_empty_dimensions_are_valid_shapes_as_in_torch(shape):
    empty = torch.empty(shape, dtype=torch.float32)
    assert tensors.numel(shape) == empty.numel() == 0
    assert tensors.tensor_bytes(shape, torch.float32) == empty.untyped_storage().nbytes() == 0
    assert tensors.contiguous_strides(shape) == empty.stride()


@pytest.mark.parametrize("bad", [-1, -7, True, False])
def test_negative_and_boolean_dimensions_are_refused_with_the_shape(bad):
    shape = [2, bad, 3]
    if isinstance(bad, int) and not isinstance(bad, bool):
        with pytest.raises(RuntimeError):  # torch refuses negative sizes too
            torch.empty(shape)
    message = rf"shape \[2, {bad!r}, 3\] has the dimension {bad!r}; dimensions are whole numbers ≥ 0"
    for call in (tensors.numel, tensors.contiguous_strides, lambda s: tensors.tensor_bytes(s, "float32")):
        with pytest.raises(ResacctError, match=message):
            call(shape)


def test_element_offset_matches_torch_and_refuses_mismatched_lengths():
    base = torch.arange(60.0).reshape(3, 4, 5)
    view = base.transpose(0, 2)[1:, ::2]
    index = (2, 1, 0)
    offset = tensors.element_offset(index, view.stride(), view.storage_offset())
    assert base.flatten()[offset] == view[index]
    # a tensor that starts its storage: the offset defaults to 0
    assert base.storage_offset() == 0
    assert base.flatten()[tensors.element_offset((1, 2, 3), base.stride())] == base[1, 2, 3]
    with pytest.raises(ResacctError, match=r"index \[0, 1\] has 2 positions but strides \[20, 5, 1\] have 3"):
        tensors.element_offset([0, 1], [20, 5, 1])


def test_unknown_operations_are_refused_with_the_known_ones():
    with pytest.raises(UnknownNameError, match=r"unknown operation 'transpos'; did you mean 'transpose'") as error:
        tensors.makes_view("transpos")
    assert error.value.kind == "operation" and error.value.name == "transpos"
    assert error.value.__cause__ is None and error.value.__suppress_context__
    assert "known: " in str(error.value) and "reshape_transposed" in str(error.value)
    assert set(error.value.known) == set(tensors.OPERATION_MAKES_VIEW)
    for known in error.value.known:
        assert isinstance(tensors.makes_view(known), bool)
