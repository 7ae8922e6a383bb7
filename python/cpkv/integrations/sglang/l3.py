"""The durable third tier under the backend's slab: per store group and node, one
:class:`~cpkv.tier.l3.L3Store` per registered host pool (the KV pool, and the DSA indexer's for
DeepSeek-V3.2 / GLM-5), each in ``cpkv_l3_dir/group-<group>-node<node>/<pool>/``, fed the same
key and placement stream (:class:`SglangL3Tier`).

- **Why one store per pool** (and not one record holding every pool's bytes): each pool's reads
  stay what they are for the KV pool alone (a KV read reads KV bytes only, through the same
  :meth:`SglangL3.read_into`), a pool's namespace names the pool (a KV record can never be served
  as indexer bytes, whatever the sizes), and the pools' stores are given the same number of slots
  (:func:`split_cap`), so the same spills place every page at the same slot in each. Against the
  row-reuse race the two designs are the same: what matters is *when* the bytes are copied out.
- **Out of the slab** (SGLang's backup thread, inside its store calls): a store that evicts pages
  from the slab hands them here before any byte of the store is written (``SglangIndex.store_pages``
  with ``spill``: every pool). The pools share one index, so a victim's row has exactly one writer
  on its node in every pool, ``row % node_size`` (the slab's own rule), and that rank copies the
  victim out of the row *of every pool* in the native call that evicts it: under DSA, SGLang stores
  the indexer's transfer (``batch_set_v2``) before the KV (``batch_set_v1``) of the same keys, so
  the store that evicts overwrites one pool's rows now and the other's in this rank's next call;
  no other rank writes those rows, so both still hold the victim at the eviction. A page leaves
  whole or not at all (every pool's row must carry it). The L3 writer of a spilled page *is* the
  rank that copied it (``L3Store.put(writers=...)``). Every rank places the same victims in the
  same order (the store stream is replicated), so every rank of a node holds the same L3 indexes;
  each page is written once per node and pool. Never write-through: only evicted pages reach the
  disk. A page is acknowledged durable once every pool's record is (the store call returned).
- **Back up** (SGLang's prefetch threads, never its scheduler thread): ``batch_exists`` (and
  ``batch_exists_v2`` for each pool's transfer) continues the slab's run of hits with the pages
  *every* pool's L3 index holds (an index lookup, no disk read, and no change: only the backup
  thread's spills change the L3 indexes, so every rank answers the same once no spill is in
  flight); ``batch_get_v1`` (KV) and ``batch_get_v2`` (the indexer) read each page the slab does
  not hold from that pool's record into SGLang's host pool, its header, key, sequence, namespace
  and CRC32C checked first. A record that fails is a miss, counted, never served, and this rank
  stops reporting it (nor the page: an L3 hit is whole); every rank of the node learns the same failure, and SGLang's MIN over the completed tokens (the least of a batch's
  KV and indexer hits) makes the load common. A record its writer rank has not written yet (that
  rank is behind this one) is only this read's miss (``l3_not_written``): the page stays reported
  and is served once written. L3 pages are not promoted into slab rows: a slab placement must come from
  the replicated store stream, and prefetch calls fall between the stores at a different point on
  each rank.
- **Once per node** (:mod:`cpkv.tier.l3.staging`): every rank needs every hit (SGLang holds the KV
  and the indexer replicated), so the node's ranks share a read-staging area per pool in shared
  memory (created with the node's ranks when L3 opens; ``cpkv_l3_staging_pages`` entries each): the
  first rank that needs a record claims it, reads and checks it from disk and publishes it (or its
  failure); the others copy it from there, whenever their prefetch gets to it. A rank whose copy was
  overwritten under it, or whose entry is busy with another record, reads from disk itself (counted).

Keys: 64 bits of BLAKE2b over the slab index's key bytes (SGLang's page hash in UTF-8, then group 0's
four bytes), the same in every process and after a restart.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from cpkv import _cpkv
from cpkv.errors import InvalidArgumentError
from cpkv.runtime.agree import agree
from cpkv.tier.l3.direct import errno_name
from cpkv.tier.l3.directory import DirectoryLock, check_room, tree_bytes, try_lock
from cpkv.tier.l3.keys import hash64
from cpkv.tier.l3.order import NOT_WRITTEN
from cpkv.tier.l3.staging import L3ReadStaging, default_entries
from cpkv.tier.l3.store import L3Namespace, L3Store, slots_for

from .kv_format import kv_cache_format

__all__ = ["SglangL3", "SglangL3Tier", "l3_key", "split_cap"]

GROUP0 = b"\0\0\0\0"
DIR_KEY = "extra config key 'cpkv_l3_dir'"
BYTES_KEY = "extra config key 'cpkv_l3_bytes'"
log = logging.getLogger(__name__)


def l3_key(key: str | bytes) -> int:
    """The L3 key of a slab index key (a ``str`` is SGLang's page hash; ``bytes`` the index's own)."""
    raw = key.encode() + GROUP0 if isinstance(key, str) else bytes(key)
    return hash64(raw, b"cpkv-sgl-l3")


def group_dir_name(store_key: tuple, node: int) -> str:
    """The subdirectory of one store group's node: its content key and node index."""
    parts = "-".join(str(int(v)) for v in store_key) or "single"
    return f"group-{parts}-node{node}"


def _cap_for_slots(slots: int, slot_bytes: int, ranks_on_node: int) -> int:
    """A cap at which :func:`~cpkv.tier.l3.store.slots_for` gives exactly ``slots`` slots: the
    bisection ends at a cap one byte above one that gives fewer, and one more byte adds at most one
    slot (the fixed part only grows with the cap)."""
    low, high = 0, 1
    while slots_for(high, slot_bytes, ranks_on_node) < slots:
        low, high = high, high * 2
    while low < high:
        mid = (low + high) // 2
        if slots_for(mid, slot_bytes, ranks_on_node) >= slots:
            high = mid
        else:
            low = mid + 1
    return high


def split_cap(cap_bytes: int, page_bytes: Mapping[str, int], ranks_on_node: int) -> dict[str, int]:
    """Splits one node's L3 cap between the pools' stores so that each gets the same number of
    slots (the most that fit together): the same spills then place every page at the same slot in
    every pool. Raises :class:`~cpkv.errors.InvalidArgumentError` when not even one page fits."""
    slot_bytes = {name: int(_cpkv.l3_record_bytes(int(b))) for name, b in page_bytes.items()}

    def caps(slots: int) -> dict[str, int]:
        return {name: _cap_for_slots(slots, sb, ranks_on_node) for name, sb in slot_bytes.items()}

    low, high = 0, max(0, cap_bytes // max(1, sum(slot_bytes.values())))
    while low < high:  # the most slots whose caps fit together
        mid = (low + high + 1) // 2
        if sum(caps(mid).values()) <= cap_bytes:
            low = mid
        else:
            high = mid - 1
    if low < 1:
        raise InvalidArgumentError(
            f"extra config key 'cpkv_l3_bytes': {cap_bytes} holds no page of the pools "
            f"{dict(page_bytes)} (bytes per page) with their logs")
    return caps(low)


def claim_group_dir(directory: Path, group: Path, pools: list[str], cap_bytes: int, topology: Any,
                    timeout_s: float) -> DirectoryLock | None:
    """Collective over the node: its leader (local rank 0) locks the group's directory, reclaims
    what in ``directory`` is not this server's (another model's or layout's group directories, a
    pool directory no pool of this model has), and checks the cap against the room left; every
    rank raises the leader's refusal. Returns the leader's lock (None on the other ranks)."""
    lock: DirectoryLock | None = None
    refusal = ""
    if topology.local_rank == 0:
        try:
            lock = _claim(directory, group, pools, cap_bytes, topology, timeout_s)
        except InvalidArgumentError as err:
            refusal = str(err)
        except OSError as err:
            refusal = f"{DIR_KEY} {directory}: cannot prepare {group.name}: {errno_name(err)} ({err.strerror})"
    if topology.node_group is not None and topology.node_size > 1:
        import torch.distributed as dist

        heard = [refusal]
        try:
            dist.broadcast_object_list(heard, src=dist.get_global_rank(topology.node_group, 0),
                                       group=topology.node_group)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        refusal = heard[0]
    if refusal:
        if lock is not None:
            lock.release()
        raise InvalidArgumentError(refusal)
    return lock


def _claim(directory: Path, group: Path, pools: list[str], cap_bytes: int, topology: Any,
           timeout_s: float) -> DirectoryLock:
    ours = {group.name, *(group_dir_name(key, node) for key, node in topology.machine_nodes)}
    created = not group.exists()
    group.mkdir(exist_ok=True)
    try:
        return _claim_made(directory, group, pools, cap_bytes, ours, timeout_s)
    except BaseException:
        if created:  # a refused open leaves nothing behind
            shutil.rmtree(group, ignore_errors=True)
        raise


def _claim_made(directory: Path, group: Path, pools: list[str], cap_bytes: int, ours: set[str],
                timeout_s: float) -> DirectoryLock:
    # One reclaimer at a time on the directory (the leaders of this server's other groups, another
    # server's): a group directory locked by anyone else is then a live server's.
    with DirectoryLock(directory, DIR_KEY, wait_s=timeout_s):
        lock = DirectoryLock(group, DIR_KEY)
        try:
            for entry in sorted(directory.iterdir()):
                if entry.name in ours or not entry.name.startswith("group-") or not entry.is_dir():
                    continue
                held = try_lock(entry)
                if held is None:
                    raise InvalidArgumentError(
                        f"{DIR_KEY} {directory}: {entry.name} is in use by another process (another server "
                        f"of another model or layout): one server per L3 directory")
                shutil.rmtree(entry)
                held.release()
            for entry in sorted(group.iterdir()):
                if entry.is_dir() and entry.name not in pools:  # a pool of an earlier model or layout
                    shutil.rmtree(entry)
            check_room(group, cap_bytes, BYTES_KEY, tree_bytes(group))
        except BaseException:
            lock.release()
            raise
    return lock


def pool_namespace(model: str, kv_format: str, pool_name: str, host_pool: Any, *, page_bytes: int, page_size: int,
                   topology: Any, tp_size: int) -> L3Namespace:
    """What a page of one pool must share with its reader to be served (the L3 tier's and the cluster
    tier's): the model, the KV format it computes in, the pool, its layout, the store group's content
    and the geometry. One pool's record is never another's page."""
    return L3Namespace(
        model=model,
        dtype=f"KV cache {kv_format}; {type(host_pool).__name__}:{getattr(host_pool, 'dtype', '?')}",
        kv_layout=f"pool {pool_name}: {getattr(host_pool, 'layout', None)}; store group {tuple(topology.store_key)}; "
                  f"slab row of {page_bytes} bytes",
        page_size=page_size, cp_size=topology.size, tp_size=tp_size, page_bytes=page_bytes)


class SglangL3:
    """One rank's L3 under one pool's slab (opened on every rank of the node: collective), in
    ``directory/group-<group>-node<node>/<pool_name>/``."""

    def __init__(self, directory: str, cap_bytes: int, *, pool_name: str, host_pool: Any, page_bytes: int,
                 page_size: int, model: str | None, kv_format: str, topology: Any, tp_size: int, timeout_s: float,
                 staging_entries: int | None = None) -> None:
        """``kv_format``: the format the model computes its KV in (:func:`kv_cache_format`), named by
        every pool's namespace: the host pools store every FP8 format as ``uint8``."""
        if not model:
            raise InvalidArgumentError("extra config key 'cpkv_l3_dir': SGLang's storage config names no model "
                                       "(model_name), and an L3 page is served only to the model that wrote it")
        self.node_size, self.local_rank = topology.node_size, topology.local_rank
        if not pool_name or "/" in pool_name or pool_name.startswith("."):
            raise InvalidArgumentError(f"host pool name {pool_name!r} cannot name an L3 subdirectory")
        self.pool_name = pool_name
        namespace = pool_namespace(model, kv_format, pool_name, host_pool, page_bytes=page_bytes, page_size=page_size,
                                   topology=topology, tp_size=tp_size)
        self.path = Path(directory) / group_dir_name(topology.store_key, topology.node) / pool_name
        self.path.mkdir(parents=True, exist_ok=True)
        self.store = L3Store(self.path, cap_bytes, namespace, rank=topology.local_rank,
                             ranks_on_node=topology.node_size, cap_setting=f"{BYTES_KEY} (pool {pool_name!r}'s share)")
        self.page_bytes = page_bytes
        self._lock = threading.Lock()  # the store is one object; the backup and prefetch threads share it
        self._rejected: set[tuple[int, int]] = set()  # (key, sequence) whose record failed here
        self.counters = {"l3_pages_spilled": 0, "l3_pages_written": 0, "l3_pages_not_copied": 0,
                         "l3_exists_hit_pages": 0, "l3_pages_read": 0, "l3_read_failures": 0,
                         "l3_reads_not_written": 0}
        # Why this rank writes no more pages (its own I/O error, or a node rank's, learnt at a digest
        # check): it still places every page as every rank does, so the indexes never diverge.
        self.stopped: str | None = None
        try:
            # Every rank of the node has recovered (read every rank's log) before any rank writes,
            # and they recovered the same index.
            if topology.node_group is not None and topology.node_size > 1:
                agree(self.store.digest(), group=topology.node_group, rank=topology.local_rank,
                      step=f"pool {pool_name!r}'s L3 index after recovery", timeout_s=timeout_s)
            entries = staging_entries if staging_entries is not None else default_entries(page_bytes, self.store.slots)
            self.staging = L3ReadStaging(self.store, entries, lock=self._lock, process_group=topology.node_group,
                                         wait_s=timeout_s, timeout_s=timeout_s)
        except BaseException:
            self.store.close()
            raise

    # -- out of the slab (the backup thread) ------------------------------------------------------

    def spill(self, l3_keys: Sequence[int], rows: Sequence[int], copied: Sequence[bool], pages: np.ndarray) -> int:
        """Places a store's victims (their :func:`l3_key`, the same on every rank) and writes the ones
        this rank copied out, durable before it returns. Returns the pages this rank wrote."""
        if not len(l3_keys):
            return 0
        writers = [int(row) % self.node_size for row in rows]
        written = 0
        with self._lock:
            batch = max(1, self.store.slots)
            for start in range(0, len(l3_keys), batch):
                stop = min(len(l3_keys), start + batch)
                keep = self.stopped is None
                part = [(l3_keys[i], pages[i] if copied[i] and keep else None) for i in range(start, stop)]
                before = self.store.counters["pages_written"]
                try:
                    self.store.put(part, writers=writers[start:stop])
                except OSError as err:  # placed before the write failed: the index is every rank's
                    self.stop(f"local rank {self.local_rank}'s L3 write failed: {errno_name(err)} ({err.strerror})")
                written += self.store.counters["pages_written"] - before
            self.counters["l3_pages_spilled"] += len(l3_keys)
            self.counters["l3_pages_written"] += written
            self.counters["l3_pages_not_copied"] += sum(
                1 for w, c in zip(writers, copied) if w == self.local_rank and not c)
        return written

    def stop(self, reason: str) -> None:
        """This rank writes no more pages into this pool's store (it goes on placing them)."""
        if self.stopped is None:
            self.stopped = reason
            log.warning("cpkv L3 pool %r: no more pages written: %s", self.pool_name, reason)

    # -- back up (the prefetch threads) -----------------------------------------------------------

    def _found(self, k: int) -> tuple[int, int, int] | None:
        hit = self.store.index.peek(k)
        if hit is None or (k, hit[1]) in self._rejected:
            return None
        return k, hit[0], hit[1]

    def holds(self, k: int) -> bool:
        """Whether L3's index holds the page of L3 key ``k`` (no disk read, no change)."""
        return self._found(k) is not None

    def read_into(self, keys: Sequence[str], wanted: Sequence[int], pool: Any, host_indices: Any) -> list[int]:
        """Reads the pages of ``keys[i]`` for ``i`` in ``wanted`` from their records into the host pool
        (``pool``: the ``SglangPool``; ``host_indices``: the call's); returns the positions served."""
        with self._lock:
            found: list[tuple[int, tuple[int, int, int]]] = []
            for i in wanted:
                hit = self._found(l3_key(keys[i]))
                if hit is not None:
                    found.append((i, hit))
        if not found:
            return []
        out = np.empty((len(found), self.page_bytes), dtype=np.uint8)
        # From the node's staging area, or from disk once per node (the area takes the lock for that).
        reasons = self.staging.read([f for _, f in found], out)
        good = [j for j, reason in enumerate(reasons) if reason is None]
        with self._lock:
            for j, reason in enumerate(reasons):
                if reason is not None and reason != NOT_WRITTEN:  # not written yet: a miss this time only
                    key, _, sequence = found[j][1]
                    self._rejected.add((key, sequence))
                    self.store.rejects[reason] = self.store.rejects.get(reason, 0) + 1
            unwritten = reasons.count(NOT_WRITTEN)
            self.counters["l3_read_failures"] += len(found) - len(good) - unwritten
            self.counters["l3_reads_not_written"] += unwritten
            self.counters["l3_pages_read"] += len(good)
        if good:
            pool.fill_host(host_indices, len(keys), [found[j][0] for j in good], np.ascontiguousarray(out[good]))
        return [found[j][0] for j in good]

    # -- housekeeping -----------------------------------------------------------------------------

    def digest(self) -> int:
        return self.store.digest()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            s = self.store.stats()
            out: dict[str, Any] = dict(self.counters)
        out.update({"l3_dir": str(self.path), "l3_recovered_pages": s["recovered_pages"],
                    "l3_evicted": s.get("index_evicted"),
                    "l3_recovery_s": s["recovery_s"], "l3_pages": s["index_pages"], "l3_slots": s["slots"],
                    "l3_disk_bytes": s["disk_bytes"], "l3_cap_bytes": s["cap_bytes"], "l3_mode": s["mode"],
                    "l3_rejects": s["rejects"], "l3_pages_superseded": s["pages_superseded"],
                    "l3_digest": self.digest(), "l3_stopped": self.stopped})
        out.update(self.staging.stats())
        return out

    def close(self) -> None:
        self.staging.close()
        with self._lock:
            try:
                self.store.close()
            except OSError as err:  # descriptors closed; what was not synced is not acknowledged
                self.stop(f"local rank {self.local_rank}'s L3 sync at close failed: {errno_name(err)}")


class SglangL3Tier:
    """One rank's L3 under every pool of its node's slab: one :class:`SglangL3` per pool (the pools
    registered by SGLang before ``on_host_pools_registered``), opened in the pools' order (the same
    on every rank: collective), with :func:`split_cap`'s share of the cap each."""

    def __init__(self, directory: str, cap_bytes: int, pools: Mapping[str, Any], *, model: str | None,
                 kv_cache_dtype: str, topology: Any, tp_size: int, timeout_s: float,
                 staging_entries: int | None = None) -> None:
        """``pools``: name -> the backend's ``PoolSlab`` (its ``host_pool``, ``page_bytes``, ``page_size``),
        the KV pool first; ``kv_cache_dtype``: the server's ``--kv-cache-dtype`` (``auto`` resolved from
        the KV pool, :func:`kv_cache_format`); ``staging_entries``: each pool's read-staging entries
        (``cpkv_l3_staging_pages``; None: the default)."""
        if not pools:
            raise InvalidArgumentError("extra config key 'cpkv_l3_dir': no host pool was registered")
        kv_format = kv_cache_format(kv_cache_dtype, getattr(next(iter(pools.values())).host_pool, "dtype", None))
        caps = split_cap(cap_bytes, {name: p.page_bytes for name, p in pools.items()}, topology.node_size)
        self.cap_bytes = cap_bytes
        self.path = Path(directory) / group_dir_name(topology.store_key, topology.node)
        self.pools: dict[str, SglangL3] = {}
        # The node's leader holds the group's directory (and reclaimed what is not this server's)
        # before any rank opens a store in it; every rank learns the outcome from it.
        self._lock = claim_group_dir(Path(directory), self.path, list(pools), cap_bytes, topology, timeout_s)
        try:
            for name, p in pools.items():
                self.pools[name] = SglangL3(directory, caps[name], pool_name=name, host_pool=p.host_pool,
                                            page_bytes=p.page_bytes, page_size=p.page_size, model=model,
                                            kv_format=kv_format, topology=topology, tp_size=tp_size,
                                            timeout_s=timeout_s, staging_entries=staging_entries)
        except BaseException:
            self.close()
            raise
        self.anchor = next(iter(self.pools.values()))  # the KV pool: SGLang registers it first

    def pool(self, name: str) -> SglangL3 | None:
        return self.pools.get(name)

    # -- out of the slab (the backup thread) ------------------------------------------------------

    def spill(self, keys: Sequence[bytes], rows: Sequence[int], copied: Sequence[bool],
              pages: Sequence[np.ndarray]) -> int:
        """A store's victims (``SglangIndex.store_pages``' spill over every pool, in this tier's pool
        order) into every pool's store; each page durable in every pool before it returns. Returns
        the pages this rank wrote (per pool: the same number in each)."""
        if len(pages) != len(self.pools):
            raise InvalidArgumentError(f"spill: pages of {len(pages)} pools for an L3 of {len(self.pools)}")
        l3_keys = [l3_key(k) for k in keys]  # hashed once for every pool
        written = 0
        for l3, pool_pages in zip(self.pools.values(), pages):
            written = l3.spill(l3_keys, rows, copied, pool_pages)
        return written

    def healthy(self) -> int:
        """1 while this rank writes every pool's pages (the digest check's MIN over the node carries it)."""
        return 0 if any(l3.stopped is not None for l3 in self.pools.values()) else 1

    def stop(self, reason: str) -> None:
        for l3 in self.pools.values():
            l3.stop(reason)

    # -- back up (the prefetch threads) -----------------------------------------------------------

    def holds(self, key: str) -> bool:
        """Whether every pool's L3 index holds ``key``: a page is an L3 hit only whole."""
        k = l3_key(key)  # hashed once, looked up in every pool's index
        return all(l3.holds(k) for l3 in self.pools.values())

    # -- housekeeping -----------------------------------------------------------------------------

    def digest(self) -> int:
        """One 64-bit digest of every pool's L3 index, in pool order."""
        raw = b"".join(name.encode() + b"\0" + int(l3.digest()).to_bytes(8, "little")
                       for name, l3 in self.pools.items())
        return hash64(raw, b"cpkv-sgl-l3d")

    def stats(self) -> dict[str, Any]:
        """The anchor (KV) pool's page counters (a page counts once, whole), read failures summed over
        the pools, the node's disk bytes and cap over all pools, and each pool's own under ``l3_pools``."""
        per = {name: l3.stats() for name, l3 in self.pools.items()}
        out = dict(per[self.anchor.pool_name])
        out.update({"l3_dir": str(self.path), "l3_cap_bytes": self.cap_bytes, "l3_digest": self.digest(),
                    "l3_disk_bytes": tree_bytes(self.path),
                    "l3_read_failures": sum(s["l3_read_failures"] for s in per.values()),
                    "l3_pools": per})
        return out

    def close(self) -> None:
        try:
            for l3 in self.pools.values():
                l3.close()
        finally:
            if self._lock is not None:
                self._lock.release()
