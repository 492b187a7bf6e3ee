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


_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)\s*(?:<[^`>]*>)?`")  # :func:`~a.b.c`, :class:`text <target>`
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_STRONG = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)


def plain_help_text(text: str | None) -> str | None:
    """A docstring as ``--help`` shows it: reStructuredText's inline markup taken off — double
    backticks, roles (``:func:`~a.b.c``` → ``c``), bold.

    >>> plain_help_text("``resacct lora``: see :func:`~resacct.formulas.lora.lora_saved_terms`, an **estimate**")
    'resacct lora: see lora_saved_terms, an estimate'
    """
    if not text:
        return text

    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        return target.rsplit(".", 1)[-1] if match.group(0).split("`", 1)[1].startswith("~") else target

    return _STRONG.sub(r"\1", _LITERAL.sub(r"\1", _ROLE.sub(role, text)))


class OneLineErrorParser(argparse.ArgumentParser):
    """A bad argument is one line, ``resacct <command>: error: <what> (see --help)``, exit status 2.
    Descriptions, epilogs and argument help are shown without their reStructuredText markup."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        for key in ("description", "epilog"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = plain_help_text(kwargs[key])
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NUMBER_LIKE

    def add_argument(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = plain_help_text(kwargs["help"])
        return super().add_argument(*args, **kwargs)

    def add_argument_group(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        group = super().add_argument_group(*args, **kwargs)
        plain_add = group.add_argument

        def add_argument(*arguments, **keywords):  # type: ignore[no-untyped-def]
            if isinstance(keywords.get("help"), str):
                keywords["help"] = plain_help_text(keywords["help"])
            return plain_add(*arguments, **keywords)

        group.add_argument = add_argument  # type: ignore[method-assign]
        return group

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
