"""``torch.distributed.optim`` imported without the warning torch 2.4 and 2.5 print at its import.

Those versions warn "`TorchScript` support for functional optimizers is deprecated" when the module
is imported, under ``warnings.simplefilter("always")`` of their own (pytorch/pytorch#139661; 2.6 moved
the warning into the scripted optimizers, pytorch#140889), so no filter of ours can stop it. The
forkserver preloads this module in place of ``torch.distributed.optim``
(:data:`resacct.measurement.distributed._PRELOAD`): it printed the warning to the terminal beside
``resacct shard``'s own lines (seen with torch 2.4.1, 2026-11-28). ``record=True`` catches it: the
nested ``catch_warnings`` of torch keeps our recorder.

The same import makes torch up to 2.8 create a temporary folder at once
(``torch.distributed.nn.jit.instantiator``: a ``TemporaryDirectory`` removed at exit, for the
templates of scriptable ``RemoteModule`` modules, which resacct never builds; torch 2.13 makes it when
first used). A forkserver stopped with SIGKILL (``lifeline.stop_forkserver``, Ctrl-C) never exits
normally, so the folder was left in TMPDIR (``tmp*``, tests/test_shard_signals.py on torch 2.4.1):
it is removed here, once imported."""

from __future__ import annotations

import sys
import warnings

__all__: list[str] = []

with warnings.catch_warnings(record=True):
    import torch.distributed.optim  # noqa: F401

_templates = getattr(sys.modules.get("torch.distributed.nn.jit.instantiator"), "_TEMP_DIR", None)
if _templates is not None:
    _templates.cleanup()
