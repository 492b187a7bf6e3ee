"""The argument parser every command module registers on.

A command module in ``resacct/cli/`` defines ``register(subparsers)``, which adds one or more
sub-parsers and sets ``run=`` to a function ``(args) -> int`` with ``set_defaults``.
argparse answers a bad argument with the usage line, what was wrong, and exit status 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

__all__ = ["build_parser", "OneLineErrorParser", "RawDescriptionHelpFormatter"]

RawDescriptionHelpFormatter = argparse.RawDescriptionHelpFormatter

# argparse reads "-70e9", "-70B" or a recipe "-2+2+12" as an unknown option ("expected one
# argument"); treating every number-like word as a value lets the argument's type say what is wrong.
_NUMBER_LIKE = re.compile(r"^-(\d[\d_,]*\.?\d*|\.\d+)([eE][-+]?\d+)?[kKMBGTP]?$|^-(nan|inf)$|^-[\d.]+(\s*\+\s*-?[\d.]+)+$", re.IGNORECASE)


class OneLineErrorParser(argparse.ArgumentParser):
    """A bad argument is one line, ``resacct <command>: error: <what> (see --help)``, exit status 2."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NUMBER_LIKE

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="resacct",
        description="Resource accounting for PyTorch training, verified: napkin math, FLOPs, memory, and the claims report.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from resacct import __version__

    parser.add_argument("--version", action="version", version=f"resacct {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=OneLineErrorParser)
    return parser


def subparsers_of(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise LookupError("the resacct parser has no subcommands")
