"""Run mutmut's command line with jaxtyping's import hook installed, as pytest.ini would.

pytest.ini installs the hook through ``--jaxtyping-packages=resacct,beartype.beartype(...)``, and
jaxtyping's pytest plugin refuses to start when ``resacct`` is already imported. mutmut runs
pytest several times inside one process (stats, clean run, forced failure) and forks every mutant's
run from it, so from the second run on that refusal would fire. Here the hook is installed once,
before anything imports ``resacct``, with the same packages and beartype configuration as
pytest.ini; run.sh then passes ``-o addopts=`` so pytest's own hook stays off. Every mutant is
therefore run against type-checked code exactly as in the normal suite.
"""

from __future__ import annotations

import sys

import jaxtyping

PACKAGES = ["resacct"]
TYPECHECKER = "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))"


def main() -> None:
    jaxtyping.install_import_hook(PACKAGES, TYPECHECKER)
    from mutmut.__main__ import cli

    sys.exit(cli())


if __name__ == "__main__":
    main()
