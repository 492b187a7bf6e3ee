"""finetune.qlora_base_bytes: skips without bitsandbytes; with it, the components add up."""

from __future__ import annotations

import importlib.util

import pytest

from resacct.checks.finetune import qlora_base_bytes
from resacct.harness.registry import NotMeasurable

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


@pytest.mark.skipif(HAS_BNB, reason="bitsandbytes is installed")
def test_without_bitsandbytes_not_measurable() -> None:
    with pytest.raises(NotMeasurable, match="bitsandbytes is not installed"):
        qlora_base_bytes("frozen_bytes")


@pytest.mark.skipif(not HAS_BNB or importlib.util.find_spec("transformers") is None, reason="needs bitsandbytes and transformers")
def test_components_add_up() -> None:
    parts = {q: qlora_base_bytes(q).measured for q in ("packed_weight_bytes", "absmax_bytes", "nested_absmax_bytes", "constant_bytes",
                                                       "quantized_weight_bytes", "bf16_bytes", "frozen_bytes")}
    assert parts["quantized_weight_bytes"] == parts["packed_weight_bytes"] + parts["absmax_bytes"] + parts["nested_absmax_bytes"]
    assert parts["frozen_bytes"] == parts["quantized_weight_bytes"] + parts["constant_bytes"] + parts["bf16_bytes"]
    assert parts["constant_bytes"] == 14 * (16 * 4 + 256 * 4 + 4)
