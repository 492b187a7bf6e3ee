"""One compile for the xdist workers (issue 34): each module's bytecode is made once, both workers read
it, and the next run reads it again.

Where ``PYTHONDONTWRITEBYTECODE`` is set (this project's machines) or the checkout is fresh (the gate's
clone), every worker compiled every resacct module afresh through the jaxtyping/beartype hook (its AST
transform) and re-rewrote every test module's asserts: ~5 CPU s a worker, the same work twice. Here the
xdist controller names the run's bytecode folder (``RESACCT_RUN_BYTECODE``): the checkout's ignored
``.bytecode/`` (a subfolder per version of Python, pytest and jaxtyping), kept from one run to the next, or, where the checkout cannot be written, a temporary folder
removed when the run ends. Each worker, before it imports anything checked, sends both caches there (the
hook's ``.opt-jaxtyping`` pycs and pytest's rewritten test pycs; no ``__pycache__`` beside the sources, nothing
in the venv) and compiles the modules whose pyc there is missing or out of date and that the other worker
has not claimed yet (an ``O_EXCL`` claim file per module in a folder of this run's own,
``RESACCT_RUN_BYTECODE_CLAIMS``, removed when it ends), in the order collection imports them. Each worker
then finds the other's half cached, and a later run finds all of it: the usual loaders read it and
validate it as they always do (the hook's pycs by the source's mtime and size, pytest's by its hash), so
what runs is exactly what each would have compiled. A module whose pyc is not there yet is compiled by
the importer as before. Outside an xdist run nothing changes. ``rm -rf .bytecode`` forgets it all; a folder
grown past ``KEPT_LIMIT_BYTES`` (modules renamed and deleted over time) is emptied at a run's start.

Measured (``python benchmarks/quick_tier_time.py --baseline 10f023c --rounds 3 -- -k lecture-tensor-literal-is-float32``,
the workers' start alone, 2026-12-02): 20.8, 21.1, 20.1 s wall (39.3, 39.7, 37.4 CPU s) with the folder made afresh
each run, 16.7, 16.8, 14.2 s (30.9, 31.1, 25.3) with it kept; docs/suite_time.md, session 32.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

FOLDER_VARIABLE = "RESACCT_RUN_BYTECODE"
CLAIMS_VARIABLE = "RESACCT_RUN_BYTECODE_CLAIMS"
REPO = Path(__file__).resolve().parent.parent
KEPT_FOLDER_NAME = ".bytecode"  # in .gitignore
KEPT_LIMIT_BYTES = 256 * 2**20


def in_folder(folder: str, path: str) -> str:
    """``path`` (absolute) mirrored under ``folder``, as ``sys.pycache_prefix`` would place it."""
    return os.path.join(folder, os.path.abspath(path).lstrip(os.sep))


def start_run(config: pytest.Config) -> None:
    """The xdist controller: the bytecode folder (kept in the checkout, else a temporary one) and this run's
    claims folder, both inherited by the workers it starts."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    folder = _kept_folder()
    if folder is None:
        folder = tempfile.mkdtemp(prefix="resacct-run-bytecode-")
        config.stash[_REMOVED_AT_END] = [folder]
    claims = tempfile.mkdtemp(prefix="resacct-run-bytecode-claims-")
    config.stash[_REMOVED_AT_END] = [*config.stash.get(_REMOVED_AT_END, []), claims]
    config.stash[_VARIABLES] = {FOLDER_VARIABLE: folder, CLAIMS_VARIABLE: claims}
    os.environ.update(config.stash[_VARIABLES])


def end_run(config: pytest.Config) -> None:
    for path in config.stash.get(_REMOVED_AT_END, []):
        shutil.rmtree(path, ignore_errors=True)
    for name, value in config.stash.get(_VARIABLES, {}).items():
        if os.environ.get(name) == value:
            del os.environ[name]


_REMOVED_AT_END = pytest.StashKey[list[str]]()
_VARIABLES = pytest.StashKey[dict[str, str]]()


def _kept_folder() -> str | None:
    """The checkout's ``.bytecode/``, made if missing and emptied when it has grown past KEPT_LIMIT_BYTES; None
    where it cannot be made or written (a read-only checkout)."""
    folder = REPO / KEPT_FOLDER_NAME
    try:
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            return None
        if folder.is_dir() and _size_bytes(folder) > KEPT_LIMIT_BYTES:
            shutil.rmtree(folder)
        kept = folder / _tools_key()
        kept.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return str(kept) if os.access(kept, os.W_OK | os.X_OK) else None


def _tools_key() -> str:
    """A subfolder per version of the tools that make the code (jaxtyping's AST transform, pytest's rewrite): a
    pyc is checked against its source only, so an upgraded tool must not read the old one's."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "none"

    return f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}-jaxtyping-{installed('jaxtyping')}"


def _size_bytes(folder: Path) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def share_with_other_worker(config: pytest.Config, *, type_checked: bool) -> int:
    """An xdist worker: send both caches to the run's folder and compile the modules that are missing
    there or out of date and not claimed by the other worker. Returns how many this worker compiled."""
    folder = os.environ.get(FOLDER_VARIABLE)
    claims = os.environ.get(CLAIMS_VARIABLE)
    if not folder or not claims or not os.environ.get("PYTEST_XDIST_WORKER") or not os.path.isdir(folder):
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
        hooked = how is finder
        pyc = _hook_pyc(finder, path) if hooked else _rewrite_pyc(path)
        if is_current(pyc, path, hooked=hooked) or not _claim(claims, folder, pyc):
            continue
        try:
            compiled += _compile_hooked(finder, path, pyc) if hooked else _compile_rewritten(config, path, pyc)
        except (SyntaxError, ValueError, OSError):  # the importer meets it and reports it as it always did
            continue
    return compiled


def is_current(pyc: str, source: str, *, hooked: bool) -> bool:
    """Whether ``pyc`` holds today's ``source`` as its loader checks it: the hook's timestamp pyc by importlib's own
    validators (the source's mtime and size), pytest's checked-hash pyc by the header test of
    ``_pytest.assertion.rewrite._read_pyc`` (magic, flags, the source's hash), without unmarshalling the code as it does."""
    from importlib import _bootstrap_external

    try:
        with open(pyc, "rb") as handle:
            header = handle.read(16)
        if not hooked:
            return (len(header) == 16 and header[:4] == importlib.util.MAGIC_NUMBER and header[4:8] == b"\x03\x00\x00\x00"
                    and header[8:16] == importlib.util.source_hash(Path(source).read_bytes())[:8])
        if _bootstrap_external._classify_pyc(header, pyc, {}) != 0:  # a hash-based pyc: not what the hook writes
            return False
        stat = os.stat(source)
        _bootstrap_external._validate_timestamp_pyc(header, int(stat.st_mtime), stat.st_size, pyc, {})  # as SourceLoader.get_code passes them
        return True
    except (OSError, ImportError, EOFError):  # no pyc, another magic number, too short, out of date
        return False


def _claim(claims: str, folder: str, pyc: str) -> bool:
    """This worker compiles ``pyc`` unless the other claimed it first (a file in this run's claims folder)."""
    claim = os.path.join(claims, os.path.relpath(pyc, folder)) + ".claim"
    os.makedirs(os.path.dirname(claim), exist_ok=True)
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
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

