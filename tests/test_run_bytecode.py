"""tests/run_bytecode.py: what one xdist worker compiles, the other reads, and the code read is the code
the importer would have made (the hook's checks included, pytest's assert messages included)."""

from __future__ import annotations

import os
import sys
import types
import uuid
from pathlib import Path

import jaxtyping
import pytest
from _pytest.assertion import rewrite
from jaxtyping import _import_hook

from conftest import TYPECHECKER
from tests import run_bytecode


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run's folder, with both redirections undone after the test."""
    monkeypatch.setattr(_import_hook, "_optimized_cache_from_source", _import_hook._optimized_cache_from_source)
    monkeypatch.setattr(rewrite, "get_cache_dir", rewrite.get_cache_dir)
    run = tmp_path / "run"
    run.mkdir()
    return str(run)


def test_a_module_compiled_by_one_worker_is_read_by_the_other_with_its_checks(folder: str, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"hc_checked_{uuid.uuid4().hex[:8]}"
    source = tmp_path / "src" / f"{name}.py"
    source.parent.mkdir()
    source.write_text("def double(x: int) -> int:\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(source.parent))
    manager = jaxtyping.install_import_hook([name], TYPECHECKER)
    try:
        finder = manager.hook
        assert run_bytecode._redirect_hook_cache(folder)
        pyc = run_bytecode._hook_pyc(finder, str(source))
        assert pyc.startswith(folder + os.sep) and ".opt-jaxtyping" in pyc
        claims = tmp_path / "claims"
        assert run_bytecode._claim(str(claims), folder, pyc) and not run_bytecode._claim(str(claims), folder, pyc)  # the other worker skips it
        assert not run_bytecode.is_current(pyc, str(source), hooked=True)
        assert run_bytecode._compile_hooked(finder, str(source), pyc) == 1
        assert run_bytecode.is_current(pyc, str(source), hooked=True)

        def never(*args: object, **kwargs: object) -> types.CodeType:
            raise AssertionError("compiled again: the pyc in the run's folder was not read")

        monkeypatch.setattr(_import_hook._JaxtypingLoader, "source_to_code", never)
        module = __import__(name)
        assert module.double(3) == 6
        with pytest.raises(Exception, match="double"):  # beartype refuses a str: the cached code carries the hook
            module.double("3")
    finally:
        manager.uninstall()
        sys.modules.pop(name, None)
    assert not list((tmp_path / "src").rglob("*.pyc")), "a pyc was written beside the source"
    source.write_text("def double(x: int) -> int:\n    return x + x  # edited\n")
    assert not run_bytecode.is_current(pyc, str(source), hooked=True)  # the loader would refuse it: compiled again


def test_a_test_module_rewritten_by_one_worker_is_read_by_pytest(folder: str, tmp_path: Path,
                                                                  pytestconfig: pytest.Config) -> None:
    source = tmp_path / "test_rewritten.py"
    source.write_text("def check():\n    x = 1\n    assert x == 2\n")
    assert run_bytecode._redirect_rewrite_cache(folder)
    pyc = run_bytecode._rewrite_pyc(str(source))
    assert pyc.startswith(folder) and pyc.endswith(rewrite.PYC_TAIL)
    assert run_bytecode._compile_rewritten(pytestconfig, str(source), pyc) == 1
    code = rewrite._read_pyc(source, Path(pyc), lambda *args: None)
    assert code is not None, "pytest does not accept the pyc"
    assert run_bytecode.is_current(pyc, str(source), hooked=False)
    source.write_text("def check():\n    x = 1\n    assert x == 3\n")
    assert not run_bytecode.is_current(pyc, str(source), hooked=False)
    namespace: dict[str, object] = {}
    exec(code, namespace)
    with pytest.raises(AssertionError, match=r"assert 1 == 2"):  # pytest's rewritten message, not a bare assert
        namespace["check"]()  # type: ignore[operator]


def _controller() -> types.SimpleNamespace:
    return types.SimpleNamespace(option=types.SimpleNamespace(numprocesses=2), stash=pytest.Stash())


@pytest.fixture
def controller_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A checkout of its own (tmp_path) for the controller, no run's variables inherited."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv(run_bytecode.FOLDER_VARIABLE, raising=False)
    monkeypatch.delenv(run_bytecode.CLAIMS_VARIABLE, raising=False)
    monkeypatch.setattr(run_bytecode, "REPO", tmp_path)
    return tmp_path


def test_the_controller_keeps_the_checkouts_folder_and_removes_the_runs_claims(controller_env: Path) -> None:
    config = _controller()
    run_bytecode.start_run(config)  # type: ignore[arg-type]
    kept, claims = os.environ[run_bytecode.FOLDER_VARIABLE], os.environ[run_bytecode.CLAIMS_VARIABLE]
    assert Path(kept).parent == controller_env / run_bytecode.KEPT_FOLDER_NAME and os.path.isdir(claims)
    assert f"pytest-{pytest.__version__}" in Path(kept).name and f"jaxtyping-{jaxtyping.__version__}" in Path(kept).name
    run_bytecode.end_run(config)  # type: ignore[arg-type]
    assert os.path.isdir(kept) and not os.path.exists(claims)
    assert run_bytecode.FOLDER_VARIABLE not in os.environ and run_bytecode.CLAIMS_VARIABLE not in os.environ


def test_a_checkout_that_cannot_keep_it_gets_a_folder_removed_at_the_end(controller_env: Path) -> None:
    (controller_env / run_bytecode.KEPT_FOLDER_NAME).write_text("a file where the folder would go\n")
    config = _controller()
    run_bytecode.start_run(config)  # type: ignore[arg-type]
    made = os.environ[run_bytecode.FOLDER_VARIABLE]
    assert not made.startswith(str(controller_env)) and os.path.isdir(made)
    run_bytecode.end_run(config)  # type: ignore[arg-type]
    assert not os.path.exists(made)


def test_a_folder_grown_past_the_limit_is_emptied_at_the_start(controller_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = controller_env / run_bytecode.KEPT_FOLDER_NAME / "cpython-39-old-tools" / "stale.pyc"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"x" * 2048)
    monkeypatch.setattr(run_bytecode, "KEPT_LIMIT_BYTES", 1024)
    config = _controller()
    run_bytecode.start_run(config)  # type: ignore[arg-type]
    run_bytecode.end_run(config)  # type: ignore[arg-type]
    assert not old.exists() and (controller_env / run_bytecode.KEPT_FOLDER_NAME).is_dir()


def test_a_later_run_compiles_only_what_changed(controller_env: Path, monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config) -> None:
    """The second run finds the first one's pycs current and compiles nothing; an edited module is compiled again."""
    tests_folder = controller_env / "tests"
    tests_folder.mkdir()
    (tests_folder / "test_kept.py").write_text("def test_k():\n    assert 1\n")
    edited = tests_folder / "test_edited.py"
    edited.write_text("def test_e():\n    assert 1\n")
    monkeypatch.setattr(rewrite, "get_cache_dir", rewrite.get_cache_dir)

    def one_run() -> int:
        config = _controller()
        run_bytecode.start_run(config)  # type: ignore[arg-type]
        with monkeypatch.context() as worker:
            worker.setenv("PYTEST_XDIST_WORKER", "gw0")
            compiled = run_bytecode.share_with_other_worker(pytestconfig, type_checked=False)
        run_bytecode.end_run(config)  # type: ignore[arg-type]
        return compiled

    assert one_run() == 2
    assert one_run() == 0
    edited.write_text("def test_e():\n    assert 2\n")
    assert one_run() == 1


@pytest.mark.parametrize("numprocesses", [None, 0])
def test_without_workers_nothing_is_made(monkeypatch: pytest.MonkeyPatch, numprocesses: int | None) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv(run_bytecode.FOLDER_VARIABLE, raising=False)
    config = types.SimpleNamespace(option=types.SimpleNamespace(numprocesses=numprocesses), stash=pytest.Stash())
    run_bytecode.start_run(config)  # type: ignore[arg-type]
    assert run_bytecode.FOLDER_VARIABLE not in os.environ
    assert run_bytecode.share_with_other_worker(config, type_checked=True) == 0  # type: ignore[arg-type]


def test_a_module_that_does_not_compile_is_left_to_the_importer(folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 pytestconfig: pytest.Config) -> None:
    """A broken file under tests/ (a half-written test) does not stop the worker: its import reports it."""
    broken = tmp_path / "tests" / "test_broken.py"
    broken.parent.mkdir()
    broken.write_text("def f(:\n")
    fine = tmp_path / "tests" / "test_fine.py"
    fine.write_text("def test_f():\n    assert 1\n")
    monkeypatch.setattr(run_bytecode, "REPO", tmp_path)
    monkeypatch.setenv(run_bytecode.FOLDER_VARIABLE, folder)
    monkeypatch.setenv(run_bytecode.CLAIMS_VARIABLE, str(tmp_path / "claims"))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    assert run_bytecode.share_with_other_worker(pytestconfig, type_checked=False) == 1  # test_fine.py only
    assert os.path.exists(run_bytecode._rewrite_pyc(str(fine))) and not os.path.exists(run_bytecode._rewrite_pyc(str(broken)))
