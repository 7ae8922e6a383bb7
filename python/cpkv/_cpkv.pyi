"""Type stubs for the Rust extension ``cpkv._cpkv``."""

__version__: str

# --- Shared host (L2) page allocator (crates/allocator, crates/cpkv-py/src/allocator.rs) ---

from typing import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

class Placement:
    """Where one object's pages live: per payload, extents in object-position order."""

    @property
    def key(self) -> int: ...
    @property
    def num_pages(self) -> int: ...
    @property
    def payloads(self) -> list[str]:
        """The payloads the object has pages in, in construction order."""
    def extents(self, payload: str) -> list[tuple[int, int]]:
        """``[(start, length), ...]`` in position order; UnknownPayloadError if absent."""
    def pages(self, payload: str) -> npt.NDArray[np.int64]:
        """Object position -> physical page."""
    def __eq__(self, other: object) -> bool: ...

class PageAllocator:
    """Deterministic first-fit page allocator, one pool per payload; thread safe.

    Every call validates fully before it changes anything: a call that raises
    leaves state and digest exactly as they were. Keys are ints in [0, 2**64).
    """

    def __init__(self, pools: Mapping[str, int]) -> None:
        """``PageAllocator({"kv": 65536, "index": 65536})``: capacities in pages, in order."""
    def reserve(self, key: int, num_pages: int, payloads: Sequence[str] | None = None) -> Placement | None:
        """First-fit in each payload (default all); None on a capacity miss (nothing changes)."""
    def reserve_many(
        self, requests: Iterable[tuple[int, int]], payloads: Sequence[str] | None = None
    ) -> list[Placement | None]:
        """Each (key, num_pages) in order, all or nothing per item; an invalid item rejects the batch."""
    def release(self, key: int) -> None: ...
    def release_many(self, keys: Iterable[int]) -> None:
        """All keys or none (unknown or repeated key: nothing is released)."""
    def mark_committed(self, key: int) -> None:
        """Idempotent; UnknownKeyError if ``key`` is not live."""
    def split(self, key: int, at: int, left_key: int, right_key: int) -> None:
        """Committed ``key`` -> ``left_key`` [0, at) and ``right_key`` [at, len), same pages, both committed."""
    def placement(self, key: int) -> Placement: ...
    def is_committed(self, key: int) -> bool: ...
    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...
    def keys(self) -> list[int]:
        """Live keys, ascending."""
    @property
    def payloads(self) -> list[str]:
        """Payload names in construction order."""
    def capacity(self, payload: str) -> int: ...
    def free_pages(self, payload: str) -> int: ...
    def largest_free_extent(self, payload: str) -> int: ...
    def free_extents(self, payload: str) -> list[tuple[int, int]]:
        """Free ``(start, length)`` extents in address order (fully coalesced)."""
    def stats(self) -> dict[str, object]:
        """reserves, misses, releases, splits, commits, objects, and ``payloads``:
        {name: {capacity, used, free, free_extents, largest_free_extent}}."""
    def digest(self) -> int:
        """Order-independent 64-bit digest of the whole state, maintained incrementally (O(1))."""
    def canonical_digest(self) -> bytes:
        """SHA-256 (32 bytes) of the canonical sorted serialisation, for audits."""
    def snapshot(self) -> bytes:
        """Versioned binary snapshot (state and counters)."""
    @staticmethod
    def restore(data: bytes) -> PageAllocator:
        """Inverse of ``snapshot``; SnapshotError on truncated or corrupted bytes."""
    def verify(self) -> None:
        """Audit: recomputes every invariant and the digest from scratch; CpkvError if broken."""
