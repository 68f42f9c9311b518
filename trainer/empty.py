"""Memory for a load that overwrites it whole: torch.empty* without deterministic mode's fill.

With `torch.use_deterministic_algorithms(True)` (baton's `deterministic: true`), torch fills every
uninitialised float tensor with NaN (`torch.utils.deterministic.fill_uninitialized_memory`), i.e. writes
every byte of it. A restart allocates three such copies of the state (the model built empty, the load's
staging copy, AdamW's state), each overwritten by the checkpoint: 1.6 s of a 125 M restart's staging copy
here was that fill.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def unfilled() -> Iterator[None]:
    """Inside: torch.empty* leaves the memory as it is (not thread-local: hold it only where nothing else
    allocates tensors that must be filled)."""
    before = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = before
