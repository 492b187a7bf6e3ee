"""DTensor's sharding propagation marked while a sharded step is traced (resacct/account/peak/dtensor_propagation.py):
inside the propagator's fake run ``propagating()`` is true, outside it false, and the propagator is put back as it was.
What the marking changes in a traced step: tests/test_rank_classes.py (the rank a process traces first)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from resacct.account.peak import dtensor_propagation
from resacct.account.peak.dtensor_propagation import propagating, propagation_unrecorded


def _marked_method(propagator: type) -> str:
    return next(name for name in dtensor_propagation._PROPAGATING_METHODS if name in vars(propagator))


def test_the_propagators_fake_run_is_marked_only_while_active(monkeypatch: pytest.MonkeyPatch) -> None:
    propagator = dtensor_propagation._propagator_class()
    if propagator is None:
        pytest.skip("this torch has no DTensor sharding propagator")
    name = _marked_method(propagator)
    seen: list[bool] = []

    def spy(self: object, op_schema: object) -> str:
        seen.append(propagating())
        return "tensor meta"

    monkeypatch.setattr(propagator, name, spy)
    with propagation_unrecorded():
        with propagation_unrecorded():  # nested: one patch, undone by the outer exit only
            assert getattr(propagator, name)(object(), None) == "tensor meta"
        assert vars(propagator)[name] is not spy
        worker = threading.Thread(target=getattr(propagator, name), args=(object(), None))  # another thread's propagation too
        worker.start()
        worker.join()
    assert vars(propagator)[name] is spy
    assert seen == [True, True] and not propagating()
    spy(object(), None)  # put back: unmarked
    assert seen[-1] is False


def test_an_error_inside_the_propagation_leaves_it_unmarked(monkeypatch: pytest.MonkeyPatch) -> None:
    propagator = dtensor_propagation._propagator_class()
    if propagator is None:
        pytest.skip("this torch has no DTensor sharding propagator")

    def failing(self: object, op_schema: object) -> None:
        raise RuntimeError("no meta kernel")

    monkeypatch.setattr(propagator, _marked_method(propagator), failing)
    with propagation_unrecorded(), pytest.raises(RuntimeError, match="no meta kernel"):
        getattr(propagator, _marked_method(propagator))(object(), None)
    assert not propagating()


def test_a_dtensor_type_is_told_apart_under_either_module_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch >= 2.5 has ``torch.distributed.tensor.DTensor``; 2.4 had it in ``torch.distributed._tensor`` only, and asking the
    public module for it raised AttributeError inside autograd's engine (a backward under shard --device's tracker aborted
    the process on torch 2.4.1, found in session 27)."""
    import types

    from resacct.account.peak.dtensor_propagation import dtensor_among

    class FakeDTensor:
        pass

    class Subclass(FakeDTensor):
        pass

    monkeypatch.setitem(sys.modules, "torch.distributed.tensor", types.ModuleType("torch.distributed.tensor"))  # 2.4: no DTensor there
    monkeypatch.setitem(sys.modules, "torch.distributed._tensor", types.SimpleNamespace(DTensor=FakeDTensor))
    assert dtensor_among([torch.Tensor, Subclass]) and not dtensor_among([torch.Tensor])
    monkeypatch.delitem(sys.modules, "torch.distributed._tensor")
    assert not dtensor_among([Subclass])  # neither module has one: no DTensor exists
