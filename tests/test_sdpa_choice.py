"""resacct.measurement.sdpa_choice: the CPU sdpa kernel this torch runs, seen by running it."""

from __future__ import annotations

import pytest
import torch

from resacct.errors import ResacctError
from resacct.measurement.sdpa_choice import cpu_sdpa_kernel

SHAPES = [(4, 4, 8), (4, 2, 8), (4, 1, 16), (8, 2, 12)]


@pytest.fixture(autouse=True)
def _fresh_cache():
    cpu_sdpa_kernel.cache_clear()
    yield
    cpu_sdpa_kernel.cache_clear()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SHAPES)
def test_the_kernel_is_the_one_torchs_own_chooser_picks(heads, kv_heads, head_dim, dtype):
    """torch's dispatcher answers the same question itself (torch._fused_sdp_choice, private): the probe agrees."""
    chooser = getattr(torch, "_fused_sdp_choice", None)
    q = torch.zeros(1, heads, 2, head_dim, dtype=getattr(torch, dtype))
    k = torch.zeros(1, kv_heads, 2, head_dim, dtype=getattr(torch, dtype))
    try:
        choice = chooser(q, k, k, None, 0.0, True, scale=None, enable_gqa=kv_heads != heads)
    except (TypeError, AttributeError):
        pytest.skip(f"torch {torch.__version__} has no torch._fused_sdp_choice taking enable_gqa (torch < 2.5)")
    expected = "flash" if choice == int(torch.nn.attention.SDPBackend.FLASH_ATTENTION) else "math"
    assert cpu_sdpa_kernel(heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype) == expected
    if kv_heads == heads:
        assert expected == "flash"  # every torch resacct admits runs equal heads by its CPU flash kernel


def test_a_disabled_flash_kernel_is_seen_and_the_callers_modes_do_not_hide_the_cpu():
    import torch._dynamo  # noqa: F401  (FakeTensorMode imports it; on torch 2.8 that import fails under torch.device('meta'))
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        assert cpu_sdpa_kernel(heads=4, kv_heads=4, head_dim=8, dtype="float32") == "math"
    cpu_sdpa_kernel.cache_clear()
    outside = cpu_sdpa_kernel(heads=4, kv_heads=2, head_dim=8, dtype="float32")
    cpu_sdpa_kernel.cache_clear()
    with torch.device("meta"), FakeTensorMode():  # where resacct's tracker calls the formulas from
        assert cpu_sdpa_kernel(heads=4, kv_heads=2, head_dim=8, dtype="float32") == outside
    assert cpu_sdpa_kernel(heads=4, kv_heads=4, head_dim=8, dtype="float32") == "flash"


@pytest.mark.parametrize(("arguments", "message"), [
    (dict(heads=4, kv_heads=4, head_dim=8, dtype="float64"), "dtype 'float64': expected one of float32, bfloat16, float16"),
    (dict(heads=0, kv_heads=1, head_dim=8, dtype="float32"), "heads 0: expected a whole number ≥ 1"),
    (dict(heads=4, kv_heads=True, head_dim=8, dtype="float32"), "kv_heads True: expected a whole number ≥ 1"),
    (dict(heads=4, kv_heads=3, head_dim=8, dtype="float32"),
     "heads 4 and kv_heads 3: expected the query heads to be a multiple of the key/value heads"),
])
def test_bad_shapes_are_refused_naming_the_value(arguments, message):
    with pytest.raises(ResacctError) as error:
        cpu_sdpa_kernel(**arguments)
    assert str(error.value) == message
