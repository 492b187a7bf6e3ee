"""Facts: what torch's dtypes are made of and what accelerators promise (their datasheets, each
number with its source). No formulas and no measurement live here; every other layer reads them."""
