"""resacct — resource accounting for PyTorch training, verified.

Can this run? How much memory? How many FLOPs? How long? Where is the bottleneck?
Every answer here is backed by a claim in ``resacct/specs/`` that is checked against PyTorch.

Import the area you need (``resacct.dtypes``, ``resacct.tensors`` …); this package imports
nothing heavy by itself.
"""

from resacct.errors import ResacctError

__all__ = ["ResacctError", "__version__"]
__version__ = "0.1.0"
