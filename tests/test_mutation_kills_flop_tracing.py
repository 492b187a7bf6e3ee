"""Tests that kill mutants of resacct/flop_tracing.py (see docs/mutation.md): its docstring
examples (torch's own counts on the meta device) and edges of the op classification, each
checked against what torch itself reports."""

from __future__ import annotations

import doctest

import torch
from torch import nn

from resacct import flop_tracing
from resacct.flop_tracing import (
    UncountedOp,
    build_on_meta,
    estimate_uncounted_flops,
    flop_counter_counts,
    flop_warnings,
    is_matmul_class,
    trace_flops,
    uncounted_ops,
)
from resacct.models import Cruncher


def test_docstring_examples():
    assert doctest.testmod(flop_tracing, optionflags=doctest.ELLIPSIS).failed == 0
