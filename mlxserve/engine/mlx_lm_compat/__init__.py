"""Everything that reaches into mlx-lm's `BatchGenerator` internals, in one place.

mlx-lm is pinned to 0.32.x; `contract.py` names every internal this package relies on, and
`check_contract()` (run by a test and at engine start) fails loudly, naming the attribute, when
an upgrade moves one.
"""

from .contract import MlxLmContractError, check_contract
from .generator import MAX_BATCH, ServerBatchGenerator

__all__ = ["MAX_BATCH", "MlxLmContractError", "ServerBatchGenerator", "check_contract"]
