"""The ``resacct`` command line.

Every module in this package (but ``app``, ``arguments``, ``output`` and the ``_private`` ones)
defines ``register(subparsers)``; ``main`` builds the parser, runs the chosen command, and turns
every ResacctError into one line ``resacct <command>: error: …`` on stderr with exit status 2,
and Ctrl-C at any moment into ``resacct: interrupted``, exit status 130.

Only the chosen command's module is imported and registered (``COMMAND_MODULES``): a napkin
command such as ``resacct memory`` never pays for another command's imports (``account``'s pull
in torch). ``resacct --help``, ``--version`` or an unknown command register them all.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

__all__ = ["main"]

_NOT_COMMANDS = {"app", "arguments", "output"}

COMMAND_MODULES = {
    "account": "account", "devices": "devices", "fit": "compute", "flops": "compute", "mfu": "compute", "roofline": "compute",
    "time": "compute", "dtypes": "formats", "formats": "formats", "infer": "infer", "lora": "lora", "machine": "machine",
    "memory": "memory", "offload": "offload", "optimal": "plan", "plan": "plan", "run": "run", "shard": "shard", "verify": "verify",
}
"""Each command and the module of this package that registers it (``tests/test_cli_startup.py``
checks it against what the modules register)."""


def _command_modules(argv: list[str] | None = None) -> list[object]:
    """The command modules to register: the one ``argv``'s command lives in, or all of them."""
    command = next((word for word in argv or [] if not word.startswith("-")), None)
    if command in COMMAND_MODULES:
        names = [COMMAND_MODULES[command]]
    else:
        package = sys.modules[__name__]
        names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name not in _NOT_COMMANDS and not m.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``resacct`` script; returns the exit status. Ctrl-C at any moment,
    imports included, is ``resacct: interrupted`` and 130, never a traceback — also when resacct
    was started with SIGINT ignored (a background job of a script: ``resacct shard … &``)."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:
        print("resacct: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    from resacct.cli.app import build_parser, subparsers_of
    from resacct.errors import ResacctError

    parser = build_parser()
    subparsers = subparsers_of(parser)
    for module in _command_modules(argv):
        module.register(subparsers)  # type: ignore[attr-defined]
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:  # what the command does not take: its own usage and --help named, not the top level's
            (subparsers.choices.get(getattr(args, "command", None)) or parser).error(f"unrecognized arguments: {' '.join(extras)}")
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
    except BrokenPipeError:  # e.g. `resacct devices --json | head`: the reader left; stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry_point() -> None:
    status = main()
    # Everything still alive joins the permanent generation: the interpreter's collection at exit
    # then skips it instead of scanning every object a traced 7B step left (0.8-1.2 CPU s of a
    # `resacct account --hf-config llama-2-7b`, measured side by side under load). Objects are
    # still released at exit as before; only the cyclic collector's last scan is saved.
    import gc

    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    entry_point()
