"""torch 2.4 and 2.5 print a DeprecationWarning when torch.distributed.optim is imported, under their own
``simplefilter("always")``; the forkserver preloaded it and the warning reached the terminal beside
``resacct shard``'s lines (tests/test_shard_signals.py's Ctrl-C test on torch 2.4.1). The forkserver
now preloads resacct.measurement.quiet_distributed_optim, which imports it with the warning caught."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from resacct.measurement import distributed


def test_the_forkserver_preloads_torch_distributed_optim_through_the_quiet_module():
    assert "resacct.measurement.quiet_distributed_optim" in distributed._PRELOAD
    assert "torch.distributed.optim" not in distributed._PRELOAD


@pytest.mark.slow  # 2.14 s idle on 2026-11-28: a fresh process
def test_the_quiet_module_imports_torch_distributed_optim_and_prints_nothing():
    code = ("import sys, warnings; warnings.simplefilter('always'); import resacct.measurement.quiet_distributed_optim; "
            "print('torch.distributed.optim' in sys.modules)")
    result = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
    assert "TorchScript" not in result.stderr and "DeprecationWarning" not in result.stderr, result.stderr


@pytest.mark.slow  # 1.79 s idle on 2026-11-28: a fresh process killed
def test_the_quiet_module_leaves_no_temporary_folder_behind_a_killed_process(tmp_path):
    """torch up to 2.8 makes a folder at the import (removed at a normal exit only); os._exit stands for
    the SIGKILL that stops an interrupted run's forkserver."""
    code = "import os, resacct.measurement.quiet_distributed_optim; os._exit(0)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == []
