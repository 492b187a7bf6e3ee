"""Output helpers shared by commands: ``--json`` (named fields with units in the names) or text."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_json_flag", "emit"]


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object with named fields (units in the names)")


def emit(args: argparse.Namespace, fields: dict[str, Any], text: str) -> int:
    """Print ``fields`` as JSON when ``--json`` was given, else the human-readable ``text``."""
    if getattr(args, "json", False):
        json.dump(fields, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")
    return 0
