"""The ``resacct`` script's exit: its status is main's, and what is alive is frozen first so the
interpreter's last collection does not scan a traced step's objects (resacct/cli/__init__.py)."""

from __future__ import annotations

import gc

import pytest

import resacct.cli as cli


@pytest.mark.parametrize("status", [0, 2, 130])
def test_entry_point_exits_with_mains_status_after_freezing_what_is_alive(monkeypatch, status):
    monkeypatch.setattr(cli, "main", lambda: status)
    frozen: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(len(gc.get_objects())))
    with pytest.raises(SystemExit) as exited:
        cli.entry_point()
    assert exited.value.code == status
    assert len(frozen) == 1 and frozen[0] > 0
