"""Page ownership under context parallelism.

Logical page ``p`` lives only on its owner rank ``p % cp_size``, at local row
``p // cp_size`` of that rank's pool. ``owner`` and ``local_row`` map every page
(the compose plan reads all of them) and return the kind they were given (numpy
in, numpy out; torch in, torch out); which pages one rank copies, and how, comes
from the Rust core (``owned_rows``), the one home of that rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cpkv._cpkv import OwnedRows, owned_rows
from cpkv.errors import InvalidArgumentError


def _as_pages(pages: Any) -> Any:
    """Validates page ids; keeps numpy arrays and torch tensors as they are."""
    if _is_torch_tensor(pages):
        if pages.dtype.is_floating_point or pages.dtype.is_complex or str(pages.dtype) == "torch.bool":
            raise InvalidArgumentError(f"page ids must be integers, got dtype {pages.dtype}")
        negative = pages.numel() > 0 and int(pages.min()) < 0
        arr = pages
    else:
        arr = pages if isinstance(pages, np.ndarray) else np.asarray(pages)
        if arr.dtype.kind not in "iu":
            raise InvalidArgumentError(f"page ids must be integers, got dtype {arr.dtype}")
        negative = arr.size > 0 and int(arr.min()) < 0
    if negative:
        raise InvalidArgumentError(f"page ids must be >= 0, got {int(arr.min())}")
    return arr


def _is_torch_tensor(value: Any) -> bool:
    # Classifies without importing torch (numpy-only callers never pay for it).
    return type(value).__module__.startswith("torch")


@dataclass(frozen=True)
class CpLayout:
    """Where each logical page lives, seen from ``rank`` of ``cp_size`` ranks."""

    cp_size: int
    rank: int
    page_size: int

    def __post_init__(self) -> None:
        if self.cp_size < 1:
            raise InvalidArgumentError(f"cp_size must be >= 1, got {self.cp_size}")
        if not 0 <= self.rank < self.cp_size:
            raise InvalidArgumentError(f"rank must be in [0, {self.cp_size}), got {self.rank}")
        if self.page_size < 1:
            raise InvalidArgumentError(f"page_size must be >= 1, got {self.page_size}")

    def owner(self, pages: Any) -> Any:
        """The rank holding each page."""
        return _as_pages(pages) % self.cp_size

    def local_row(self, pages: Any) -> Any:
        """Each page's row in its owner's pool."""
        return _as_pages(pages) // self.cp_size

    def owned_rows(self, pages: Any, slab_rows: Any) -> OwnedRows:
        """This rank's share of ``pages`` whose host copies are ``slab_rows`` (one per page): which
        it owns (``mask``), their pool and slab rows, and the run table that moves them."""
        return owned_rows(self.rank, self.cp_size, pages, slab_rows)
