"""ShmGroup: one real process per rank; pools and stagings in POSIX shared memory.

The CPU counterpart of CUDA IPC. At registration every rank creates one segment
(its pool plus two staging buffers) and maps every peer's, so the gather reads
peers' rows directly. ``torch.distributed`` (gloo) carries the setup exchange,
the barrier and the all-reduce baseline.

Per compose call: write this rank's current rows into its staging (rows
1..n), one barrier, one gather through the 2 * cp source table. Stagings are
double-buffered by call parity, so one barrier per call is enough: a rank can
only overwrite a staging buffer two calls later, after passing the barrier of
the call in between, which every peer reaches only after finishing its gather
of the buffer's previous contents.

Pools are written by their owners outside compose; separate such writes from
peers' composes with :meth:`ShmGroup.barrier`.

Rank-uniform by construction: every branch before the barrier (staging
capacity, fallback, pool rows) is decided from the plan and the registered
pools, which are the same on every rank, and the plan itself is agreed once per
batch (one all-reduce of its digest, :mod:`cpkv.runtime.agree`; :class:`~cpkv.errors.DivergenceError`
on every rank when they differ). Only a caller's own mistake (wrong number of
current rows) raises on one rank; its peers then fail at the barrier with
:class:`~cpkv.errors.CollectiveTimeoutError` instead of hanging, and every rank
that saw an error refuses further calls (:class:`~cpkv.errors.GroupBrokenError`).

Names: a segment's /dev/shm name exists only during registration. Each rank
reserves its segment's memory at creation (``posix_fallocate``: a /dev/shm too
small fails there, on every rank, with a message naming the bytes and the room
left), maps every peer's, and once every rank has mapped every segment the
names are unlinked: the mappings outlive them, so no exit of any process
(SIGTERM, SIGKILL) after registration leaves anything in /dev/shm.
"""

from __future__ import annotations

import math
import os
import secrets
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from cpkv.compose.groups.base import (
    DistributedGroup,
    check_current_rows,
    check_pool,
    gather_planned,
    on_every_rank,
)
from cpkv.compose.plan import ComposePlan, PlanCache
from cpkv.errors import FallbackError, InvalidArgumentError
from cpkv.runtime.segment import SharedSegment
from cpkv.runtime.shm import SHM_DIR, unlink_now
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, as_timedelta, guarded

_ALIGN = 4096


@dataclass
class _Payload:
    index: int
    rows: int
    page_shape: tuple[int, ...]
    dtype: Any
    row_bytes: int
    staging_capacity: int  # rows per staging buffer, dummy row included
    segments: list[SharedSegment]
    pools: list[Any]  # uint8 [rows, row_bytes] per rank
    stagings: list[list[Any]]  # [rank][parity] uint8 [staging_capacity, row_bytes]
    calls: int = 0
    tables: list[Any] = field(default_factory=list)  # per parity: the 2 * cp sources, checked once

    def sources(self, parity: int) -> Any:
        """The gather's source table for ``parity`` (every pool, then every staging of that parity),
        a native ``RowSources`` built on first use: the mappings live as long as the group."""
        if not self.tables:
            from cpkv._cpkv import RowSources

            self.tables = [RowSources([*self.pools, *(s[q] for s in self.stagings)]) for q in (0, 1)]
        return self.tables[parity]


def _layout(rows: int, row_bytes: int, staging_capacity: int) -> tuple[int, int, int]:
    """Byte offsets of the pool, staging 0 and staging 1 in a segment, and its size."""
    pool_bytes = _round_up(rows * row_bytes)
    staging_bytes = _round_up(staging_capacity * row_bytes)
    return pool_bytes, staging_bytes, pool_bytes + 2 * staging_bytes


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class ShmGroup(DistributedGroup):
    """A rank of a gloo process group whose pools every rank maps through /dev/shm."""

    device = "cpu"

    def __init__(
        self,
        *,
        process_group: Any = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        allow_allreduce_fallback: bool = False,
    ) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise InvalidArgumentError("ShmGroup needs torch.distributed initialised (gloo) in every rank")
        self._dist = dist
        self._pg = process_group
        self.rank = dist.get_rank(process_group)
        super().__init__(dist.get_world_size(process_group))
        self.timeout_s = float(timeout_s)
        self._timeout = as_timedelta(self.timeout_s)
        self.allow_allreduce_fallback = allow_allreduce_fallback
        self._payloads: dict[str, _Payload] = {}
        self.plans = PlanCache()
        self._init_protocol()
        # Segment names must be unique per group and agreed by all ranks: rank 0 picks, everyone hears.
        run_id = [f"{os.getpid()}-{secrets.token_hex(4)}" if self.rank == 0 else None]
        guarded("setup broadcast", self.rank, -1, self.timeout_s,
                lambda: dist.broadcast_object_list(run_id, group=process_group, group_src=0))
        assert run_id[0] is not None  # the broadcast filled it on every rank
        self.run_id: str = run_id[0]

    # -- setup (collective; every rank calls it with the same arguments) -----------------

    def register_pool(
        self, payload: str, rows: int, page_shape: Sequence[int], dtype: Any, max_current_pages: int
    ) -> Any:
        """Creates this rank's pool (and stagings for ``max_current_pages``) in shared memory.

        Collective: every rank registers the same payloads in the same order with
        the same arguments, and maps every peer's segment before returning.
        Returns this rank's pool, ``[rows, *page_shape]`` of ``dtype``, zeroed.
        """
        with self._protocol(f"registration of payload {payload!r}"):
            return self._register_pool(payload, rows, page_shape, dtype, max_current_pages)

    def _register_pool(
        self, payload: str, rows: int, page_shape: Sequence[int], dtype: Any, max_current_pages: int
    ) -> Any:
        import torch

        spec = (payload, int(rows), tuple(int(d) for d in page_shape), str(dtype), int(max_current_pages))
        specs: list[Any] = [None] * self.cp_size
        mine = (spec, payload in self._payloads)
        guarded("pool registration", self.rank, -1, self.timeout_s,
                lambda: self._dist.all_gather_object(specs, mine, group=self._pg))
        # Every rank sees the same gathered specs, so every rank raises (or not) alike.
        if any(s != specs[0] for s in specs):
            raise on_every_rank(InvalidArgumentError(f"payload {payload!r}: ranks registered different pools: {specs}"))
        if specs[0][1]:
            raise on_every_rank(InvalidArgumentError(f"payload {payload!r} is already registered"))
        if rows < 1 or max_current_pages < 0 or any(d < 1 for d in spec[2]):
            raise on_every_rank(InvalidArgumentError(f"payload {payload!r}: bad pool spec {spec}"))
        row_bytes = math.prod(spec[2]) * torch.empty((), dtype=dtype).element_size()
        capacity = max_current_pages + 1
        pool_bytes, staging_bytes, total = _layout(rows, row_bytes, capacity)
        # Registration order is checked equal on every rank, so this index agrees across ranks
        # (a process-wide counter would not, once one rank had built another group).
        index = len(self._payloads)
        names = [f"cpkv-{self.run_id}-p{index}-r{r}" for r in range(self.cp_size)]

        segments: list[SharedSegment] = []
        try:
            # 1. Each rank creates its segment, its memory reserved now; the outcomes are exchanged,
            #    so a /dev/shm too small fails here on every rank with the creator's message.
            own, error = None, None
            try:
                own = SharedSegment(names[self.rank], total, create=True)
            except OSError as err:
                error = f"rank {self.rank}: cannot create /dev/shm/{names[self.rank]} ({total} bytes): {err}"
            self._raise_agreed(payload, "pool registration", error)
            assert own is not None  # every rank created its segment, or every rank raised above
            # 2. Each rank maps every peer's; the outcomes are exchanged, which also tells every
            #    creator that every rank now holds a mapping of its segment.
            error = None
            try:
                for r in range(self.cp_size):
                    segments.append(own if r == self.rank else SharedSegment(names[r], total, create=False))
            except (OSError, ValueError) as err:
                error = f"rank {self.rank}: cannot map {names[len(segments)]}: {err}"
            self._raise_agreed(payload, "pool mapping", error)
            # 3. The names go: from here no exit of any process can leave anything in /dev/shm.
            own.unlink()
            self.barrier("pool registration", layer=-1)  # every name is gone once any rank returns
        except BaseException:
            for segment in segments:
                segment.close()
            for name in names:  # peers' names too: their creator may be dead
                unlink_now(os.path.join(SHM_DIR, name))
            raise
        pools, stagings = [], []
        for segment in segments:
            flat = segment.tensor
            pools.append(flat[: rows * row_bytes].view(rows, row_bytes))
            stagings.append([
                flat[start : start + capacity * row_bytes].view(capacity, row_bytes)
                for start in (pool_bytes, pool_bytes + staging_bytes)
            ])
        self._payloads[payload] = _Payload(index, rows, spec[2], dtype, row_bytes, capacity, segments, pools, stagings)
        return self.pool(payload)

    def _raise_agreed(self, payload: str, what: str, error: str | None) -> None:
        """Exchanges this rank's outcome of a registration step; any failure raises alike on every rank."""
        errors: list[Any] = [None] * self.cp_size
        guarded(what, self.rank, -1, self.timeout_s,
                lambda: self._dist.all_gather_object(errors, error, group=self._pg))
        if any(errors):
            raise on_every_rank(InvalidArgumentError(f"payload {payload!r}: {'; '.join(e for e in errors if e)}"))

    # -- the hot path ---------------------------------------------------------------------

    def _compose(self, plan: ComposePlan, payload: str, current: Any, layer: int, out: Any) -> Any:
        """Stage into shared memory, one barrier, one native gather (a dense all-reduce when the batch
        outgrows the staging)."""
        p = self._payload(payload)
        self._check_plan(plan)
        self._agree(plan, layer)
        check_pool(plan, self.rank, self.pool(payload), payload)
        if plan.max_staging_rows > p.staging_capacity:
            # Decided from the plan alone, so every rank takes the same branch.
            return self._fallback(plan, payload, current, layer, out, p)
        rows = check_current_rows(plan, self.rank, current, p.row_bytes, p.staging_capacity)
        parity = p.calls % 2
        p.calls += 1
        p.stagings[self.rank][parity][1 : rows.shape[0] + 1].copy_(rows)
        self.barrier("compose barrier", layer=layer)
        dense, target = self._dense(plan, p, out)
        gather_planned(target, p.sources(parity), plan, self.rank)
        self.stats.composes += 1
        return dense.view(p.dtype).view(plan.num_slots, *p.page_shape)


    def barrier(self, what: str = "barrier", *, layer: int = -1) -> None:
        """A gloo barrier with this group's timeout; failure names this rank and the layer."""
        started = time.perf_counter()
        with self._protocol(what):
            guarded(what, self.rank, layer, self.timeout_s,
                    lambda: self._dist.monitored_barrier(group=self._pg, timeout=self._timeout))
        self.stats.barriers += 1
        self.stats.barrier_s += time.perf_counter() - started

    def _fallback(self, plan: ComposePlan, payload: str, current: Any, layer: int, out: Any, p: _Payload) -> Any:
        message = (f"payload {payload!r}: the batch stages up to {plan.max_staging_rows - 1} current pages on one "
                   f"rank, the staging holds {p.staging_capacity - 1}")
        if not self.allow_allreduce_fallback:
            # Decided from the agreed plan and the registered capacity: every rank raises it here.
            raise on_every_rank(FallbackError(message + " (allow_allreduce_fallback is off)"))
        self.stats.fallbacks += 1
        if self.stats.fallbacks == 1 or self.stats.fallbacks % 1000 == 0:  # rate-limited
            warnings.warn(f"{message}: composing by all-reduce (fallback #{self.stats.fallbacks})", stacklevel=3)
        return self.compose_allreduce(plan, payload, current, layer=layer, out=out)

    def _dense(self, plan: ComposePlan, p: _Payload, out: Any) -> tuple[Any, Any]:
        """The dense buffer as a tensor, and what the gather writes through: a fresh buffer is
        allocated by numpy (as fast as ``torch.empty``) and shared with its tensor, so the gather
        gets the array and skips a microsecond of torch calls; a caller's ``out`` goes as it is."""
        if out is not None:
            out = self._out(plan, p, out)
            return out, out
        import numpy as np
        import torch

        rows = np.empty((plan.num_slots, p.row_bytes), dtype=np.uint8)
        return torch.from_numpy(rows), rows

    def _out(self, plan: ComposePlan, p: _Payload, out: Any) -> Any:
        import torch

        if out is None:
            return torch.empty(plan.num_slots, p.row_bytes, dtype=torch.uint8)
        if out.dtype != torch.uint8 or tuple(out.shape) != (plan.num_slots, p.row_bytes) or not out.is_contiguous():
            raise InvalidArgumentError(f"out must be contiguous uint8 [{plan.num_slots}, {p.row_bytes}]")
        return out

    # -- teardown -------------------------------------------------------------------------

    def abort(self) -> None:
        """Local, for error paths: unmaps everything without waiting for peers (the names are
        already gone: registration drops them once every rank has mapped)."""
        self._release()

    def _release(self) -> None:
        self._closed = True
        for p in self._payloads.values():
            p.tables.clear()  # they hold views of the mappings closed below
            p.pools.clear()
            p.stagings.clear()
            for segment in p.segments:
                if segment.owner:
                    segment.unlink()  # a no-op after registration (the name is already gone)
                segment.close()
        self._payloads.clear()

