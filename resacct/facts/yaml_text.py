"""YAML text read into Python values with libyaml's parser where PyYAML was built with it (its
wheels for Linux, macOS and Windows are), else PyYAML's own: the same safe constructor and resolver
either way, so the same values (tests/test_yaml_text.py compares both on the shipped tables). The
datasheet table (47 KB) took 50-52 ms in PyYAML's pure-Python parser and 5 in libyaml's on a 2-core AMD
EPYC (``python benchmarks/parse_costs.py``); every command that looks a board up pays it once (issue 34)."""

from __future__ import annotations

from typing import Any

__all__ = ["safe_load_text"]


def safe_load_text(text: str) -> Any:
    """``yaml.safe_load(text)``, parsed by libyaml where PyYAML has it."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader either way
