"""Make ``--dist loadgroup`` group again on pytest ≥ 9.2 (a plugin the root ``conftest.py`` loads).

pytest-xdist's worker marks an item's group by appending ``@group`` to ``item._nodeid``; pytest
9.2 keeps node ids in a structured ``item._id`` and no longer reads ``_nodeid``, so the suffix is
lost and every test is scheduled on its own: the claims of one spec file and their mutation
meta-tests landed on different workers, and 344 meta-tests skipped for want of the remembered
measurement (pytest-xdist issue #1386, fix proposed in PR #1388, neither released on 2026-11-24).
This hook, run after xdist's, carries the suffixed id over to the structured one. It does nothing
where xdist's suffix already took effect (older pytest) or where no group was marked.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest < 9.2: xdist's own suffix works
        return
    for item in items:
        suffixed = item.__dict__.get("_nodeid")
        if isinstance(suffixed, str) and "@" in suffixed and item.nodeid != suffixed:
            item._id = NodeId.parse(suffixed)  # type: ignore[attr-defined]
