"""ComposePlan: everything layer-invariant about one batch's compose, built once.

Sources are numbered through a table of ``2 * cp_size`` buffers: source
``s < cp`` is rank ``s``'s pool (a prefix page at its local row), source
``s >= cp`` is the staging buffer of writer ``s - cp``. Row 0 of every staging
buffer is a reserved, always-zero dummy; the writer's current page ``i`` sits at
staging row ``i + 1``. Dense slots no span covers read the dummy row of the
composing rank's own staging, so they are zero on every path.

The plan is a pure function of its arguments (no per-rank state), so every rank
builds the same one; per-rank views (`descriptors`, `copy_runs`) only differ in
which staging the unused slots read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from cpkv.compose.spans import SlotSpans, validate_requests
from cpkv.errors import InvalidArgumentError
from cpkv.kernels.gather import RUN_COLUMNS, index_groups
from cpkv.runtime.layout import CpLayout

_NONE = -1  # construction placeholder; debug mode proves none survives


@dataclass(frozen=True)
class PlanKey:
    """Everything that identifies a plan; two plans are interchangeable only if keys are equal."""

    cp_size: int
    page_size: int
    requests: tuple[SlotSpans, ...]
    num_slots: int
    device: str | None = None
    payload: str | None = None
    pool_rows: int | None = None


class ComposePlan:
    """Per dense slot, the (source, row) it reads; per writer, its staging layout."""

    def __init__(
        self,
        cp_size: int,
        page_size: int,
        requests: Sequence[SlotSpans],
        num_slots: int,
        *,
        device: str | None = None,
        payload: str | None = None,
        pool_rows: int | None = None,
    ) -> None:
        if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
            raise InvalidArgumentError(f"cp_size must be an integer >= 1, got {cp_size!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise InvalidArgumentError(f"page_size must be an integer >= 1, got {page_size!r}")
        requests = tuple(requests)
        validate_requests(requests, num_slots)
        self.key = PlanKey(cp_size, page_size, requests, int(num_slots), device, payload, pool_rows)
        self.cp_size = cp_size
        self.page_size = page_size
        self.layout = CpLayout(cp_size, 0, page_size)  # ownership is rank-independent
        self.num_slots = int(num_slots)
        self._build(requests)
        if pool_rows is not None:
            self.check_pool_rows(pool_rows)
        self._per_rank: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._index_groups: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        self.digest = plan_digest(self.key)

    @property
    def digest_hex(self) -> str:
        return f"{self.digest:016x}"

    @property
    def requests(self) -> tuple[SlotSpans, ...]:
        return self.key.requests

    def _build(self, requests: tuple[SlotSpans, ...]) -> None:
        cp = self.cp_size
        # One row per span: slot, page, count, is_current (request order, prefix first).
        table = np.array(
            [(*s, 0) for r in requests for s in r.prefix] + [(*s, 1) for r in requests for s in r.current],
            dtype=np.int64,
        ).reshape(-1, 4)
        counts = table[:, 2]
        span_of = np.repeat(np.arange(len(table)), counts)
        offset = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        slots = table[span_of, 0] + offset
        pages = table[span_of, 1] + offset
        is_current = table[span_of, 3].astype(bool)

        source = np.full(self.num_slots, _NONE, dtype=np.int64)
        row = np.full(self.num_slots, _NONE, dtype=np.int64)
        owner = self.layout.owner(pages)
        local_row = self.layout.local_row(pages)
        # Prefix pages: the owner's pool at the local row.
        source[slots[~is_current]] = owner[~is_current]
        row[slots[~is_current]] = local_row[~is_current]
        # Current pages, in batch order (requests, spans, pages); each writer keeps its own in that order.
        cur_pages, cur_slots, cur_writer = pages[is_current], slots[is_current], owner[is_current]
        order = np.argsort(cur_writer, kind="stable")
        per_writer = np.bincount(cur_writer, minlength=cp)
        firsts = np.cumsum(per_writer) - per_writer
        position = np.empty(len(cur_pages), dtype=np.int64)
        position[order] = np.arange(len(cur_pages)) - firsts[cur_writer[order]]
        source[cur_slots] = cp + cur_writer
        row[cur_slots] = position + 1
        self._source, self._row = source, row
        self._current_pages = np.split(cur_pages[order], np.cumsum(per_writer)[:-1])
        self._prefix_rows_needed = np.zeros(cp, dtype=np.int64)
        if (~is_current).any():
            np.maximum.at(self._prefix_rows_needed, owner[~is_current], local_row[~is_current] + 1)

        # Copy runs: a span's pages of one owner are every cp-th slot, reading consecutive rows.
        j = np.arange(cp)[None, :]
        valid = j < table[:, 2:3]
        dst = (table[:, 0:1] + j)[valid]
        count = ((table[:, 2:3] - j + cp - 1) // cp)[valid]
        run_src = source[dst]
        run_row = row[dst]
        span_runs = np.stack([dst, np.full_like(dst, cp), count, run_src, run_row, np.ones_like(dst)], axis=1)
        self._span_runs = span_runs[np.argsort(dst, kind="stable")].reshape(-1, RUN_COLUMNS)
        unused = source == _NONE
        edges = np.diff(np.concatenate([[0], unused.astype(np.int8), [0]]))
        starts, stops = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
        self._unused_ranges = np.stack([starts, stops - starts], axis=1).astype(np.int64).reshape(-1, 2)

    # -- the per-writer staging layout -------------------------------------------------

    def current_pages(self, rank: int) -> np.ndarray:
        """Logical pages ``rank`` writes this forward, in its staging order (row i + 1 holds entry i)."""
        return self._current_pages[self._check_rank(rank)].copy()

    def num_current(self, rank: int) -> int:
        return len(self._current_pages[self._check_rank(rank)])

    def staging_rows(self, rank: int) -> int:
        """Rows ``rank``'s staging needs: its current pages plus the dummy row 0."""
        return self.num_current(rank) + 1

    def staging_write_rows(self, rank: int) -> np.ndarray:
        """Staging row of each of ``rank``'s current rows (always 1..n: the writes are one slice)."""
        return np.arange(1, self.num_current(rank) + 1, dtype=np.int64)

    @property
    def max_staging_rows(self) -> int:
        return max(self.staging_rows(r) for r in range(self.cp_size))

    # -- what the gather reads ----------------------------------------------------------

    def descriptors(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Per dense slot of ``rank``'s buffer: (source table index, source row)."""
        source, row, _ = self._for_rank(rank)
        return source, row

    def copy_runs(self, rank: int) -> np.ndarray:
        """The descriptors as strided copy runs (see :mod:`cpkv.kernels.gather`)."""
        return self._for_rank(rank)[2]

    def index_groups(self, rank: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The descriptors grouped by source, for :func:`cpkv.kernels.gather.gather_indexed` (built once)."""
        groups = self._index_groups.get(rank)
        if groups is None:
            groups = self._index_groups[rank] = index_groups(*self.descriptors(rank))
        return groups

    def owned_runs(self, rank: int) -> np.ndarray:
        """Runs for the slots ``rank`` itself supplies (its prefix pages and current rows).

        Sources are renumbered for the all-reduce baseline: 0 = its pool, 1 = its
        current rows (staging row i + 1 is current row i).
        """
        runs = self._span_runs
        mine = runs[(runs[:, 3] == rank) | (runs[:, 3] == self.cp_size + rank)].copy()
        is_current = mine[:, 3] >= self.cp_size
        mine[:, 3] = is_current.astype(np.int64)
        mine[is_current, 4] -= 1
        return mine

    def prefix_rows_needed(self, rank: int) -> int:
        """Rows ``rank``'s pool must have for this batch (highest local row read + 1)."""
        return int(self._prefix_rows_needed[self._check_rank(rank)])

    def check_pool_rows(self, pool_rows: int) -> None:
        need = int(self._prefix_rows_needed.max(initial=0))
        if need > pool_rows:
            rank = int(np.argmax(self._prefix_rows_needed))
            raise InvalidArgumentError(
                f"the batch reads row {need - 1} of rank {rank}'s pool, which has {pool_rows} rows"
            )

    def remote_slots(self, rank: int) -> int:
        """Dense slots ``rank`` reads from another rank's pool or staging."""
        source, _ = self.descriptors(rank)
        return int(((source % self.cp_size) != rank).sum())

    def _for_rank(self, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cached = self._per_rank.get(rank)
        if cached is None:
            self._check_rank(rank)
            own_staging = self.cp_size + rank
            source, row = self._source.copy(), self._row.copy()
            unused = source == _NONE
            source[unused] = own_staging
            row[unused] = 0
            fill = self._unused_ranges
            fill_runs = np.stack(
                [fill[:, 0], np.ones(len(fill), np.int64), fill[:, 1], np.full(len(fill), own_staging),
                 np.zeros(len(fill), np.int64), np.zeros(len(fill), np.int64)],
                axis=1,
            ).reshape(-1, RUN_COLUMNS)
            runs = np.concatenate([self._span_runs, fill_runs])
            runs = runs[np.argsort(runs[:, 0], kind="stable")]
            for array in (source, row, runs):
                array.flags.writeable = False
            cached = self._per_rank[rank] = (source, row, runs)
        return cached

    def _check_rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.cp_size:
            raise InvalidArgumentError(f"rank must be in [0, {self.cp_size}), got {rank!r}")
        return int(rank)

    def __repr__(self) -> str:
        return (
            f"ComposePlan(cp_size={self.cp_size}, page_size={self.page_size}, "
            f"requests={len(self.requests)}, num_slots={self.num_slots})"
        )


_DIGEST_VERSION = 1


def plan_digest(key: PlanKey) -> int:
    """A 63-bit digest of everything the ranks must agree on for a batch's compose.

    Covers the layout (cp size, page size, pool rows), the dense buffer size and every span of every
    request, in order. Leaves out the device (each rank has its own) and the payload name (the k and
    v plans of one batch share a digest, so one agreement per batch covers both; payloads are agreed
    at registration). SHA-256 of a fixed little-endian int64 encoding: the same on every platform.

    A deliberate second construction beside ``crates/hash`` (whose own doc leaves canonical digests,
    SHA-256 over a fixed encoding, to the structures that need them, as the snapshots do): the plan
    digest is a one-off fingerprint of a whole description computed once per batch (plans are cached),
    not an incrementally updated digest of replicated state, so the Rust mixer's O(1) updates buy
    nothing here, while SHA-256 in the standard library needs no binding call and its value is pinned
    by a test (``PINNED_TINY_DIGEST``), which a switch would change.
    """
    words = [_DIGEST_VERSION, key.cp_size, key.page_size, key.num_slots,
             -1 if key.pool_rows is None else key.pool_rows, len(key.requests)]
    for request in key.requests:
        for spans in (request.prefix, request.current):
            words.append(len(spans))
            for span in spans:
                words.extend(span)
    data = np.array(words, dtype="<i8").tobytes()
    # 63 bits: the pinned definition. The agreement (cpkv.runtime.agree) carries all 64 bits; nothing
    # depends on the top bit being clear any more.
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") >> 1


@dataclass
class PlanCache:
    """Bounded cache of plans keyed by everything that identifies one (oldest entry evicted first)."""

    capacity: int = 64
    hits: int = 0
    misses: int = 0
    _plans: dict[PlanKey, ComposePlan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise InvalidArgumentError(f"plan cache capacity must be >= 1, got {self.capacity}")

    def get(
        self,
        cp_size: int,
        page_size: int,
        requests: Sequence[SlotSpans],
        num_slots: int,
        *,
        device: str | None = None,
        payload: str | None = None,
        pool_rows: int | None = None,
    ) -> ComposePlan:
        key = PlanKey(cp_size, page_size, tuple(requests), num_slots, device, payload, pool_rows)
        plan = self._plans.get(key)
        if plan is not None:
            self.hits += 1
            return plan
        plan = ComposePlan(
            cp_size, page_size, key.requests, num_slots, device=device, payload=payload, pool_rows=pool_rows
        )
        self.misses += 1
        if len(self._plans) >= self.capacity:
            del self._plans[next(iter(self._plans))]  # dicts keep insertion order
        self._plans[key] = plan
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        self._plans.clear()
