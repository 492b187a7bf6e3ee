"""The argument parser every command module registers on.

A command module in ``resacct/cli/`` defines ``register(subparsers)``, which adds one or more
sub-parsers and sets ``run=`` to a function ``(args) -> int`` with ``set_defaults``.
argparse answers a bad argument with the usage line, what was wrong, and exit status 2.
"""

from __future__ import annotations

import argparse

__all__ = ["build_parser", "RawDescriptionHelpFormatter"]

RawDescriptionHelpFormatter = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resacct",
        description="Resource accounting for PyTorch training, verified: napkin math, FLOPs, memory, and the claims report.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from resacct import __version__

    parser.add_argument("--version", action="version", version=f"resacct {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    return parser


def subparsers_of(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise LookupError("the resacct parser has no subcommands")
