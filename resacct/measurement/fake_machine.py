"""Reading ``RESACCT_FAKE_MACHINE``'s JSON (:func:`resacct.measurement.machine_profile.this_machine`
checks its fields): whatever the variable holds is one line naming it, never a traceback.

>>> read_fake_machine('{"cpu_bf16_matmul": "amx"}', "RESACCT_FAKE_MACHINE")
{'cpu_bf16_matmul': 'amx'}
"""

from __future__ import annotations

import json
import sys
from typing import Any

from resacct.errors import ResacctError

__all__ = ["read_fake_machine"]


def read_fake_machine(text: str, variable: str) -> dict[str, Any]:
    """The JSON object in ``text``; refused in one line when it is not JSON, holds an integer of
    more than Python's 4,300 digits, nests deeper than Python's JSON reader goes, or is no object."""
    example = '{"physical_cores": 8}'
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as error:
        raise ResacctError(f"{variable} is not JSON ({error.msg}); expected an object such as " '\'{"cpu_bf16_matmul": "amx"}\'') from None
    except ValueError:  # Python refuses to read an integer of more than 4300 digits
        raise ResacctError(f"{variable} holds a number of more than {sys.get_int_max_str_digits()} digits; "
                           f"expected an object of profile fields such as '{example}'") from None
    except RecursionError:
        raise ResacctError(f"{variable} nests arrays or objects deeper than Python's JSON reader goes ({len(text):,} characters); "
                           f"expected a flat object of profile fields such as '{example}'") from None
    if not isinstance(overrides, dict):
        raise ResacctError(f"{variable} must be a JSON object of profile fields, got {type(overrides).__name__}")
    return overrides
