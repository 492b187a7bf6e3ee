"""A repo script (``benchmarks/``, ``tools/``) loaded as a module, for the tests of its pure parts (the scripts
themselves run whole verifies or launches: benchmarks, not tests)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load_script(relative_path: str) -> ModuleType:
    """The script at ``relative_path`` (from the repo's root) executed as a fresh module."""
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    assert spec is not None and spec.loader is not None, f"{path} is not a Python file"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
