"""The claims harness: YAML claims collected by pytest and checked against real PyTorch.

Generic: it knows nothing of FLOPs or dtypes. The pieces are

- ``schema``     — the pydantic model of a claims file (unknown keys forbidden);
- ``loader``     — YAML → validated claims, with the line of every claim and key;
- ``laws``       — the safe evaluator of laws such as ``2*m*k*n``;
- ``strategies`` — the named hypothesis strategies ``forall`` may use;
- ``registry``   — ``@check`` and ``Outcome``: how a check reports what it measured;
- ``evaluate``   — one claim, one set of inputs → holds or not, with all three numbers;
- ``plugin``     — the pytest items (one per claim) and their marks;
- ``report``     — the claims table and the JSON records behind it;
- ``recorder``   — the pytest plugin object that gathers a run's records and writes both;
- ``pytest_settings`` — what the items share with the ``pytest_resacct`` entry point (the
  record's property key, the claims' Hypothesis settings): the entry point imports it and the
  harness modules above, never the other way round.
"""
