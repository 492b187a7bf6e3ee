"""The type-checking hook, decorating on first call (issue 34).

jaxtyping's import hook puts ``@jaxtyping.jaxtyped(typechecker=...)`` on every function and class of the
checked modules, and that decoration is work done at import: jaxtyped reads the signature and resolves
its annotations, writes two functions with that signature and hands each to beartype (0.6-0.8 ms a
function; ~70 % of the functions the quick tier imports are never called in it, and each xdist worker
decorated them all). Here the hook's decorator is :func:`lazy_jaxtyped` instead: a function gets a thin
wrapper (``functools.wraps``: same name, qualname, module, ``__wrapped__``, annotations, signature,
pickled by reference as before) whose first call makes ``jaxtyped(fn, typechecker=...)`` with the very
typechecker the hook was given, and every call goes through it: a called function is checked exactly
as before. A dataclass's ``__init__`` is wrapped the same way, under jaxtyped's own conditions; any
other class (NamedTuple, Protocol, Enum) and any non-function object is handed to jaxtyped at once, as
the hook always did.

What moves: a hint beartype cannot take is refused at the function's first call, not at import.

The hook's own machinery stays (its finder, loader, AST transform, bytecode cache): only the decorator
the transform inserts differs, through the finder's ``Typechecker`` (``get_ast``/``get_hash``, the
same private interface tests/run_bytecode.py relies on). Where an installed jaxtyping lacks it,
:func:`install_import_hook` keeps jaxtyping's eager hook and says so in ``LAZY``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import types
from collections.abc import Callable, Sequence
from typing import Any

import jaxtyping

LAZY_PREFIX = "resacct-lazy:"


def lazy_jaxtyped(typechecker: Callable[..., Any]) -> Callable[[Any], Any]:
    """The decorator the hook inserts: ``jaxtyped(typechecker=typechecker)``, made on first call."""

    def decorate(fn: Any) -> Any:
        if isinstance(fn, types.FunctionType):
            return _checked_on_first_call(fn, typechecker)
        if isinstance(fn, type) and dataclasses.is_dataclass(fn) and not getattr(fn, "__no_type_check__", False):
            init = fn.__init__
            if getattr(init, "__globals__", {}).get("__name__") not in {jaxtyping._decorator.__name__, __name__}:
                fn.__init__ = _checked_on_first_call(init, typechecker)  # as jaxtyped does, unless inherited wrapped
            return fn
        return jaxtyping.jaxtyped(fn, typechecker=typechecker)

    return decorate


def _checked_on_first_call(fn: types.FunctionType, typechecker: Callable[..., Any]) -> Callable[..., Any]:
    checked: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if not checked:
            checked.append(jaxtyping.jaxtyped(fn, typechecker=typechecker))
        return checked[0](*args, **kwargs)

    call.resacct_checked_on_first_call = checked  # type: ignore[attr-defined]  # empty until the first call
    return call


def is_lazy(fn: Any) -> bool:
    """Whether ``fn`` is a wrapper that decorates on first call (and not yet called: ``False`` after)."""
    return getattr(fn, "resacct_checked_on_first_call", None) == []


def was_called(fn: Any) -> bool:
    return bool(getattr(fn, "resacct_checked_on_first_call", None))


class LazyTypechecker:
    """Stands in for the hook's ``Typechecker`` of a typechecker string (what its transform and loader
    ask of one: ``get_ast``, ``get_hash``): the same checker, put on by :func:`lazy_jaxtyped`. Its hash
    (the bytecode cache's tag) differs from the eager one's, so neither reads the other's pycs."""

    def __init__(self, typechecker: str) -> None:
        eager = jaxtyping._import_hook.Typechecker(typechecker)
        self.hash = hashlib.md5((LAZY_PREFIX + typechecker).encode("utf-8")).hexdigest()
        jaxtyping._import_hook.Typechecker.lookup[self.hash] = lazy_jaxtyped(jaxtyping._import_hook.Typechecker.lookup[eager.get_hash()])

    def get_hash(self) -> str:
        return self.hash

    def get_ast(self) -> ast.expr:
        """``jaxtyping._import_hook.Typechecker.lookup[<hash>]``, a fresh node each time (the transform
        sets its location). Built, not parsed: ``ast.parse`` per function was 0.8 of the 4.1 CPU s that
        importing the checked modules from source took (cProfile, 180 modules, 2,002 functions)."""
        load = ast.Load()
        lookup = ast.Attribute(ast.Attribute(ast.Attribute(ast.Name("jaxtyping", load), "_import_hook", load), "Typechecker", load), "lookup", load)
        return ast.Subscript(lookup, ast.Constant(self.hash), load)


def _lazy_supported() -> bool:
    hook = getattr(jaxtyping, "_import_hook", None)
    typechecker = getattr(hook, "Typechecker", None)
    return all(hasattr(typechecker, name) for name in ("lookup", "get_ast", "get_hash")) and hasattr(jaxtyping, "_decorator")


LAZY = _lazy_supported()


def install_import_hook(modules: Sequence[str], typechecker: str) -> Any:
    """``jaxtyping.install_import_hook(modules, typechecker)``, decorating on first call where this
    jaxtyping allows (``LAZY``), its loaders tagging only their own module's pyc; the returned manager
    uninstalls it as jaxtyping's does."""
    manager = jaxtyping.install_import_hook(list(modules), typechecker)
    finder = manager.hook
    if LAZY and hasattr(finder, "_typechecker"):
        finder._typechecker = LazyTypechecker(typechecker)
    loader_class = getattr(jaxtyping._import_hook, "_JaxtypingLoader", None)
    if loader_class is not None and hasattr(jaxtyping._import_hook, "_optimized_cache_from_source"):
        find_spec = finder.find_spec

        def find_spec_own_pyc(fullname: str, path: Any = None, target: Any = None) -> Any:
            spec = find_spec(fullname, path, target)
            if spec is not None and type(spec.loader) is loader_class:
                spec.loader = _OwnPycLoader(spec.loader.name, spec.loader.path, typechecker=spec.loader._typechecker)
            return spec

        finder.find_spec = find_spec_own_pyc
    return manager


class _OwnPycLoader(getattr(jaxtyping._import_hook, "_JaxtypingLoader", object)):  # type: ignore[misc]
    """jaxtyping's loader, with its bytecode tag on its own module's pyc only.

    jaxtyping's ``exec_module`` swaps importlib's ``cache_from_source`` for its tagged one while the whole
    module runs, so every module that a checked module imports first (sympy, torch's submodules,
    hypothesis, mpmath: 713 of them importing resacct's checked modules) looked for a pyc under the tag,
    found none and was compiled from source, each time (~2 CPU s a process; it would write tagged
    pycs into the venv where bytecode is written). Here the tag covers ``get_code`` (this module's pyc:
    looked up, and written where that is allowed) and the module then runs under importlib's own."""

    def get_code(self, fullname: str) -> Any:
        from importlib import _bootstrap_external
        from importlib.machinery import SourceFileLoader

        hook = jaxtyping._import_hook
        original = _bootstrap_external.cache_from_source
        _bootstrap_external.cache_from_source = functools.partial(hook._optimized_cache_from_source, self._typechecker.get_hash())
        try:
            return SourceFileLoader.get_code(self, fullname)
        finally:
            _bootstrap_external.cache_from_source = original

    def exec_module(self, module: types.ModuleType) -> None:
        from importlib.machinery import SourceFileLoader

        SourceFileLoader.exec_module(self, module)
