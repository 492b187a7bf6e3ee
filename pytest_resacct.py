"""pytest plugin of resacct (entry point ``pytest11``): collects ``*.claims.yaml`` files.

This module imports nothing from ``resacct`` at import time. jaxtyping's import hook
(``--jaxtyping-packages=resacct,...``) refuses a package that is already imported, and pytest
loads entry-point plugins before that hook is installed; so everything is imported inside the
hooks, which run after it.

It is a thin shim over ``resacct.harness``: the items (``plugin``), the claims' Hypothesis
settings and shared keys (``pytest_settings``) and the recorder of the claims table
(``recorder``) all live there, and none of them imports this module back.
"""

from __future__ import annotations

import fnmatch

import pytest

# resacct registers no markers: its claim items carry their marks (gpu, slow, distributed; `-m gpu`
# selects them) without registering the names, so a host project's --strict-markers means the same
# with or without resacct installed (its own @pytest.mark.gpu still needs its own registration).


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("claims_files", "glob of claims files pytest collects", default="*.claims.yaml")
    group = parser.getgroup("resacct", "resacct claims")
    group.addoption("--claims-json", metavar="PATH", default=None, help="write one JSON record per claim to PATH")
    group.addoption("--no-claims-summary", action="store_true", default=False, help="do not print the claims table")


def pytest_configure(config: pytest.Config) -> None:
    # pytest_load_initial_conftests (where jaxtyping installs its hook) has run by now.
    from resacct.harness.pytest_settings import SEEN_CLAIM_IDS, check_switch_variables, hypothesis_profile_name
    from resacct.harness.recorder import CLAIMS_RECORDER, RECORDER_PLUGIN_NAME, ClaimsRecorder

    hypothesis_profile_name()  # a bad RESACCT_HYPOTHESIS_PROFILE is a usage error up front
    check_switch_variables()  # RESACCT_REQUIRE_TIMING=banana too
    config.stash[SEEN_CLAIM_IDS] = {}
    config.stash[CLAIMS_RECORDER] = recorder = ClaimsRecorder(config)
    config.pluginmanager.register(recorder, RECORDER_PLUGIN_NAME)


def pytest_collect_file(file_path, parent):  # type: ignore[no-untyped-def]
    pattern = parent.config.getini("claims_files")
    if fnmatch.fnmatch(file_path.name, pattern) and not file_path.name.startswith("."):  # .#x.claims.yaml: an editor's lock
        from resacct.harness.plugin import ClaimsFile
        from resacct.harness.pytest_settings import SEEN_CLAIM_IDS

        return ClaimsFile.from_parent(parent, path=file_path, seen_ids=parent.config.stash[SEEN_CLAIM_IDS])
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    from resacct.harness.early_ranks import start_ranks_early

    start_ranks_early(session)
