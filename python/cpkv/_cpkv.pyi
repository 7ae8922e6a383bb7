"""Type stubs for the Rust extension ``cpkv._cpkv``.

One argument rule for every call: an int (id, key, count, size) is an ``int``, a numpy integer or
any object with ``__index__``, in ``[0, 2**64)``; a sequence of ints is a 1-D numpy integer array
or an ordered iterable of such ints, read by iteration (``__len__`` is never trusted). Bools,
floats, str, bytes, mappings and sets are refused with ``ArgumentTypeError`` (also ``TypeError``),
values out of range with ``InvalidArgumentError`` (also ``ValueError``); a refused call changes
nothing. Every class is safe to share between threads (one lock, never waited on while holding
the GIL); a bug inside cpkv raises ``InternalError`` and leaves that object refusing every call.
"""

from typing import Iterable, Literal, Mapping, Sequence, SupportsIndex, final, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "__version__",
    "DEFAULT_POLICY",
    "MAX_PAGES",
    "MAX_PAGE_SIZE",
    "MAX_CP_SIZE",
    "PageAllocator",
    "Placement",
    "PlacementBatch",
    "PrefixTree",
    "MatchResult",
    "InsertResult",
    "DeviceVictim",
    "HostVictim",
    "TreeEvent",
    "TierCache",
    "Lookup",
    "LoadRun",
    "Backup",
    "InsertOutcome",
    "OwnedRows",
    "owned_rows",
    "OffloadIndex",
    "SglangIndex",
    "SglangPool",
    "L3Staging",
    "RowSources",
    "copy_rows",
    "row_runs",
    "streaming_threshold",
    "L3Index",
    "l3_seal",
    "l3_check",
    "l3_check_into",
    "l3_seal_records",
    "l3_seal_tails",
    "l3_check_split",
    "l3_seal_packed",
    "l3_check_packed",
    "l3_record_bytes",
    "l3_namespace_id",
    "l3_log_header",
    "l3_log_entries",
    "L3_RECORD_ALIGN",
    "L3_HEADER_BYTES",
    "L3_RECORD_KEY_AT",
    "L3_RECORD_MAGIC",
    "L3_LOG_HEADER_BYTES",
    "L3_LOG_ENTRY_BYTES",
    "L3_MAX_SLOTS",
    "L3_MAX_PAYLOAD_BYTES",
]

__version__: str
DEFAULT_POLICY: str
"""The one eviction policy every part of cpkv starts with (README: "Default policy")."""
MAX_PAGES: int
"""The most pages a tier may have (device or host), and the most a ``PageAllocator`` pool holds."""
MAX_PAGE_SIZE: int
"""The largest page size, in tokens."""
MAX_CP_SIZE: int
"""The most CP ranks one ``TierCache`` may be shared by."""

# ---- Shared host (L2) page allocator (crates/allocator) ----------------------

@final
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
    def __eq__(self, other: object, /) -> bool: ...

@final
class PlacementBatch:
    """``PageAllocator.reserve_batch``'s result: per item, in request order, a
    ``Placement`` or None (a miss). Holds the placements themselves, so later
    calls never change it; a ``Placement`` object is built only when read."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Placement | None:
        """Negative indices count from the end; IndexError past either end."""
    @property
    def keys(self) -> npt.NDArray[np.uint64]:
        """The requested keys, in request order."""
    @property
    def hits(self) -> npt.NDArray[np.bool_]:
        """Which items were placed (False: a capacity miss)."""
    def first_pages(self, payload: str) -> npt.NDArray[np.int64]:
        """Each item's first physical page in ``payload``; -1 for a miss or no pages there."""

@final
class PageAllocator:
    """Deterministic first-fit page allocator, one pool per payload; thread safe.

    Every call validates fully before it changes anything: a call that raises
    leaves state and digest exactly as they were. Keys are ints in [0, 2**64).
    """

    def __new__(cls, pools: Mapping[str, int]) -> PageAllocator:
        """``PageAllocator({"kv": 65536, "index": 65536})``: capacities in pages, in order."""
    def reserve(self, key: int, num_pages: int, payloads: Sequence[str] | None = None) -> Placement | None:
        """First-fit in each payload (default all); None on a capacity miss (nothing changes)."""
    def reserve_many(
        self, requests: Iterable[tuple[int, int]], payloads: Sequence[str] | None = None
    ) -> list[Placement | None]:
        """Each (key, num_pages) in order, all or nothing per item; an invalid item rejects the batch."""
    def reserve_batch(
        self,
        keys: npt.ArrayLike,
        num_pages: npt.ArrayLike,
        payloads: Sequence[str] | None = None,
    ) -> PlacementBatch:
        """The lean batched reserve: ``keys[i]`` gets ``num_pages[i]`` pages (1-D numpy integer
        arrays or sequences of ints, one length), with ``reserve_many``'s semantics."""
    def _noop(self, key: object, num_pages: object = None, payloads: object = None) -> None: ...
    def release(self, key: int) -> None: ...
    def release_many(self, keys: Iterable[int] | npt.NDArray[np.integer]) -> None:
        """All keys or none (unknown or repeated key: nothing is released)."""
    def mark_committed(self, key: int) -> None:
        """Idempotent; UnknownKeyError if ``key`` is not live."""
    def split(self, key: int, at: int, left_key: int, right_key: int) -> None:
        """Committed ``key`` -> ``left_key`` [0, at) and ``right_key`` [at, len), same pages, both committed."""
    def placement(self, key: int) -> Placement: ...
    def is_committed(self, key: int) -> bool: ...
    def __contains__(self, key: object, /) -> bool: ...
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
        """Order-independent 64-bit digest of the whole state, maintained incrementally (O(1)).

        An int in [0, 2**64); to compare ranks with an int64 MIN/MAX all-reduce,
        map it with ``d - (1 << 64) if d >= 1 << 63 else d``."""
    def canonical_digest(self) -> bytes:
        """SHA-256 (32 bytes) of the canonical sorted serialisation, for audits."""
    def snapshot(self) -> bytes:
        """Versioned binary snapshot (state and counters)."""
    @staticmethod
    def restore(data: bytes) -> PageAllocator:
        """Inverse of ``snapshot``; SnapshotError on truncated or corrupted bytes."""
    def verify(self) -> None:
        """Audit: recomputes every invariant and the digest from scratch; CpkvError if broken."""

# ---- Replicated prefix tree and eviction (crates/evict) ----------------------

_IntVector = Iterable[SupportsIndex] | npt.NDArray[np.integer]  # never str, bytes, a mapping or a set
_Namespace = int | str | None

@final
class MatchResult:
    """What ``PrefixTree.match`` found."""

    @property
    def length(self) -> int: ...  # tokens matched on device
    @property
    def device_pages(self) -> npt.NDArray[np.int64]: ...
    @property
    def host_length(self) -> int: ...  # tokens matched counting host-only nodes
    @property
    def node(self) -> int: ...  # deepest device-matched node (the namespace root if none)
    @property
    def host_node(self) -> int: ...  # deepest matched node, host-only included

@final
class InsertResult:
    @property
    def node(self) -> int: ...
    @property
    def cached(self) -> int: ...  # leading pages already on device: free your copies

@final
class DeviceVictim:
    @property
    def node(self) -> int: ...
    @property
    def pages(self) -> npt.NDArray[np.int64]: ...

@final
class HostVictim:
    @property
    def node(self) -> int: ...
    @property
    def object_key(self) -> int: ...
    @property
    def num_pages(self) -> int: ...
    @property
    def released(self) -> bool: ...  # no other node shares the object: release it

@final
class TreeEvent:
    @property
    def kind(self) -> str: ...  # "stored" | "removed"
    @property
    def tier(self) -> str: ...  # "device" | "host"
    @property
    def node(self) -> int: ...
    @property
    def start(self) -> int: ...  # first page, counted from the namespace root
    @property
    def num_pages(self) -> int: ...
    @property
    def pages(self) -> npt.NDArray[np.int64]: ...  # device page ids (empty for host events)
    @property
    def object_key(self) -> int | None: ...

@final
class PrefixTree:
    """Replicated page-granular prefix tree; every call is one event of the logical clock."""

    POLICIES: tuple[str, ...]
    # event_limit: residency events kept for take_events; None: 0, none are built.
    def __new__(cls, page_size: int, policy: str = ..., event_limit: int | None = None) -> PrefixTree: ...
    def match(self, tokens: _IntVector, namespace: _Namespace = None) -> MatchResult: ...
    def insert(self, tokens: _IntVector, pages: _IntVector, namespace: _Namespace = None) -> InsertResult: ...
    def lock(self, node: int) -> None: ...
    def unlock(self, node: int) -> None: ...
    def evict(self, num_pages: int) -> list[DeviceVictim]: ...
    def evict_pages(self, num_pages: int) -> npt.NDArray[np.int64]: ...  # evict's pages, flat
    def evict_host(self, num_pages: int) -> list[HostVictim]: ...
    def set_host(self, node: int, object_key: int) -> None: ...
    def attach_device(self, node: int, pages: _IntVector) -> None: ...
    def digest(self) -> int: ...
    def canonical_digest(self) -> bytes: ...
    def snapshot(self) -> bytes: ...
    @staticmethod
    def restore(data: bytes | bytearray, event_limit: int | None = None) -> PrefixTree: ...
    @staticmethod
    def _ghost_sampled(page_size: int, rate_shift: int, floor: int) -> PrefixTree: ...
    def take_events(self) -> list[TreeEvent]: ...
    def check_invariants(self) -> None: ...
    def eviction_order(self) -> list[int]: ...
    def __len__(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def policy(self) -> str: ...
    @property
    def clock(self) -> int: ...
    @property
    def device_pages(self) -> int: ...
    @property
    def host_pages(self) -> int: ...
    @property
    def evictable_device(self) -> int: ...
    @property
    def evictable_host(self) -> int: ...
    @property
    def node_slots(self) -> int: ...
    @property
    def namespaces(self) -> int: ...
    @property
    def event_limit(self) -> int: ...
    @property
    def dropped_events(self) -> int: ...
    def policy_memory(self) -> dict[str, int]: ...
    @property
    def following(self) -> str | None: ...  # ghost: priority, recency, segmented, arc or s3fifo

# ---- The two-tier cache's decisions (crates/tier) ------------------------------

@final
class Lookup:
    """What `TierCache.lookup` found; `node` is locked when `locked`."""

    @property
    def device_tokens(self) -> int: ...
    @property
    def host_tokens(self) -> int: ...
    @property
    def device_pages(self) -> npt.NDArray[np.int64]: ...
    @property
    def device_node(self) -> int: ...
    @property
    def node(self) -> int: ...
    @property
    def locked(self) -> bool: ...

@final
class LoadRun:
    """One host-only node of a load plan: slab row `host_pages[i]` -> device page `device_pages[i]`."""

    @property
    def node(self) -> int: ...
    @property
    def device_pages(self) -> npt.NDArray[np.int64]: ...
    @property
    def host_pages(self) -> npt.NDArray[np.int64]: ...

@final
class Backup:
    """A write-through backup in flight: device page `device_pages[i]` -> slab row `host_pages[i]`."""

    @property
    def ticket(self) -> int: ...
    @property
    def node(self) -> int: ...
    @property
    def device_pages(self) -> npt.NDArray[np.int64]: ...
    @property
    def host_pages(self) -> npt.NDArray[np.int64]: ...

@final
class InsertOutcome:
    """What `TierCache.insert` did."""

    @property
    def node(self) -> int: ...
    @property
    def cached_pages(self) -> int: ...
    @property
    def freed_pages(self) -> npt.NDArray[np.int64]: ...
    @property
    def backups(self) -> list[Backup]: ...
    @property
    def skipped_pages(self) -> int: ...

@final
class TierCache:
    """The two-tier cache's decisions (pure, replicated): the device tier on top of the host tier's
    core (the Rust ``HostIndex`` that ``OffloadIndex`` runs on too: tree, row stack, pins) plus the
    device pool, one digest.

    Thread safe. Sizes are checked against ``MAX_PAGES``, ``MAX_PAGE_SIZE`` and ``MAX_CP_SIZE``
    before anything is built; the device pool stores only the pages in use."""

    def __new__(
        cls,
        *,
        page_size: int,
        cp_size: int,
        device_pages: int,
        host_pages: int,
        policy: str = ...,
        host_free_target: int | None = None,
    ) -> TierCache: ...
    def lookup(self, tokens: _IntVector, namespace: _Namespace = None) -> Lookup: ...
    def unlock(self, node: int) -> None: ...
    def allocate(self, n: int) -> npt.NDArray[np.int64] | None: ...
    def free(self, pages: _IntVector) -> None: ...
    def evict_device(self, num_pages: int) -> int: ...
    def evict_host(self, num_pages: int) -> int: ...
    def plan_load(self, node: int) -> list[LoadRun]: ...
    def insert(self, tokens: _IntVector, pages: _IntVector, namespace: _Namespace = None) -> InsertOutcome: ...
    def commit(self, frontier: int) -> tuple[list[int], list[int]]: ...
    def enable_spills(self) -> None:
        """Host eviction then queues the pages it releases for :meth:`take_spills` (for an L3 below
        the slab). Changes no decision and nothing in the digest."""
    def take_spills(self) -> list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]]:
        """``(content keys, slab rows)`` of each host object host eviction released since the last
        call, oldest first. Copy the rows out before this rank's next ``end_forward``: the rows are
        free again and are written after the next commit point."""
    def page_keys(self, tokens: _IntVector, namespace: _Namespace = None) -> npt.NDArray[np.uint64]:
        """The content key of every whole page of ``tokens``, chained over the path and the namespace:
        a pure function of the tokens (a restarted run computes the same keys)."""
    def abort_pending(self) -> list[int]: ...
    def host_rows(self, node: int) -> npt.NDArray[np.int64]: ...
    def pending_tickets(self) -> list[int]: ...
    def digest(self) -> int: ...
    def digest_from_scratch(self) -> int: ...
    def check_invariants(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    @property
    def clock(self) -> int: ...
    @property
    def issued(self) -> int: ...
    @property
    def committed_through(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def cp_size(self) -> int: ...
    @property
    def device_pages(self) -> int: ...
    @property
    def host_pages(self) -> int: ...
    @property
    def policy(self) -> str: ...

@final
class OwnedRows:
    """One rank's share of a batch of pages (``owned_rows``)."""

    @property
    def mask(self) -> npt.NDArray[np.bool_]:
        """Per page, in batch order: whether this rank owns it."""
    @property
    def pool_rows(self) -> npt.NDArray[np.int64]:
        """The owned pages' rows in this rank's pool (``page // cp_size``), in batch order."""
    @property
    def slab_rows(self) -> npt.NDArray[np.int64]:
        """The slab row of each owned page, paired with ``pool_rows``."""
    @property
    def runs(self) -> npt.NDArray[np.int64]:
        """The load-back's run table for ``copy_rows`` (``pool[pool_rows[i]] = slab[slab_rows[i]]``,
        source 0), int64 ``[R, 6]``; a backup's is the same with the two sides' columns swapped."""

def owned_rows(rank: int, cp_size: int, pages: _IntVector, slab_rows: _IntVector) -> OwnedRows:
    """The rows ``rank`` of ``cp_size`` copies for logical device ``pages`` (page ``p`` is rank
    ``p % cp_size``'s row ``p // cp_size``) whose host copies are ``slab_rows``, one per page.
    ``InvalidArgumentError`` naming the value for a rank outside ``[0, cp_size)``, a ``cp_size``
    outside ``[1, MAX_CP_SIZE]``, lengths that differ, a page or row beyond ``MAX_PAGES``."""

# ---- Native row copies (crates/copy) ----------------------------------------

@final
class RowSources:
    """A fixed table of source buffers (numpy arrays or CPU torch tensors), checked once."""

    def __new__(cls, buffers: Sequence[object]) -> RowSources: ...
    def __len__(self) -> int: ...
    @property
    def rows(self) -> list[int]: ...

def copy_rows(
    out: object,
    sources: RowSources | Sequence[object],
    runs: npt.NDArray[np.int64],
    stores: Literal["cached", "streaming"] | None = None,
) -> None:
    """``out[dst + k*dst_stride] = sources[source][src + k*src_stride]`` per run; GIL released.

    ``stores=None`` streams past the cache from ``streaming_threshold()`` bytes up."""

def streaming_threshold() -> int:
    """Bytes (3/4 of the last-level cache) from which ``copy_rows`` uses streaming stores."""

def row_runs(
    dst_rows: npt.NDArray[np.int64], src_rows: npt.NDArray[np.int64], source: int | None = None
) -> npt.NDArray[np.int64]:
    """The run table moving ``src_rows[i]`` to ``dst_rows[i]`` of source ``source`` (None: 0),
    constant-step stretches merged."""


# ---- An engine's host tier of offloaded blocks (crates/tier, offload) --------

@final
class OffloadIndex:
    """An engine's host tier (vLLM's scheduler-side manager; SGLang's HiCache storage runs the same
    core as :class:`SglangIndex`), one call per engine call into the host tier's core (the Rust
    ``HostIndex`` that ``TierCache`` runs on too): keys are the engine's ``bytes``
    (the last four bytes name the KV cache group), chained into a prefix tree by their end
    positions in the request, placed in rows, pinned as tree locks, evicted leaf-first in the
    policy's order; a victim loses only the rows a call needs, cut from its tail, under every
    policy. Keys of the wrong type raise ``ArgumentTypeError``: so do numpy ``S``/``U`` arrays
    and their ``bytes_``/``str_`` items (they drop trailing NUL bytes), and, for every call but the
    completions, a set, mapping or mapping view of keys (their order differs between processes;
    ``complete_load``/``complete_store`` take any collection, their effect does not depend on
    order). A key shorter than the four bytes that name its group raises ``InvalidArgumentError``
    in every call, as does a ``prepare_load`` of a key that is not readable; a refused call
    changes nothing."""

    MAX_ROWS: int  # the most rows (``capacity``) an index takes: rows are int32

    def __new__(cls, capacity: int, policy: str, tokens_per_chunk: _IntVector,
                results: tuple[object, object, object] | None = None) -> OffloadIndex:
        """``results``: what ``lookup`` answers (miss, readable, in flight), a tuple of three; by
        default (``None``) ``False``, ``True``, ``None``."""
    def lookup(self, key: bytes, req_context: object = None) -> object:
        """``results[0]`` (miss or failed store), ``[1]`` (readable) or ``[2]`` (store in flight)."""
    def prepare_load(self, keys: Iterable[bytes], request: str,
                     positions: Mapping[bytes, int] | None = None) -> npt.NDArray[np.int32]: ...
    def complete_load(self, keys: Iterable[bytes], request: str) -> None: ...
    def touch(self, keys: Iterable[bytes], request: str, positions: Mapping[bytes, int] | None = None) -> None: ...
    def prepare_store(self, keys: Iterable[bytes], request: str, positions: Mapping[bytes, int] | None = None
                      ) -> tuple[list[bytes], npt.NDArray[np.int32], list[bytes], npt.NDArray[np.int32]] | None:
        """``None`` when the offered keys do not all fit (after evicting what may go; nothing
        changed), else (keys to store: the offered objects, their rows, keys evicted to make room
        in eviction order, the row each evicted key held). An evicted key's bytes are still in its
        row on return, and the row may be one of the plan's own: a lower tier copies it out before
        the plan's stores are written."""
    def prepare_store_fitting(self, keys: Iterable[bytes], request: str, positions: Mapping[bytes, int] | None = None
                              ) -> tuple[list[bytes], npt.NDArray[np.int32], list[bytes], npt.NDArray[np.int32]] | None:
        """``prepare_store``, placing the new keys that fit from the head of the offer (what
        ``store`` does); ``None`` when none fits."""
    @overload
    def complete_store(self, keys: Iterable[bytes], success: bool, report: Literal[True]) -> list[bytes]: ...
    @overload
    def complete_store(self, keys: Iterable[bytes], success: bool = True, report: bool = False) -> list[bytes] | None:
        """``success`` and ``report`` are ``bool`` (numpy's too), never an int or ``None``; with ``report``
        the keys whose store this call completed: readable now, or (failed) removed, their rows free
        unless chunks placed since continue them."""
    def request_finished(self, request: str) -> None: ...
    def evict(self, num: int) -> list[bytes]: ...
    def reset(self) -> None: ...
    def digest(self) -> int: ...
    def resident_keys(self) -> list[bytes]: ...
    def pinned_keys(self) -> list[bytes]: ...
    def row_of(self, key: bytes) -> int: ...
    def parent_of(self, key: bytes) -> bytes | None: ...
    def is_storing(self, key: bytes) -> bool: ...
    @property
    def num_pins(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def policy(self) -> str: ...
    def __len__(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def check(self) -> None: ...

# ---- The durable third tier's decisions (crates/tier/src/l3) ---------------

L3_RECORD_ALIGN: int
L3_HEADER_BYTES: int
L3_RECORD_KEY_AT: int  # byte offset of the key in a record's header
L3_RECORD_MAGIC: int  # a record header's first 8 bytes, little-endian
L3_LOG_HEADER_BYTES: int
L3_LOG_ENTRY_BYTES: int
L3_MAX_SLOTS: int
L3_MAX_PAYLOAD_BYTES: int

def l3_seal(record: npt.NDArray[np.uint8], namespace: int, key: int, sequence: int, length: int) -> None:
    """Seals the record in ``record`` (at least ``l3_record_bytes(length)`` bytes) whose payload is already
    at ``record[:length]``: zeroes its padding and writes its header (CRC32C included), the record's last
    ``L3_HEADER_BYTES`` bytes."""

def l3_check(record: npt.NDArray[np.uint8], namespace: int, key: int, sequence: int, length: int) -> str | None:
    """``None`` when ``record`` is exactly the expected record, else the first mismatch's name:
    ``truncated``, ``bad_magic``, ``version``, ``reserved``, ``foreign_namespace``, ``wrong_key``,
    ``stale_sequence``, ``length`` or ``checksum``."""

def l3_check_into(records: npt.NDArray[np.uint8], slot_bytes: int, namespace: int, keys: _IntVector,
                  sequences: _IntVector, length: int, out: npt.NDArray[np.uint8], rows: _IntVector) -> list[str | None]:
    """Checks the records read back to back into ``records`` (``slot_bytes`` each, the last ones possibly
    short) against ``keys[j]``/``sequences[j]``, copying each good payload into row ``rows[j]`` of ``out``
    (rows of ``length`` bytes); per record ``None`` when served, else the reason's name."""

def l3_seal_records(records: npt.NDArray[np.uint8], payloads: Sequence[npt.NDArray[np.uint8]], namespace: int,
                    keys: _IntVector, sequences: _IntVector, length: int) -> None:
    """Builds whole records back to back in ``records`` (``l3_record_bytes(length)`` bytes each): payload
    ``j`` copied to record ``j``'s start, then sealed for ``keys[j]``, ``sequences[j]``; one call per batch."""

def l3_seal_tails(tails: npt.NDArray[np.uint8], payloads: Sequence[npt.NDArray[np.uint8]], namespace: int,
                  keys: _IntVector, sequences: _IntVector, length: int) -> None:
    """Seals, back to back in ``tails``, the tails (padding then header, ``l3_record_bytes(length) - length``
    bytes each) of records whose payloads ``payloads[j]`` are written from their own memory."""

def l3_check_split(tails: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8], rows: _IntVector, whole: Sequence[bool],
                   namespace: int, keys: _IntVector, sequences: _IntVector, length: int) -> list[str | None]:
    """Checks records read split, payload ``j`` straight into row ``rows[j]`` of ``out`` (rows of ``length``
    bytes) and its tail into ``tails``; ``whole[j]`` False is ``truncated``. Per record ``None`` when the row
    holds the record's payload, else the reason's name."""

def l3_seal_packed(records: npt.NDArray[np.uint8], namespace: int, keys: _IntVector, sequences: _IntVector,
                   length: int) -> None:
    """Seals packed records in place (``length + L3_HEADER_BYTES`` bytes each, back to back: an L3 record
    without its zero padding): record ``j``'s payload is at its start, its trailer is written after it."""

def l3_check_packed(records: npt.NDArray[np.uint8], namespace: int, keys: _IntVector, sequences: _IntVector,
                    length: int) -> list[str | None]:
    """Checks packed records (``length + L3_HEADER_BYTES`` bytes each, back to back) against ``keys[j]``,
    ``sequences[j]``: per record ``None`` when its payload is the record's, else the first mismatch's name."""

def l3_record_bytes(payload: int) -> int:
    """Bytes a record of ``payload`` bytes takes on disk (whole 4 KiB blocks)."""

def l3_namespace_id(*, model: str, dtype: str, kv_layout: str, page_size: int, cp_size: int, tp_size: int,
                    page_bytes: int) -> int:
    """The namespace's id; a record of another id is never served."""

def l3_log_header(namespace: int, slot_bytes: int, slots: int) -> bytes: ...
def l3_log_entries(entries: Sequence[tuple[int, int, int, int]]) -> bytes:
    """32-byte checksummed log entries for ``(key, sequence, slot, length)``."""

@final
class L3Index:
    """The L3 index: key -> (slot, sequence), lowest free slot first, least recently used evicted
    under the slot cap, a writer rank per key; equal on every rank that makes the same calls."""

    def __new__(cls, slots: int, ranks_on_node: int | None = None) -> L3Index: ...
    @staticmethod
    def recover(slots: int, ranks_on_node: int, logs: Sequence[bytes], namespace: int,
                slot_bytes: int) -> tuple[L3Index, dict[str, int], list[int]]:
        """The index rebuilt from every rank's log without page data; a report; per log the length of
        its valid prefix (0: missing, corrupt or of another namespace or shape)."""
    def place(self, keys: _IntVector) -> list[tuple[int, int, int, int | None, int]]:
        """New pages of a batch as ``(key, slot, sequence, evicted, writer)``; present keys count as a
        use. ``DuplicateKeyError`` for a repeated key, ``InvalidArgumentError`` for more new pages
        than slots; a refused batch changes nothing."""
    def lookup(self, key: int) -> tuple[int, int] | None: ...
    def peek(self, key: int) -> tuple[int, int] | None: ...
    def drop(self, key: int) -> bytes | None:
        """Forgets ``key``; returns the tombstone log entry to append (``None``: absent)."""
    def writer(self, key: int) -> int: ...
    def entries(self) -> list[tuple[int, int, int]]: ...
    def digest(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def check_invariants(self) -> None: ...
    def __len__(self) -> int: ...


@final
class SglangPool:
    """One SGLang host pool and its slab region (the SGLang backend's ``PoolSlab`` builds it). A page's
    entries lie in ``host_buffers`` at ``offset + (first // divisor) * stride`` per row of ``entries``
    (int64 ``[E, 5]``: buffer, offset, stride, divisor, bytes), ``first`` the page's first host index;
    or, with ``entries`` None, where ``meta`` (the pool's ``get_page_buffer_meta``) says, once per
    batch, each entry ``entry_sizes[j]`` bytes. ``data``: the slab's uint8 ``[rows, page_bytes]``;
    ``stamps``, ``tags``: its int64 per row (shared memory, accessed atomically). Every entry of every
    page is checked to lie inside its buffer before anything moves (``InvalidArgumentError`` naming
    the page and its host index), and each copy's run table is checked against both buffers before it
    copies (the protocol is ``crates/slab``'s, the copies ``crates/copy``'s)."""

    def __new__(cls, name: str, host_buffers: list[object], entries: npt.NDArray[np.int64] | None,
                meta: object | None, entry_sizes: Sequence[int], page_size: int, pool_tokens: int,
                data: object, stamps: object, tags: object) -> SglangPool: ...
    def check(self, host_indices: object, pages: int) -> None:
        """What every batch call checks first: ``pages * page_size`` integer indices, each page's first
        in ``[0, pool_tokens)``, every entry inside its buffer."""
    def addresses(self, host_indices: object, pages: int) -> npt.NDArray[np.int64]:
        """int64 ``[pages, entries]``: each entry's host address, as the checks compute them."""
    def fill_host(self, host_indices: object, pages: int, positions: list[int],
                  data: npt.NDArray[np.uint8]) -> None:
        """Writes ``data[j]`` (a page laid out as a slab row, an L3 record's payload) into host page
        ``positions[j]`` of a call of ``pages`` pages at ``host_indices``, checked first like every
        batch call's host range."""
    def read_page(self, row: int, handle: int, tag: int, out: object) -> Literal["missing", "torn", "served"]:
        """The tensor ``get``: slab ``row`` into ``out`` (a CPU contiguous uint8 tensor of ``page_bytes``,
        the entries in order) while the row holds ``handle`` and ``tag``, checked before and after the
        copy (a fence between): ``missing`` (nothing copied), ``torn`` (changed under the copy) or ``served``."""
    def write_values(self, rows: Sequence[int], handles: Sequence[int], tags: Sequence[int],
                     values: Sequence[object]) -> int:
        """The tensor ``batch_set``'s rows of this rank: ``values[i]`` (CPU contiguous uint8 tensors of
        ``page_bytes``) into ``rows[i]`` by the seqlock's sequence (rows invalid, a fence, the copies, a
        fence, rows published; the write hook after the invalidation); rows holding their page already
        are skipped. Returns how many rows were written."""
    def set_write_hook(self, hook: object | None) -> None:
        """A callable run after a write marked its rows invalid, before it copies (fault-injection tests)."""
    def close(self) -> None:
        """Waits for copies in flight; every later call raises ``InvalidArgumentError``."""
    @property
    def page_bytes(self) -> int: ...
    @property
    def entry_sizes(self) -> list[int]: ...
    @property
    def mode(self) -> Literal["layout", "meta"]: ...


@final
class L3Staging:
    """The node-shared L3 read-staging area (``cpkv.tier.l3.staging`` builds it over a ``HostSlab``):
    ``data`` uint8 ``[entries, L3_HEADER_BYTES + page_bytes]`` (one record each), ``words`` int64
    ``[entries, 2]`` (a state word naming (sequence, version, state), a failure's reason); record
    (slot, sequence) lives in entry ``slot % entries``. Every transition is a compare-and-swap on the
    state word; a copy out of an entry is re-checked against the word after it and checked as a disk
    read (CRC32C); every copy is bounds-checked where it copies, without the GIL."""

    SERVED: int
    FAILED: int
    CLAIMED: int
    WAIT: int
    BUSY: int
    REUSED: int
    TORN: int
    BYPASS: int
    MAX_ENTRIES: int
    MAX_SEQUENCE: int

    def __new__(cls, data: object, words: object, page_bytes: int, namespace: int) -> L3Staging: ...
    def take(self, keys: Sequence[int], slots: Sequence[int], sequences: Sequence[int],
             out: npt.NDArray[np.uint8]) -> tuple[list[int], list[int], list[str | None]]:
        """Per record: its outcome (the constants above), the state word seen or claimed, a failure's
        reason; a ``SERVED`` page is in ``out[i]`` (uint8 ``[n, page_bytes]``). Never waits."""
    def wait(self, keys: Sequence[int], slots: Sequence[int], sequences: Sequence[int], words: Sequence[int],
             out: npt.NDArray[np.uint8], timeout_s: float,
             ) -> tuple[list[int], list[int], list[str | None], list[bool]]:
        """Waits for the ``WAIT`` records of ``take`` (``words``: the words it saw) until their word moves,
        then decides as ``take``; a word unchanged for ``timeout_s`` is taken over (``CLAIMED``; the last
        list says which)."""
    def publish(self, slots: Sequence[int], claims: Sequence[int], records: npt.NDArray[np.uint8],
                offsets: Sequence[int], reasons: Sequence[str | None]) -> list[bool]:
        """Publishes this rank's claims: a good record (``reasons[i]`` None) copied from ``records`` at
        ``offsets[i]`` and marked ready, a failed one marked failed with its reason. Per record whether
        it was published (False: taken over meanwhile)."""
    def abandon(self, slots: Sequence[int], claims: Sequence[int]) -> None:
        """Gives claims up (their entries back to empty), so no rank waits for them."""
    def entry_state(self, slot: int) -> tuple[int, int, int]:
        """(sequence, version, state) of the entry of ``slot``: 0 empty, 1 reading, 2 ready, 3 failed."""
    def set_copy_hook(self, hook: object | None) -> None:
        """A callable run between a copy out of an entry and its re-check (tests); the calls then hold
        the GIL."""
    def close(self) -> None:
        """Waits for calls in flight; every later call raises ``InvalidArgumentError``."""
    @property
    def entries(self) -> int: ...
    @property
    def entry_bytes(self) -> int: ...


@final
class SglangIndex:
    """The SGLang backend's replicated index (an ``OffloadIndex`` core, one token per chunk) and its
    batch calls, each one native call: checks, index work, key tags, stamps and copies (the GIL
    released around them). A ``str`` key is its UTF-8 bytes then group 0's four bytes. A serial
    (handle, from 1) is never reused, not even after ``reset``."""

    MAX_ROWS: int

    def __new__(cls, rows: int, policy: str) -> SglangIndex: ...
    def store(self, keys: Iterable[str | bytes], prefix: str | bytes | None = None) -> npt.NDArray[np.int64]:
        """One store call, no bytes (SGLang's ``batch_set``): exactly the engine calls ``prepare_load``
        of a readable ``prefix``, ``prepare_store_fitting``, ``complete_store``, ``complete_load``,
        ``request_finished`` of one request whose keys continue ``prefix`` and each other, on an
        ``OffloadIndex``. int64 ``[n, 2]``: each key's (row, handle), (-1, 0) where refused."""
    def store_pages(self, keys: Iterable[str | bytes], prefix: str | bytes | None, pool: SglangPool,
                    host_indices: object, node_size: int, local_rank: int, spill: list[SglangPool] | None = None,
                    ) -> tuple[list[bool], int,
                               tuple[list[bytes], list[int], list[bool], list[npt.NDArray[np.uint8]]] | None]:
        """Checks every page's host range (a refused call changes nothing), stores the keys, then copies
        each placed page whose row this rank writes (``row % node_size == local_rank``) and that is not
        there yet: stamp ``-handle``, bytes, tag, stamp ``handle``. (placed per key, pages written,
        spilled): with ``spill`` (every pool sharing this index, each once), before any byte is
        written, every key the store evicted (in eviction order), its row, whether this rank copied its
        page out of every pool (its rows, still carrying the key's page before and after the copy) and
        per pool, in ``spill``'s order, uint8 ``[evicted, page_bytes]`` holding those pages; else None."""
    def spill_resident(self, pools: list[SglangPool], node_size: int, local_rank: int,
                       ) -> tuple[list[bytes], list[int], list[bool], list[npt.NDArray[np.uint8]]]:
        """Every readable key's page as ``store_pages``' spill out of ``pools`` (in placement order; this
        rank copies the pages of its rows): a clean stop that leaves the slab in L3. Changes nothing."""
    def read_pages(self, keys: Iterable[str | bytes], pool: SglangPool,
                   host_indices: object) -> tuple[list[bool], int, int]:
        """Checks every page's host range, then copies each key's page whose row carries the key's handle
        and tag, checked again after the copy. (read per key, pages read, pages whose row changed under
        the copy)."""
    def held(self, keys: Iterable[str | bytes], pool: SglangPool) -> list[bool]: ...
    def present(self, keys: Iterable[str | bytes], pool: SglangPool) -> int:
        """The leading run of keys whose page is in the pool's slab now."""
    def locate(self, keys: Iterable[str | bytes]) -> npt.NDArray[np.int64]:
        """int64 ``[m, 3]``: (index into ``keys``, row, handle) of each readable key; changes nothing."""
    def readable(self) -> npt.NDArray[np.int64]:
        """int64 ``[m, 2]``: (row, handle) of every readable key, in the order they were placed."""
    @staticmethod
    def key_tags(keys: Iterable[str | bytes]) -> npt.NDArray[np.int64]: ...
    def reset(self) -> None: ...
    def digest(self) -> int: ...
    def check(self) -> None: ...
    def __len__(self) -> int: ...
    @property
    def stores(self) -> int: ...
    @property
    def policy(self) -> str: ...
    def stats(self) -> dict[str, int]: ...
