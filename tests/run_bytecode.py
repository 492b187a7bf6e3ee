"""One compile per run for the xdist workers (issue 34): each module's bytecode is made once and both
workers read it.

Where ``PYTHONDONTWRITEBYTECODE`` is set (this project's machines) or the checkout is fresh (the gate's
clone), every worker compiled every resacct module afresh through the jaxtyping/beartype hook (its AST
transform) and re-rewrote every test module's asserts: ~5 CPU s a worker, the same work twice. Here the
xdist controller makes a temporary folder for the run (``RESACCT_RUN_BYTECODE``, removed when the run
ends); each worker, before it imports anything checked, sends both caches there (the hook's
``.opt-jaxtyping`` pycs and pytest's rewritten test pycs, nothing in the checkout or the venv) and
compiles the modules that the other worker has not claimed yet (an ``O_EXCL`` claim file per module),
in the order collection imports them. Each worker then finds the other's half cached: the usual
loaders read it (the hook's pycs are validated by the source's mtime and size, pytest's by its hash),
so what runs is exactly what each would have compiled. A module whose pyc is not there yet is compiled
by the importer as before. Outside an xdist run nothing changes.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

FOLDER_VARIABLE = "RESACCT_RUN_BYTECODE"
REPO = Path(__file__).resolve().parent.parent


def in_folder(folder: str, path: str) -> str:
    """``path`` (absolute) mirrored under ``folder``, as ``sys.pycache_prefix`` would place it."""
    return os.path.join(folder, os.path.abspath(path).lstrip(os.sep))


def start_run(config: pytest.Config) -> None:
    """The xdist controller: a fresh folder for this run's bytecode, inherited by the workers it starts."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    folder = tempfile.mkdtemp(prefix="resacct-run-bytecode-")
    config.stash[_FOLDER] = folder
    os.environ[FOLDER_VARIABLE] = folder


def end_run(config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(FOLDER_VARIABLE) == folder:
            del os.environ[FOLDER_VARIABLE]


_FOLDER = pytest.StashKey[str]()


def share_with_other_worker(config: pytest.Config, *, type_checked: bool) -> int:
    """An xdist worker: send both caches to the run's folder and compile the unclaimed modules.
    Returns how many this worker compiled."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if not folder or not os.environ.get("PYTEST_XDIST_WORKER") or not os.path.isdir(folder):
        return 0
    work: list[tuple[str, object]] = []
    finder = _jaxtyping_finder() if type_checked else None
    if finder is not None and _redirect_hook_cache(folder):
        work += [(path, finder) for path in _checked_sources(finder)]
    if config.getoption("assertmode", "rewrite") == "rewrite" and _redirect_rewrite_cache(folder):
        patterns = config.getini("python_files")
        work += [(str(path), config) for path in sorted((REPO / "tests").rglob("*.py"))
                 if any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns)]
    compiled = 0
    for path, how in work:
        pyc = _hook_pyc(finder, path) if how is finder else _rewrite_pyc(path)
        if _claim(pyc):
            try:
                compiled += _compile_hooked(finder, path, pyc) if how is finder else _compile_rewritten(config, path, pyc)
            except (SyntaxError, ValueError, OSError):  # the importer meets it and reports it as it always did
                continue
    return compiled


def _claim(pyc: str) -> bool:
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    try:
        os.close(os.open(pyc + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _write(pyc: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    partial = f"{pyc}.{os.getpid()}"
    with open(partial, "wb") as handle:
        handle.write(data)
    os.replace(partial, pyc)  # a reader sees a whole pyc or none


# The jaxtyping import hook (installed by the root conftest.py): its loader compiles the transformed AST
# and caches it beside the source under an ``opt-jaxtyping<hash>`` tag.

def _jaxtyping_finder():  # type: ignore[no-untyped-def]
    return next((finder for finder in sys.meta_path if type(finder).__name__ == "_JaxtypingFinder"), None)


def _redirect_hook_cache(folder: str) -> bool:
    try:
        from jaxtyping import _import_hook
    except ImportError:  # pragma: no cover - a jaxtyping without the hook module
        return False
    original = getattr(_import_hook, "_optimized_cache_from_source", None)
    if original is None or not hasattr(_import_hook, "_JaxtypingLoader"):
        return False
    if getattr(original, "resacct_folder", None) != folder:
        def cache_in_folder(typechecker_hash, /, path, debug_override=None):  # type: ignore[no-untyped-def]
            return in_folder(folder, original(typechecker_hash, path, debug_override))

        cache_in_folder.resacct_folder = folder  # type: ignore[attr-defined]
        _import_hook._optimized_cache_from_source = cache_in_folder
    return True


def _checked_sources(finder) -> list[str]:  # type: ignore[no-untyped-def]
    """The source files of the modules the hook instruments, packages first, in name order."""
    sources = []
    for name in finder.modules:
        top = REPO.joinpath(*name.split("."))
        if top.is_dir():
            sources += sorted(top.rglob("*.py"), key=lambda path: (path.parent.parts, path.name != "__init__.py", path.name))
        elif top.with_suffix(".py").is_file():
            sources.append(top.with_suffix(".py"))
    return [str(path) for path in sources if "__pycache__" not in path.parts]


def _hook_pyc(finder, path: str) -> str:  # type: ignore[no-untyped-def]
    from jaxtyping import _import_hook

    return _import_hook._optimized_cache_from_source(finder._typechecker.get_hash(), path)


def _compile_hooked(finder, path: str, pyc: str) -> int:  # type: ignore[no-untyped-def]
    from importlib import _bootstrap_external

    from jaxtyping import _import_hook

    loader = _import_hook._JaxtypingLoader("resacct_precompiled", path, typechecker=finder._typechecker)
    stats = loader.path_stats(path)
    code = loader.source_to_code(loader.get_data(path), path)
    _write(pyc, bytes(_bootstrap_external._code_to_timestamp_pyc(code, stats["mtime"], stats["size"])))
    return 1


# pytest's assertion rewriting of the test modules (hash-based pycs in ``get_cache_dir(file)``).

def _redirect_rewrite_cache(folder: str) -> bool:
    from _pytest.assertion import rewrite

    if not all(hasattr(rewrite, name) for name in ("get_cache_dir", "_rewrite_test", "_write_pyc_fp", "PYC_TAIL")):
        return False  # pragma: no cover - another pytest: leave it as it is
    if getattr(rewrite.get_cache_dir, "resacct_folder", None) != folder:
        def cache_dir_in_folder(file_path: Path) -> Path:
            return Path(in_folder(folder, str(file_path.parent)))

        cache_dir_in_folder.resacct_folder = folder  # type: ignore[attr-defined]
        rewrite.get_cache_dir = cache_dir_in_folder
    return True


def _rewrite_pyc(path: str) -> str:
    from _pytest.assertion import rewrite

    return str(rewrite.get_cache_dir(Path(path)) / (Path(path).name[:-3] + rewrite.PYC_TAIL))


def _compile_rewritten(config: pytest.Config, path: str, pyc: str) -> int:
    import io

    from _pytest.assertion import rewrite

    source_hash, code = rewrite._rewrite_test(Path(path), config)
    data = io.BytesIO()
    rewrite._write_pyc_fp(data, source_hash, code)
    _write(pyc, data.getvalue())
    return 1

