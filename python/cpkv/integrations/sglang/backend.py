"""CpkvHiCacheStorage: SGLang's HiCache storage tier in one cpkv HostSlab per node.

SGLang builds it through ``--hicache-storage-backend dynamic`` as ``cls(storage_config, kwargs)`` on
every rank. What each part does:

- placement and eviction: a :class:`~.index.ReplicatedIndex` fed only by the store calls, which
  SGLang's backup thread makes on every CP rank with the same keys in the same order. No collective
  decides anything; every ``cpkv_check_every`` stores the ranks compare the index's digest (MIN and
  MAX in one all-reduce on a gloo group of the backend's own) and a mismatch raises
  :class:`~cpkv.errors.DivergenceError` on every rank;
- bytes: per registered host pool (the KV pool and any sidecar, such as the NSA indexer's) one
  :class:`~cpkv.tier.slab.HostSlab` shared by the CP ranks of one node, one row per index row,
  plus a stamp per row and part;
- layouts: ``replicated`` (every rank's page bytes are the same: each row is written once per node,
  by the node rank ``row % ranks_on_node``, and read whole by every rank), ``striped`` and ``sliced``
  (each rank's page is its own part: a row holds the node ranks' parts side by side, each rank
  writes and reads its own part);
- visibility: a part's stamp has exactly one writer (the rule above), which sets it to ``-handle``,
  copies, then sets ``handle`` (x86 stores are ordered; the native copy fences its streaming
  stores). A page is present only while every part of its row carries its handle, and a read
  checks its part's stamp again after copying, so a row overwritten under a reader (a faster rank
  reused it) is reported missing, never returned torn. Once no store is in flight on any rank,
  every rank's index and every stamp agree, so every rank gives the same answer.

Reads never change the index (see :mod:`.index`). Errors from the digest check stick: every
later call raises the same error class, naming the first failure.
"""

from __future__ import annotations

import ctypes
import datetime
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cpkv.errors import (
    CollectiveTimeoutError,
    CpkvError,
    DivergenceError,
    InvalidArgumentError,
    UnknownPayloadError,
)
from cpkv.tier.copy import RowCopy, SlabCopier
from cpkv.tier.slab import HostSlab, SlabSpec

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from .config import CpkvStorageSettings
from .index import ReplicatedIndex

__all__ = ["CpkvHiCacheStorage"]

log = logging.getLogger("cpkv.sglang")

KV = str(PoolName.KV)


# -- who is where -------------------------------------------------------------------------------


@dataclass
class Topology:
    """This rank's place in its CP group and in its node's share of it, and the backend's groups."""

    cp_rank: int = 0
    cp_size: int = 1
    node: int = 0  # index of this rank's node among the CP group's nodes
    nodes: int = 1
    local_rank: int = 0  # position among the CP ranks on this node
    node_size: int = 1
    cp_group: Any = None  # gloo, the digest check
    node_group: Any = None  # gloo, the slab's creation
    groups: list[Any] = field(default_factory=list)  # every group this rank created (destroyed on close)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        import socket

        return socket.gethostname()


def _build_topology(config: HiCacheStorageConfig, settings: CpkvStorageSettings) -> Topology:
    """Collective over every process of the job (SGLang constructs the backend on each): one
    exchange of who is who, then every rank creates every CP and node group in the same order."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if config.attn_cp_size > 1:
            raise InvalidArgumentError(
                f"attn_cp_size is {config.attn_cp_size} but torch.distributed is not initialised")
        return Topology()
    timeout = datetime.timedelta(seconds=settings.timeout_s)
    world: Any = dist.new_group(backend="gloo", timeout=timeout)
    cp_size = max(1, config.attn_cp_size)
    attn_tp = max(1, config.tp_size // cp_size) if config.tp_size >= cp_size else 1
    content = (config.pp_rank, config.dp_rank, config.tp_rank % attn_tp)
    mine = (content, config.attn_cp_rank, cp_size, _boot_id(), settings, config.is_storage_writer)
    heard: list[Any] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(heard, mine, group=world)
    except (RuntimeError, TimeoutError, ConnectionError) as err:
        raise CollectiveTimeoutError(f"cpkv sglang backend: ranks did not all construct the backend "
                                     f"within {settings.timeout_s:g} s: {err}") from err
    finally:
        dist.destroy_process_group(world)
    me = dist.get_rank()
    cp_groups: dict[Any, list[tuple[int, int]]] = {}
    for rank, (key, cp_rank, size, _boot, _settings, _writer) in enumerate(heard):
        cp_groups.setdefault((key, size), []).append((cp_rank, rank))
    # Every check looks at every group, so every rank raises the same error (none goes on to
    # create groups that the others never join).
    problems = []
    for (key, size), members in sorted(cp_groups.items()):
        if sorted(c for c, _ in members) != list(range(size)):
            problems.append(f"group {key}: attn_cp ranks {sorted(c for c, _ in members)} are not 0..{size - 1}")
        ranks = [r for _, r in sorted(members)]
        if any(heard[r][4] != heard[ranks[0]][4] for r in ranks):
            problems.append("the CP ranks were given different cpkv_* settings: " +
                            "; ".join(f"rank {r}: {heard[r][4]}" for r in ranks))
        if size > 1 and not all(heard[r][5] for r in ranks):
            problems.append("SGLang backs up this model's pages on some CP ranks only (an MLA model: only "
                            "tp_rank 0 is a storage writer), so the other ranks never see the stores that "
                            "drive cpkv's replicated index; run it with GQA/MHA models")
    if problems:
        raise InvalidArgumentError("cpkv sglang backend: " + "; ".join(problems))

    def node_key(rank: int, cp_rank: int) -> Any:
        if settings.ranks_per_node is not None:
            return cp_rank // settings.ranks_per_node
        return heard[rank][3]

    topo = Topology()
    for (_key, size), members in sorted(cp_groups.items(), key=lambda kv: sorted(r for _, r in kv[1])):
        members = sorted(members)
        ranks = [r for _, r in members]
        group = dist.new_group(ranks, backend="gloo", timeout=timeout) if size > 1 else None
        by_node: dict[Any, list[int]] = {}
        for cp_rank, rank in members:
            by_node.setdefault(node_key(rank, cp_rank), []).append(rank)
        node_list = sorted(by_node.values())
        # A group even for one rank: the slab's creation must not fall back to the default group,
        # which would make ranks of different CP groups (different content) share one slab.
        node_groups = [dist.new_group(n, backend="gloo", timeout=timeout) for n in node_list]
        if me in ranks:
            topo.cp_rank, topo.cp_size, topo.cp_group = config.attn_cp_rank, size, group
            for index, (node_ranks, node_group) in enumerate(zip(node_list, node_groups)):
                if me in node_ranks:
                    topo.node, topo.nodes = index, len(node_list)
                    topo.local_rank, topo.node_size, topo.node_group = node_ranks.index(me), len(node_ranks), node_group
            topo.groups = [g for g in [group, *node_groups] if g is not None]
    return topo


# -- one host pool and its slab -------------------------------------------------------------------


class _PoolSlab:
    """One SGLang host pool, its slab region and the copies between them."""

    def __init__(self, name: str, host_pool: Any, rows: int, parts: int, topo: Topology, timeout_s: float) -> None:
        self.name = name
        self.host_pool = host_pool
        self.page_size = int(getattr(host_pool, "page_size", 1) or 1)
        ptrs, sizes = host_pool.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
        self.entries = len(ptrs)
        self.sizes = [int(s) for s in sizes]
        self.offsets = np.cumsum([0, *self.sizes[:-1]]).astype(np.int64)
        self.part_bytes = int(sum(self.sizes))
        self.parts = parts
        self.row_bytes = self.part_bytes * parts
        self.slab = HostSlab.create(
            {"data": SlabSpec((self.row_bytes,), torch.uint8), "stamp": SlabSpec((parts,), torch.int64)},
            num_pages=rows, num_layers=1, process_group=topo.node_group, timeout_s=timeout_s, pin=False)
        self.data = self.slab.rows("data")[0]  # uint8 [rows, row_bytes]
        self.stamps = self.slab.view("stamp")[0].numpy()  # int64 [rows, parts]
        self.copier = SlabCopier()
        self.native = self._native_setup()

    def _native_setup(self) -> dict[str, Any] | None:
        """Views for the tier's row copy: every page entry one row of ``entry`` bytes, on the slab
        side and in each host buffer. None when the pool's pages are not made of equal entries."""
        if len(set(self.sizes)) != 1:
            return None
        entry = self.sizes[0]
        buffers = []
        seen = set()
        for value in vars(self.host_pool).values():
            for t in (value if isinstance(value, (list, tuple)) else [value]):
                if (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.is_contiguous()
                        and t.numel() > 0 and t.data_ptr() not in seen):
                    seen.add(t.data_ptr())
                    nbytes = t.numel() * t.element_size()
                    if nbytes >= entry:
                        flat = t.view(-1).view(torch.uint8) if t.dim() else t.view(1).view(torch.uint8)
                        buffers.append((t.data_ptr(), flat[: nbytes // entry * entry].view(-1, entry)))
        if not buffers:
            return None
        buffers.sort(key=lambda b: b[0])
        views = [b[1] for b in buffers]
        return {
            "entry": entry,
            "bases": np.array([b[0] for b in buffers], dtype=np.int64),
            "rows": np.array([v.shape[0] for v in views], dtype=np.int64),
            "views": views,
            "slab_rows": self.data.view(-1, entry),
        }

    def page_meta(self, host_indices: Any, count: int) -> np.ndarray:
        """Pointers of the page entries of ``count`` pages starting at ``host_indices`` ([count, entries])."""
        idx = host_indices[: count * self.page_size]
        if not isinstance(idx, torch.Tensor):
            idx = torch.as_tensor(idx, dtype=torch.int64)
        ptrs, _ = self.host_pool.get_page_buffer_meta(idx.cpu())
        return np.asarray(ptrs, dtype=np.int64).reshape(count, self.entries)

    def copy(self, pages: np.ndarray, ptrs: np.ndarray, rows: np.ndarray, part: int, *, to_slab: bool) -> None:
        """Copies the pages ``pages`` (positions in the call, with their entry pointers ``ptrs``)
        between the host pool and slab ``rows``, part ``part`` of each row."""
        if len(pages) == 0:
            return
        ptrs = ptrs[pages]
        native = self.native
        if native is not None:
            entry = native["entry"]
            # Entry-major (every page's K, then every page's V...): consecutive pages make one run each.
            flat = ptrs.T.reshape(-1)
            which = np.searchsorted(native["bases"], flat, side="right") - 1
            offset = flat - native["bases"][np.maximum(which, 0)]
            host_rows = offset // entry
            if (which >= 0).all() and not (offset % entry).any() and (host_rows < native["rows"][which]).all():
                slab_rows = ((rows.astype(np.int64)[None, :] * self.parts + part) * self.entries
                             + np.arange(self.entries, dtype=np.int64)[:, None]).reshape(-1)
                for b in np.unique(which):  # one copy per host buffer (a pool has one or a few)
                    mask = which == b
                    self.copier.copy(RowCopy(host_rows[mask], slab_rows[mask]), native["views"][b],
                                     native["slab_rows"], to_slab=to_slab)
                return
        # Pages of unequal entries (or buffers this module cannot see): one memmove per entry.
        base = self.data.data_ptr()
        for k, row in enumerate(rows.tolist()):
            at = base + row * self.row_bytes + part * self.part_bytes
            for j in range(self.entries):
                slab_ptr, host_ptr = at + int(self.offsets[j]), int(ptrs[k, j])
                if to_slab:
                    ctypes.memmove(slab_ptr, host_ptr, self.sizes[j])
                else:
                    ctypes.memmove(host_ptr, slab_ptr, self.sizes[j])

    def part_view(self, row: int, part: int) -> torch.Tensor:
        return self.data[row, part * self.part_bytes:(part + 1) * self.part_bytes]

    def close(self) -> None:
        self.native = None
        self.copier.clear()  # its source tables hold views of the slab
        self.data = self.stamps = None
        self.slab.close()


def _signed63(value: int) -> int:
    return value >> 1  # 63 bits: -d never overflows int64


# -- the backend ----------------------------------------------------------------------------------


class CpkvHiCacheStorage(HiCacheStorage):
    """SGLang ``HiCacheStorage`` over one cpkv HostSlab per node (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None) -> None:
        self.settings = CpkvStorageSettings.from_extra_config(storage_config.extra_config)
        if storage_config.dcp_size > 1:
            raise InvalidArgumentError("cpkv's storage backend does not run under decode CP (--dcp-size > 1)")
        self.storage_config = storage_config
        self.topology = _build_topology(storage_config, self.settings)
        self.parts = 1 if self.settings.layout == "replicated" else self.topology.node_size
        self.index = ReplicatedIndex(self.settings.pages, self.settings.policy)
        self.pools: dict[str, _PoolSlab] = {}
        self._broken: CpkvError | None = None
        self._closed = False
        self._counters_lock = threading.Lock()
        self.counters = {
            "stores": 0, "pages_offered": 0, "pages_refused": 0, "pages_written": 0, "bytes_written": 0,
            "exists_calls": 0, "exists_hit_pages": 0, "reads": 0, "pages_read": 0, "bytes_read": 0,
            "torn_reads_refused": 0, "digest_checks": 0,
        }
        self.exists_log: list[int] = []  # hit pages per batch_exists (bounded; for tests and bench)
        self._checks: queue.Queue = queue.Queue()
        self._checker: threading.Thread | None = None
        self._checked = threading.Condition()
        self._checks_queued = self._checks_done = 0
        self._metrics: dict[str, list[float]] = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}

    # -- pools ------------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._add_pool(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        if name not in self.pools:
            self._add_pool(name, host_pool)

    def _add_pool(self, name: str, host_pool: Any) -> None:
        """Collective over this node's CP ranks (SGLang registers pools on every rank in one order)."""
        if name in self.pools:
            return
        self.pools[name] = _PoolSlab(name, host_pool, self.settings.pages, self.parts, self.topology,
                                     self.settings.timeout_s)

    def _pool(self, name: Any) -> _PoolSlab:
        try:
            return self.pools[str(name)]
        except KeyError:
            raise UnknownPayloadError(f"host pool {str(name)!r} was never registered with the cpkv backend "
                                      f"(registered: {list(self.pools)})") from None

    # -- failure ----------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the cpkv storage backend is closed")
        if self._broken is not None:
            raise type(self._broken)(f"cpkv storage backend stopped after an earlier failure: {self._broken}")

    def _fail(self, err: CpkvError) -> CpkvError:
        if self._broken is None:
            self._broken = err
        return err

    # -- the replicated side: stores ----------------------------------------------------------------

    def _writer_part(self, row: int) -> int | None:
        """The part of ``row`` this rank writes, or None."""
        topo = self.topology
        if self.parts == 1:
            return 0 if row % topo.node_size == topo.local_rank else None
        return topo.local_rank

    def _read_part(self) -> int:
        return 0 if self.parts == 1 else self.topology.local_rank

    def _store(self, keys: list[str], prefix_keys: list[str] | None) -> np.ndarray:
        """int64 ``[n, 2]``: each key's (row, handle), row -1 where refused."""
        self._check_usable()
        placed = self.index.store(keys, prefix_keys)
        with self._counters_lock:
            self.counters["stores"] += 1
            self.counters["pages_offered"] += len(keys)
            self.counters["pages_refused"] += int((placed[:, 0] < 0).sum())
        return placed

    def _after_store(self) -> None:
        """Every ``cpkv_check_every`` stores, queues this point's digest for the checker thread.

        The digest is taken here, on the backup thread, right after the store (the same point of the
        stream on every rank); the all-reduce runs on a thread of its own, so a rank's backups never
        wait for a slower rank's, and SGLang's threads never wait for the check."""
        every = self.settings.check_every
        if self.topology.cp_group is None or self.index.stores % every:
            return
        if self._checker is None:
            self._checker = threading.Thread(target=self._check_loop, name="cpkv-digest-check", daemon=True)
            self._checker.start()
        with self._checked:
            self._checks_queued += 1
        self._checks.put((self.index.stores, _signed63(self.index.digest())))

    def _check_loop(self) -> None:
        while True:
            item = self._checks.get()
            if item is None or self._broken is not None:
                return
            try:
                self._digest_check(*item)
            except CpkvError:
                return  # kept in self._broken: every later call raises it
            finally:
                with self._checked:
                    self._checks_done += 1
                    self._checked.notify_all()

    def _digest_check(self, stores: int, digest: int) -> None:
        import torch.distributed as dist

        both = torch.tensor([digest, -digest], dtype=torch.int64)
        try:
            dist.all_reduce(both, op=dist.ReduceOp.MIN, group=self.topology.cp_group)
        except (RuntimeError, TimeoutError, ConnectionError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise self._fail(CollectiveTimeoutError(
                f"cp rank {self.topology.cp_rank}: the digest check after store {stores} did not "
                f"complete within {self.settings.timeout_s:g} s (a peer died or stalled): {first}")) from err
        low, high = int(both[0]), -int(both[1])
        if low != high:
            raise self._fail(DivergenceError(
                f"cp rank {self.topology.cp_rank}: the replicated index differs across CP ranks after store "
                f"{stores} (digest {digest:#x}, min {low:#x}, max {high:#x})"))
        with self._counters_lock:
            self.counters["digest_checks"] += 1

    def wait_checks(self, timeout_s: float) -> None:
        """Until every queued digest check has run or failed (tests, benchmarks); raises a failure."""
        with self._checked:
            self._checked.wait_for(lambda: self._checks_done >= self._checks_queued or self._broken is not None,
                                   timeout=timeout_s)
        self._check_usable()

    def _write(self, pool: _PoolSlab, placed: np.ndarray, host_indices: Any) -> int:
        """Writes the placed pages (``_store``'s answer) this rank owns and that are not already
        there; returns pages written."""
        positions = np.flatnonzero(placed[:, 0] >= 0)
        if not len(positions):
            return 0
        rows, handles = placed[positions, 0], placed[positions, 1]
        topo = self.topology
        if self.parts == 1:
            parts = np.zeros(len(rows), dtype=np.int64)
            mine = rows % topo.node_size == topo.local_rank
        else:
            parts = np.full(len(rows), topo.local_rank, dtype=np.int64)
            mine = np.ones(len(rows), dtype=bool)
        mine &= pool.stamps[rows, parts] != handles  # already written (a page stored again): nothing to copy
        if not mine.any():
            return 0
        positions, rows, handles, parts = positions[mine], rows[mine], handles[mine], parts[mine]
        ptrs = pool.page_meta(host_indices, len(placed))
        pool.stamps[rows, parts] = -handles  # invalid while the bytes change
        pool.copy(positions, ptrs, rows, int(parts[0]), to_slab=True)  # one part per rank and row
        pool.stamps[rows, parts] = handles
        return len(rows)

    # -- reads (no replicated state changes) ------------------------------------------------------

    def _present(self, pool: _PoolSlab, keys: list[str]) -> int:
        """Length of the leading run of keys whose every part is written in ``pool``."""
        found = self.index.locate(keys)
        complete = np.zeros(len(keys), dtype=bool)
        if len(found):
            complete[found[:, 0]] = (pool.stamps[found[:, 1]] == found[:, 2:3]).all(axis=1)
        missing = np.flatnonzero(~complete)
        return int(missing[0]) if len(missing) else len(keys)

    def _read(self, pool: _PoolSlab, keys: list[str], host_indices: Any) -> list[bool]:
        found = self.index.locate(keys)
        ok = np.zeros(len(keys), dtype=bool)
        if len(found) == 0:
            return ok.tolist()
        found = found[(pool.stamps[found[:, 1]] == found[:, 2:3]).all(axis=1)]
        if len(found) == 0:
            return ok.tolist()
        positions, rows, handles = found[:, 0], found[:, 1], found[:, 2]
        part = self._read_part()
        ptrs = pool.page_meta(host_indices, len(keys))
        pool.copy(positions, ptrs, rows, part, to_slab=False)
        # Seqlock: a row overwritten while we copied no longer carries the handle we read it under.
        still = pool.stamps[rows, part] == handles
        ok[positions[still]] = True
        good = int(still.sum())
        with self._counters_lock:
            self.counters["torn_reads_refused"] += len(rows) - good
            self.counters["pages_read"] += good
            self.counters["bytes_read"] += good * pool.part_bytes
        return ok.tolist()

    # -- SGLang's interface: v1 -------------------------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        self._check_usable()
        hits = self._present(self._pool(KV), keys)
        with self._counters_lock:
            self.counters["exists_calls"] += 1
            self.counters["exists_hit_pages"] += hits
            if len(self.exists_log) < 1 << 20:
                self.exists_log.append(hits)
        return hits

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        started = time.perf_counter()
        prefix = extra_info.prefix_keys if extra_info is not None else None
        placed = self._store(keys, prefix)
        pool = self._pool(KV)
        written = self._write(pool, placed, host_indices)
        self._account_write(pool, written, started)
        self._after_store()
        return (placed[:, 0] >= 0).tolist()

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        self._check_usable()
        started = time.perf_counter()
        pool = self._pool(KV)
        ok = self._read(pool, keys, host_indices)
        self._account_read(pool, sum(ok), started)
        return ok

    def _account_write(self, pool: _PoolSlab, pages: int, started: float) -> None:
        seconds = time.perf_counter() - started
        with self._counters_lock:
            self.counters["pages_written"] += pages
            self.counters["bytes_written"] += pages * pool.part_bytes
            if pages and len(self._metrics["backup_pgs"]) < 4096:
                self._metrics["backup_pgs"].append(pages)
                self._metrics["backup_bandwidth"].append(pages * pool.part_bytes / max(seconds, 1e-9) / 1e9)

    def _account_read(self, pool: _PoolSlab, pages: int, started: float) -> None:
        seconds = time.perf_counter() - started
        with self._counters_lock:
            self.counters["reads"] += 1
            if pages and len(self._metrics["prefetch_pgs"]) < 4096:
                self._metrics["prefetch_pgs"].append(pages)
                self._metrics["prefetch_bandwidth"].append(pages * pool.part_bytes / max(seconds, 1e-9) / 1e9)

    # -- SGLang's interface: v2 (several pools at once) -------------------------------------------

    def batch_exists_v2(self, keys: list[str], pool_transfers: list[PoolTransfer] | None = None,
                        extra_info: HiCacheStorageExtraInfo | None = None) -> PoolTransferResult:
        kv_pages = self.batch_exists(keys, extra_info)
        hit_count: dict[str, int] = {KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            pool = self._pool(transfer.name)
            present = [False] * kv_pages
            upto = self._present(pool, keys[:kv_pages])
            for i in range(upto):
                present[i] = True
            if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                allowed = set(range(1, upto + 1))
            elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                # Only the last `trailing` pages of a prefix need this pool; check them one by one.
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                have = [self._present(pool, [k]) == 1 for k in keys[:kv_pages]]
                allowed = {n for n in range(1, kv_pages + 1) if all(have[max(0, n - trailing):n])}
            else:
                raise InvalidArgumentError(f"pool {transfer.name!s}: hit policy {transfer.hit_policy!s} "
                                           "is not supported by the cpkv backend")
            if allowed:
                hit_count[str(transfer.name)] = max(allowed)
            restorable &= allowed
        ordered = sorted(restorable)
        return PoolTransferResult(ordered[-1] if ordered else 0, hit_count, ordered)

    def batch_get_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        self._check_usable()
        results: dict[str, list[bool]] = {}
        for transfer in transfers:
            keys = list(transfer.keys or [])
            pool = self._pool(transfer.name)
            if not self._indices_fit(pool, transfer, keys):
                results[transfer.name] = [False] * len(keys)
                continue
            started = time.perf_counter()
            results[transfer.name] = ok = self._read(pool, keys, transfer.host_indices)
            self._account_read(pool, sum(ok), started)
        return results

    def batch_set_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        self._check_usable()
        prefix = extra_info.prefix_keys if extra_info is not None else None
        results: dict[str, list[bool]] = {}
        # Every transfer's keys are stored (the index sees the same calls on every rank whatever
        # the indices); a transfer whose indices do not fit its keys writes nothing.
        for transfer in transfers:
            keys = list(transfer.keys or [])
            started = time.perf_counter()
            placed = self._store(keys, prefix)
            pool = self._pool(transfer.name)
            if self._indices_fit(pool, transfer, keys):
                self._account_write(pool, self._write(pool, placed, transfer.host_indices), started)
                results[transfer.name] = (placed[:, 0] >= 0).tolist()
            else:
                results[transfer.name] = [False] * len(keys)
            self._after_store()
        return results

    @staticmethod
    def _indices_fit(pool: _PoolSlab, transfer: PoolTransfer, keys: list) -> bool:
        indices = transfer.host_indices
        if indices is None or indices.numel() != len(keys) * pool.page_size:
            log.error("cpkv: pool %s: %d host indices for %d keys of %d tokens", transfer.name,
                      0 if indices is None else indices.numel(), len(keys), pool.page_size)
            return False
        return True

    # -- SGLang's interface: the older tensor calls -----------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any | None = None, target_sizes: Any | None = None) -> Any:
        self._check_usable()
        pool = self._pool(KV)
        e = self.index.get(key)
        if e is None or target_location is None or not (pool.stamps[e.row] == e.handle).all():
            return None
        part = self._read_part()
        out = target_location.view(-1).view(torch.uint8)
        if out.numel() != pool.part_bytes:
            raise InvalidArgumentError(f"get {key!r}: target has {out.numel()} bytes, a page has {pool.part_bytes}")
        out.copy_(pool.part_view(e.row, part))
        if pool.stamps[e.row, part] != e.handle:
            with self._counters_lock:
                self.counters["torn_reads_refused"] += 1
            return None
        return target_location

    def batch_get(self, keys: list[str], target_locations: Any | None = None,
                  target_sizes: Any | None = None) -> list[Any]:
        targets = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(self, key: str, value: Any | None = None, target_location: Any | None = None,
            target_sizes: Any | None = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any | None = None, target_locations: Any | None = None,
                  target_sizes: Any | None = None) -> bool:
        placed = self._store(keys, None)
        pool = self._pool(KV)
        written = 0
        for (row, handle), value in zip(placed.tolist(), values or []):
            if row < 0 or value is None:
                continue
            part = self._writer_part(row)
            if part is None or pool.stamps[row, part] == handle:
                continue
            data = value.reshape(-1).view(torch.uint8)
            if data.numel() != pool.part_bytes:
                raise InvalidArgumentError(f"set: a value has {data.numel()} bytes, a page has {pool.part_bytes}")
            pool.stamps[row, part] = -handle
            pool.part_view(row, part).copy_(data)
            pool.stamps[row, part] = handle
            written += 1
        with self._counters_lock:
            self.counters["pages_written"] += written
            self.counters["bytes_written"] += written * pool.part_bytes
        self._after_store()
        return bool((placed[:, 0] >= 0).all())

    # -- housekeeping -----------------------------------------------------------------------------

    def clear(self) -> None:
        """Drops every page (SGLang calls it on every rank while no store is in flight)."""
        self.index.clear()

    def digest(self) -> int:
        return self.index.digest()

    def slab_bytes_in_use(self, name: str = KV) -> int:
        """Bytes of this node's slab that hold a fully written page of a key in the index (counted
        from the shared stamps, so every rank of a node sees the same number once stores are done)."""
        pool = self._pool(name)
        r = self.index.readable()
        if not len(r):
            return 0
        full = (pool.stamps[r[:, 0]] == r[:, 1:2]).all(axis=1)
        return int(full.sum()) * pool.row_bytes

    def stats(self) -> dict[str, Any]:
        topo = self.topology
        with self._counters_lock:
            out: dict[str, Any] = dict(self.counters)
        out.update({
            "layout": self.settings.layout, "policy": self.settings.policy, "rows": self.settings.pages,
            "resident": len(self.index), "evicted": self.index.evicted, "cp_rank": topo.cp_rank,
            "cp_size": topo.cp_size, "node": topo.node, "nodes": topo.nodes, "node_size": topo.node_size,
            "slab_bytes": sum(p.slab.nbytes for p in self.pools.values()),
            "slab_kind": {name: p.slab.kind for name, p in self.pools.items()},
            "copy": {name: "native" if p.native is not None else "memmove" for name, p in self.pools.items()},
            "broken": None if self._broken is None else f"{type(self._broken).__name__}: {self._broken}",
        })
        return out

    def get_stats(self) -> Any:
        """SGLang's storage metrics (pages and GB/s per backup and per read since the last call)."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        metrics = StorageMetrics()
        with self._counters_lock:
            for name, values in self._metrics.items():
                getattr(metrics, name).extend(values)
                values.clear()
        return metrics

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._checker is not None:
            self._checks.put(None)
            self._checker.join(self.settings.timeout_s)
        for pool in self.pools.values():
            pool.close()
        import torch.distributed as dist

        for group in self.topology.groups:
            try:
                dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 -- best effort at shutdown
                pass
        self.topology.groups = []
