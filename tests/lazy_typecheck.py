"""The type-checking hook, with beartype put on at first call (issue 34).

jaxtyping's import hook puts ``@jaxtyping.jaxtyped(typechecker=...)`` on every function and class of the
checked modules. jaxtyped reads the signature, resolves its annotations and writes two functions with
that signature (one for the parameters, one with the return), and hands each to the typechecker:
beartype builds a checking wrapper for each, ~80 % of the 0.75 ms a function cost at import (0.15 ms
without it; ~70 % of the functions the quick tier imports are never called in it, and each xdist worker
decorated them all). Here the hook's typechecker is :func:`lazily`'s: for each of those two functions it
returns a thin wrapper that calls beartype on its first call and delegates to what beartype made. So
the hook and jaxtyped are jaxtyping's own, applied at import as before (the wrapper every module holds,
its metadata, dataclasses' ``__init__``, pickling by reference, the frames between a caller and the
function: all as before), and every call of a decorated function is checked by the same beartype
wrapper as before; only that wrapper is made when first needed.

What moves: a hint beartype cannot take is refused at the function's first call, not at import.

The hook's loader also looked up, under its own bytecode tag, the pyc of every module a checked module
imported first (``_OwnPycLoader``): that is corrected here too.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from typing import Any

import jaxtyping

#: How many typechecker wrappers were made at first call, in this process (the tests read it).
built = 0


@functools.cache
def lazily(typechecker: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The typechecker named by ``typechecker`` (a jaxtyping hook string: ``"beartype.beartype"``, ...),
    applied to each function on its first call. ``lazy_typechecker(typechecker)`` names it for the hook."""
    module = typechecker.split(".", 1)[0]
    namespace: dict[str, Any] = {}
    exec(f"import {module}\nchecker = {typechecker}", namespace)  # as jaxtyping's hook evaluates it
    checker = namespace["checker"]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return _checked_on_first_call(fn, checker)

    return decorate


def lazy_typechecker(typechecker: str) -> str:
    """The hook string for ``typechecker`` put on lazily: ``install_import_hook(modules, lazy_typechecker(...))``."""
    if "'" in typechecker or "\\" in typechecker:
        raise ValueError(f"typechecker {typechecker!r}: expected a dotted expression without quotes or backslashes")
    return f"{__name__}.lazily('{typechecker}')"


def _checked_on_first_call(fn: Callable[..., Any], checker: Callable[..., Any]) -> Callable[..., Any]:
    checked: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if not checked:
            checked.append(_made(fn, checker))
        return checked[0](*args, **kwargs)

    return call


#: beartype's wrappers for the functions jaxtyped writes for a nested ``def``, by what they check.
_NESTED: dict[tuple[Any, ...], Callable[..., Any]] = {}


def _made(fn: Callable[..., Any], checker: Callable[..., Any]) -> Callable[..., Any]:
    """``checker(fn)``; for a ``def`` nested in a function (made anew, and decorated anew, each time the
    function around it runs: 8,573 of the quick tier's 14,206 wrappers, docs/suite_time.md) the wrapper
    made for an earlier one with the same name, parameters, hints (equal objects) and defaults (the same
    objects). ``fn`` is jaxtyped's stand-in, a function of its signature alone (its body ``pass`` or
    ``return <the value checked>``), so the wrapper made for one checks every other call alike."""
    global built
    key = None
    if "<locals>" in getattr(fn, "__qualname__", ""):
        code = fn.__code__  # type: ignore[attr-defined]
        key = (fn.__module__, fn.__qualname__, code.co_varnames, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
               code.co_flags, tuple(fn.__annotations__.items()), tuple(map(id, fn.__defaults__ or ())),
               tuple((name, id(value)) for name, value in (fn.__kwdefaults__ or {}).items()), checker)
        try:
            return _NESTED[key]
        except KeyError:
            pass
        except Exception:  # noqa: BLE001 - a hint that cannot be hashed or compared: made afresh
            key = None
    made = checker(fn)
    built += 1
    if key is not None and _NESTED_KEPT.get(key[:2], 0) < 8:  # hints made anew per def (jaxtyping's) never match: keep a few
        _NESTED[key] = made
        _NESTED_KEPT[key[:2]] = _NESTED_KEPT.get(key[:2], 0) + 1
    return made


_NESTED_KEPT: dict[tuple[str, str], int] = {}


def install_import_hook(modules: Sequence[str], typechecker: str) -> Any:
    """``jaxtyping.install_import_hook(modules, typechecker)`` with the typechecker put on at first call
    (:func:`lazily`), and its loaders tagging only their own module's pyc; the returned manager
    uninstalls it as jaxtyping's does."""
    manager = jaxtyping.install_import_hook(list(modules), lazy_typechecker(typechecker))
    finder = manager.hook
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
