"""The ``resacct`` command line.

Every module in this package (but ``app`` and ``arguments``) defines ``register(subparsers)``;
``main`` builds the parser from all of them, runs the chosen command, and turns every
ResacctError into one line ``resacct: error: …`` on stderr with exit status 2.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

__all__ = ["main"]

_NOT_COMMANDS = {"app", "arguments", "output"}


def _command_modules() -> list[object]:
    package = sys.modules[__name__]
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name not in _NOT_COMMANDS and not m.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``resacct`` script; returns the exit status."""
    from resacct.cli.app import build_parser, subparsers_of
    from resacct.errors import ResacctError

    parser = build_parser()
    subparsers = subparsers_of(parser)
    for module in _command_modules():
        module.register(subparsers)  # type: ignore[attr-defined]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except ResacctError as error:
        print(f"resacct {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("resacct: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `resacct devices --json | head`: the reader left; stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry_point() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
