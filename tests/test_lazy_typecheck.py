"""tests/lazy_typecheck.py: the type-checking hook makes its beartype wrappers on first call and checks
what it checked.

Each test imports one source twice, under jaxtyping's own hook (eager) and under the lazy one, and
compares what they do; none needs the session's hook, so they run in every tier."""

from __future__ import annotations

import importlib.util
import inspect
import os
import pickle
import sys
import textwrap
import types
import uuid
from pathlib import Path

import jaxtyping
import pytest
import torch

from conftest import TYPECHECKER, type_checking
from tests import lazy_typecheck, run_bytecode

SOURCE = textwrap.dedent('''
    """A checked module."""
    from __future__ import annotations

    import dataclasses
    import typing
    from collections.abc import Iterator

    import torch
    from jaxtyping import Float, Int
    from torch import Tensor


    @dataclasses.dataclass
    class Box:
        x: Float[Tensor, "n 2"]
        label: str = "box"


    @dataclasses.dataclass
    class LabelledBox(Box):
        weight: float = 1.0


    class Pair(typing.NamedTuple):
        x: Float[Tensor, "n 2"]
        count: int


    @typing.runtime_checkable
    class HasBytes(typing.Protocol):
        def size_bytes(self) -> int: ...


    class Holder:
        """Holds."""

        def __init__(self, n: int) -> None:
            self.n = n

        def size_bytes(self) -> int:
            return self.n

        def rows(self, x: Float[Tensor, "n d"]) -> Int[Tensor, ""]:
            return torch.tensor(x.shape[0])

        @staticmethod
        def twice(x: int) -> int:
            return 2 * x

        @classmethod
        def make(cls, n: int) -> Holder:
            return cls(n)

        @property
        def wrong(self) -> int:
            return "not an int"  # type: ignore[return-value]


    def first_rows(x: Float[Tensor, "n d"], k: int) -> Float[Tensor, "k d"]:
        """The first k rows."""
        return x[:k]


    def flat(x: Float[Tensor, "n"]) -> Float[Tensor, "n n"]:
        return x


    def same_shape(x: Float[Tensor, "n"], y: Float[Tensor, "n"]) -> Float[Tensor, "n"]:
        return x + y


    def count_up(n: int) -> Iterator[int]:
        yield from range(n)


    def rank_program(rank: int, world: int = 2) -> int:
        return rank * world


    def make_nested():
        def nested(x: int) -> int:
            return x + 1
        return nested


    def make_shaped(offset: float):
        def shaped(x: Float[Tensor, "n"], y: Float[Tensor, "n"]) -> Float[Tensor, "n"]:
            return x + y + offset
        return shaped


    @typing.no_type_check
    def unchecked(x: int) -> int:
        return x
''')


def _import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, lazy: bool) -> types.ModuleType:
    """The probe source imported under jaxtyping's own hook (eager) or the lazy one: the lazy import makes
    no beartype wrapper (nothing in the source is called at import)."""
    name = f"lazy_probe_{'lazy' if lazy else 'eager'}_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    install = lazy_typecheck.install_import_hook if lazy else jaxtyping.install_import_hook
    manager = install([name], TYPECHECKER)
    built = lazy_typecheck.built
    try:
        module = importlib.import_module(name)
    finally:
        manager.uninstall()
    monkeypatch.setitem(sys.modules, name, module)
    assert lazy_typecheck.built == built, "the lazy hook ran beartype at import"
    return module


def _outcome(call) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - the kind of refusal is what is compared
        return "refused", type(error).__name__
    return "ok", type(result).__name__ if not isinstance(result, (int, str, bool)) else repr(result)


def _probes(m: types.ModuleType) -> dict[str, tuple[str, str]]:
    good, bad = torch.zeros(3, 2), torch.zeros(3, 2, 1)
    calls = {
        "first_rows": lambda: m.first_rows(good, 2),
        "first_rows wrong rank": lambda: m.first_rows(bad, 2),
        "first_rows wrong type": lambda: m.first_rows([1.0], 2),
        "flat wrong return rank": lambda: m.flat(torch.zeros(4)),
        "same_shape": lambda: m.same_shape(torch.zeros(4), torch.zeros(4)),
        "same_shape mismatched": lambda: m.same_shape(torch.zeros(4), torch.zeros(5)),
        "same_shape int dtype": lambda: m.same_shape(torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)),
        "Box": lambda: m.Box(good),
        "Box wrong shape": lambda: m.Box(bad),
        "Box wrong label": lambda: m.Box(good, 3),
        "LabelledBox wrong shape": lambda: m.LabelledBox(bad),
        "LabelledBox wrong weight": lambda: m.LabelledBox(good, "l", "heavy"),
        "Pair": lambda: m.Pair(good, 1),
        "Pair wrong shape": lambda: m.Pair(bad, "one"),  # a NamedTuple: jaxtyping never checked its fields
        "Holder.rows": lambda: m.Holder(1).rows(good),
        "Holder.rows wrong": lambda: m.Holder(1).rows(torch.zeros(3)),
        "Holder.twice": lambda: m.Holder.twice(4),
        "Holder.twice wrong": lambda: m.Holder.twice("4"),
        "Holder.make": lambda: m.Holder.make(2).n,
        "Holder.make wrong": lambda: m.Holder.make("2"),
        "Holder.wrong": lambda: m.Holder(1).wrong,
        "HasBytes": lambda: isinstance(m.Holder(1), m.HasBytes),
        "count_up": lambda: list(m.count_up(3)),
        "count_up wrong": lambda: m.count_up("3"),
        "rank_program": lambda: m.rank_program(1, world=4),
        "rank_program wrong": lambda: m.rank_program(1, world="4"),
        "nested": lambda: m.make_nested()(1),
        "nested wrong": lambda: m.make_nested()("1"),
        "unchecked": lambda: m.unchecked("x"),
    }
    return {label: _outcome(call) for label, call in calls.items()}


def test_every_call_is_refused_or_allowed_as_by_jaxtypings_own_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eager = _import(tmp_path, monkeypatch, lazy=False)
    lazy = _import(tmp_path, monkeypatch, lazy=True)
    built = lazy_typecheck.built
    eager_outcomes = _probes(eager)
    assert lazy_typecheck.built == built
    lazy_outcomes = _probes(lazy)
    assert lazy_typecheck.built >= built + 2 * 13, "each checked function called makes its two wrappers"
    assert lazy_outcomes == eager_outcomes
    refused = {label for label, (outcome, _) in lazy_outcomes.items() if outcome == "refused"}
    assert refused == {"first_rows wrong rank", "first_rows wrong type", "flat wrong return rank", "same_shape mismatched",
                       "same_shape int dtype", "Box wrong shape", "Box wrong label", "LabelledBox wrong shape",
                       "LabelledBox wrong weight", "Holder.rows wrong", "Holder.twice wrong", "Holder.make wrong",
                       "Holder.wrong", "count_up wrong", "rank_program wrong", "nested wrong"}
    assert lazy_outcomes["Pair wrong shape"] == ("ok", "Pair")  # unchecked before too (jaxtyped checks dataclasses only)


def test_a_function_first_called_after_import_refuses_a_wrong_shape_with_jaxtypings_message(tmp_path: Path,
                                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    eager = _import(tmp_path, monkeypatch, lazy=False)
    lazy = _import(tmp_path, monkeypatch, lazy=True)
    messages = []
    built = lazy_typecheck.built
    for module in (eager, lazy):
        with pytest.raises(jaxtyping.TypeCheckError) as refused:
            module.same_shape(torch.zeros(4), torch.zeros(5))
        messages.append(str(refused.value).replace(module.__name__, "<module>"))
    assert "same_shape" in messages[1] and "n=4" in messages[1], messages[1]
    assert messages[1] == messages[0]
    assert lazy_typecheck.built > built, "same_shape's wrappers were not made at its first call"
    lazy.same_shape(torch.zeros(2), torch.zeros(2))  # the right call still passes
    with pytest.raises(jaxtyping.TypeCheckError):  # and the next wrong one is refused by the wrappers made
        lazy.same_shape(torch.zeros(2), torch.zeros(3))


def test_the_wrappers_look_like_jaxtypings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Name, qualname, doc, signature, annotations, ``__wrapped__``, dataclass fields, methods binding,
    and pickling by reference (resacct.measurement.distributed sends rank programs that way)."""
    eager = _import(tmp_path, monkeypatch, lazy=False)
    lazy = _import(tmp_path, monkeypatch, lazy=True)

    def looks(m: types.ModuleType, fn) -> tuple:  # type: ignore[no-untyped-def]
        return (fn.__name__, fn.__qualname__, fn.__module__.replace(m.__name__, "<m>"), fn.__doc__, str(inspect.signature(fn)),
                fn.__annotations__, inspect.unwrap(fn).__code__.co_name, hasattr(fn, "__wrapped__"))

    for module in (eager, lazy):
        assert pickle.loads(pickle.dumps(module.rank_program)) is module.rank_program
        assert pickle.loads(pickle.dumps(module.Holder.make)) == module.Holder.make
    for name in ("first_rows", "rank_program", "count_up", "unchecked"):
        assert looks(lazy, getattr(lazy, name)) == looks(eager, getattr(eager, name)), name
    for name in ("rows", "twice", "make", "__init__"):
        assert looks(lazy, getattr(lazy.Holder, name)) == looks(eager, getattr(eager.Holder, name)), name
    assert looks(lazy, lazy.Box.__init__) == looks(eager, eager.Box.__init__)
    assert str(inspect.signature(lazy.Box)) == str(inspect.signature(eager.Box))
    assert list(inspect.signature(lazy.Box).parameters) == ["x", "label"]
    assert [f.name for f in __import__("dataclasses").fields(lazy.LabelledBox)] == ["x", "label", "weight"]
    assert type(lazy.Holder.__dict__["twice"]) is staticmethod and type(lazy.Holder.__dict__["make"]) is classmethod
    assert lazy.Pair._fields == ("x", "count") and lazy.Holder.__doc__ == "Holds."


def test_a_real_resacct_module_first_called_in_this_test_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh copy of resacct/training/models.py through the same loader and typechecker as the
    session's hook: its functions are wrappers until called, and the first call refuses a wrong shape."""
    import resacct.training.models as original

    name = f"resacct.training._lazy_probe_{uuid.uuid4().hex[:8]}"
    typechecker = jaxtyping._import_hook.Typechecker(lazy_typecheck.lazy_typechecker(TYPECHECKER))
    loader = lazy_typecheck._OwnPycLoader(name, original.__file__, typechecker=typechecker)
    spec = importlib.util.spec_from_file_location(name, original.__file__, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    built = lazy_typecheck.built
    loader.exec_module(module)
    assert lazy_typecheck.built == built and hasattr(module.Cruncher.forward, "__wrapped__")
    model = module.Cruncher(dim=4, num_layers=2)
    with pytest.raises(jaxtyping.TypeCheckError, match=r"Cruncher\.forward"):
        model(torch.randn(3, 5, 2))  # a wrong rank
    assert model(torch.randn(3, 4)).shape == (3, 1)
    with pytest.raises(jaxtyping.TypeCheckError):
        module.cruncher_parameter_count("4", 2)


@pytest.mark.typecheck
def test_the_sessions_hook_is_the_lazy_one() -> None:
    assert type_checking()
    finder = run_bytecode._jaxtyping_finder()
    assert finder._typechecker.get_hash() == jaxtyping._import_hook.Typechecker(lazy_typecheck.lazy_typechecker(TYPECHECKER)).get_hash()
    from resacct.training import models

    built = lazy_typecheck.built
    with pytest.raises(jaxtyping.TypeCheckError):
        models.cruncher_linear_layer_count("2")
    assert lazy_typecheck.built >= built  # made now, or by an earlier call in this process


def test_a_checked_module_tags_its_own_pyc_and_not_the_modules_it_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jaxtyping's loader tagged the cache of every module imported while a checked one ran (they were
    compiled from source each time, and their tagged pycs written into the venv where bytecode is
    written): the lazy hook's loader tags the checked module's pyc only."""
    name = f"lazy_tagged_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(f"import {name}_plain\n\ndef double(x: int) -> int:\n    return 2 * {name}_plain.ONE * x\n")
    (tmp_path / f"{name}_plain.py").write_text("ONE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    manager = lazy_typecheck.install_import_hook([name], TYPECHECKER)
    try:
        module = importlib.import_module(name)
    finally:
        manager.uninstall()
        sys.modules.pop(f"{name}_plain", None)
    monkeypatch.setitem(sys.modules, name, module)
    from importlib.util import cache_from_source

    from jaxtyping import _import_hook

    # the checked module's own pyc, tagged (beside it, or in the run's folder under xdist: tests/run_bytecode.py)
    checked_pyc = _import_hook._optimized_cache_from_source(manager.hook._typechecker.get_hash(), str(tmp_path / f"{name}.py"))
    assert os.path.isfile(checked_pyc) and "opt-jaxtyping" in checked_pyc
    pycs = {str(path) for path in (tmp_path / "__pycache__").iterdir()} - {checked_pyc}
    assert pycs == {cache_from_source(str(tmp_path / f"{name}_plain.py"))}, pycs  # untagged: any later import reads it
    with pytest.raises(jaxtyping.TypeCheckError):
        module.double("2")


def test_a_module_compiled_by_one_worker_is_read_lazily_checked_by_the_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/run_bytecode.py with the lazy hook: test_run_bytecode's own test, the lazy hook installed."""
    from jaxtyping import _import_hook

    from tests import test_run_bytecode

    monkeypatch.setattr(_import_hook, "_optimized_cache_from_source", _import_hook._optimized_cache_from_source)
    installed = []

    def install(modules: list[str], typechecker: str):  # type: ignore[no-untyped-def]
        installed.append(lazy_typecheck.install_import_hook(modules, typechecker))
        return installed[-1]

    monkeypatch.setattr(test_run_bytecode, "jaxtyping", types.SimpleNamespace(install_import_hook=install))
    (tmp_path / "run").mkdir()
    test_run_bytecode.test_a_module_compiled_by_one_worker_is_read_by_the_other_with_its_checks(str(tmp_path / "run"), tmp_path, monkeypatch)
    lazy_hash = jaxtyping._import_hook.Typechecker(lazy_typecheck.lazy_typechecker(TYPECHECKER)).get_hash()
    assert [manager.hook._typechecker.get_hash() for manager in installed] == [lazy_hash]


def test_a_nested_def_made_again_is_checked_by_the_wrappers_made_for_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``def`` inside a function is decorated each time that function runs: its beartype wrappers are
    made once, and every later one is still checked (plain hints: reused; jaxtyping's, made per def: made again)."""
    lazy = _import(tmp_path, monkeypatch, lazy=True)
    assert lazy.make_nested()(1) == 2
    built = lazy_typecheck.built
    assert [lazy.make_nested()(n) for n in range(3)] == [1, 2, 3]
    assert lazy_typecheck.built == built, "the later defs made their own wrappers"
    for _ in range(3):  # (a refusal makes jaxtyping's one-argument checks to name the argument, as before)
        with pytest.raises(jaxtyping.TypeCheckError, match="nested"):
            lazy.make_nested()("1")
    for offset in (1.0, 2.0, 3.0):
        shaped = lazy.make_shaped(offset)
        with pytest.raises(jaxtyping.TypeCheckError, match="shaped"):
            shaped(torch.zeros(2), torch.zeros(3))
        assert shaped(torch.zeros(2), torch.zeros(2)).tolist() == [offset, offset]
