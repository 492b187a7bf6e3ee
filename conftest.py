"""Root conftest: pytester for the harness tests, and this repository's own Hypothesis profile.

The claims plugin itself is the installed ``pytest_resacct`` entry point, so ``pytest`` collects
``resacct/specs/*.claims.yaml`` from anywhere. That plugin never loads a Hypothesis profile (it
sets the claims' settings per claim item); the profile below is this repository acting as any
host project would, for its own unit tests only.
"""

import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("resacct-tests", max_examples=40, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("resacct-tests-ci", max_examples=25, deadline=None, derandomize=True, database=None, print_blob=True, suppress_health_check=_QUIET)
settings.load_profile("resacct-tests-ci" if os.environ.get("CI", "").lower() in {"1", "true", "yes"} else "resacct-tests")
