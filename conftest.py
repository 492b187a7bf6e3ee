"""Root conftest: pytester for the harness tests. The claims plugin itself is the installed
``pytest_resacct`` entry point, so ``pytest`` collects ``resacct/specs/*.claims.yaml`` from anywhere."""

pytest_plugins = ["pytester"]
