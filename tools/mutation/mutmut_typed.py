"""Run mutmut's command line with the project's jaxtyping import hook installed, as the suite has it.

The root ``conftest.py`` installs jaxtyping's import hook (beartype over the tensor-carrying
subpackages) and refuses to start when ``resacct`` is already imported: the hook must come before
any resacct module. mutmut runs pytest several times inside one process (stats, clean run,
forced failure) and forks every mutant's run from it, and pytest re-executes the root conftest on
every ``pytest.main`` — so from the second run on ``resacct`` is imported and that refusal fires
("resacct was imported before the type-checking hook"; pytest exits 4 and mutmut stops).

Here the root conftest of the scratch copy is executed once, before anything imports ``resacct``,
so it installs its own hook with its own module list and checker; then ``RESACCT_MUTATION_HOOK=1``
tells the (scratch) conftest, patched by run.sh, that the hook is already in place, and its later
executions skip the guard and the second install. Every mutant is therefore run against
type-checked code exactly as in the normal suite.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def install_project_hook() -> None:
    if os.environ.get("RESACCT_MUTATION_HOOK") == "1":
        return
    conftest = Path("conftest.py").resolve()
    if "RESACCT_MUTATION_HOOK" not in conftest.read_text():
        raise SystemExit(f"{conftest} is not patched for mutation runs (run tools/mutation/run.sh, which patches its scratch copy)")
    spec = importlib.util.spec_from_file_location("_resacct_root_conftest_for_mutmut", conftest)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # installs the hook: resacct is not imported yet
    os.environ["RESACCT_MUTATION_HOOK"] = "1"


def main() -> None:
    install_project_hook()
    from mutmut.__main__ import cli

    sys.exit(cli())


if __name__ == "__main__":
    main()
