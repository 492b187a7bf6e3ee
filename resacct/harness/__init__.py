"""The claims harness: YAML claims collected by pytest and checked against real PyTorch.

Generic: it knows nothing of FLOPs or dtypes. The pieces are

- ``schema``     — the pydantic model of a claims file (unknown keys forbidden);
- ``loader``     — YAML → validated claims, with the line of every claim and key;
- ``laws``       — the safe evaluator of laws such as ``2*m*k*n``;
- ``strategies`` — the named hypothesis strategies ``forall`` may use;
- ``registry``   — ``@check`` and ``Outcome``: how a check reports what it measured;
- ``evaluate``   — one claim, one set of inputs → holds or not, with all three numbers;
- ``plugin``     — the pytest items, marks and terminal summary.
"""
