"""The durable third tier under the backend's slab: one :class:`~cpkv.tier.l3.L3Store` per store
group and node, in a subdirectory of ``cpkv_l3_dir`` named after the group and the node.

- **Out of the slab** (SGLang's backup thread, inside ``batch_set_v1``): a store that evicts pages
  from the slab hands them here before any byte of the store is written (``SglangIndex.store_pages``
  with ``spill``). A victim's row has exactly one writer on its node, ``row % node_size`` (the slab's
  own rule), and that rank copies the victim out of the row in the same native call that will
  overwrite it, so no other rank can have reused the row first: the L3 writer of a spilled page *is*
  the rank that copied it (``L3Store.put(writers=...)``). Every rank places the same victims in the
  same order (the store stream is replicated), so every rank of a node holds the same L3 index; each
  page is written once per node. Never write-through: only evicted pages reach the disk.
- **Back up** (SGLang's prefetch threads, never its scheduler thread): ``batch_exists`` continues
  the slab's run of hits with the pages L3's index holds (an index lookup, no disk read, and no
  change: only the backup thread's spills change the L3 index, so every rank answers the same once
  no spill is in flight); ``batch_get_v1`` reads each page the slab does not hold from its record
  into SGLang's host pool, its header, key, sequence, namespace and CRC32C checked first. A record
  that fails is a miss, counted, never served, and this rank stops reporting it; every rank of the
  node learns the same failure, and SGLang's MIN over the completed tokens makes the load common.
  L3 pages are not promoted into slab rows: a slab placement must come from the replicated store
  stream, and prefetch calls fall between the stores at a different point on each rank.
- **Once per node** (:mod:`cpkv.tier.l3.staging`): every rank needs every hit (SGLang holds the KV
  replicated), so the node's ranks share a read-staging area in shared memory (created with the
  node's ranks when L3 opens; ``cpkv_l3_staging_pages`` entries): the first rank that needs a
  record claims it, reads and checks it from disk and publishes it (or its failure); the others copy
  it from there, whenever their prefetch gets to it. A rank whose copy was overwritten under it, or
  whose entry is busy with another record, reads from disk itself (counted).

Keys: 64 bits of BLAKE2b over the slab index's key bytes (SGLang's page hash in UTF-8, then group 0's
four bytes), the same in every process and after a restart.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from cpkv.errors import InvalidArgumentError
from cpkv.runtime.agree import agree
from cpkv.tier.l3.staging import L3ReadStaging, default_entries
from cpkv.tier.l3.store import L3Namespace, L3Store

__all__ = ["SglangL3", "l3_key"]

GROUP0 = b"\0\0\0\0"


def l3_key(key: str | bytes) -> int:
    """The L3 key of a slab index key (a ``str`` is SGLang's page hash; ``bytes`` the index's own)."""
    raw = key.encode() + GROUP0 if isinstance(key, str) else bytes(key)
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8, person=b"cpkv-sgl-l3").digest(), "little")


def group_dir_name(store_key: tuple, node: int) -> str:
    """The subdirectory of one store group's node: its content key and node index."""
    parts = "-".join(str(int(v)) for v in store_key) or "single"
    return f"group-{parts}-node{node}"


class SglangL3:
    """One rank's L3 under one pool's slab (opened on every rank of the node: collective)."""

    def __init__(self, directory: str, cap_bytes: int, *, host_pool: Any, page_bytes: int, page_size: int,
                 model: str | None, topology: Any, tp_size: int, timeout_s: float,
                 staging_entries: int | None = None) -> None:
        if not model:
            raise InvalidArgumentError("extra config key 'cpkv_l3_dir': SGLang's storage config names no model "
                                       "(model_name), and an L3 page is served only to the model that wrote it")
        self.node_size, self.local_rank = topology.node_size, topology.local_rank
        layout = getattr(host_pool, "layout", None)
        namespace = L3Namespace(
            model=model,
            dtype=f"{type(host_pool).__name__}:{getattr(host_pool, 'dtype', '?')}",
            kv_layout=f"{layout}; store group {tuple(topology.store_key)}; slab row of {page_bytes} bytes",
            page_size=page_size, cp_size=topology.size, tp_size=tp_size, page_bytes=page_bytes)
        self.path = Path(directory) / group_dir_name(topology.store_key, topology.node)
        self.path.mkdir(exist_ok=True)
        self.store = L3Store(self.path, cap_bytes, namespace, rank=topology.local_rank,
                             ranks_on_node=topology.node_size)
        self.page_bytes = page_bytes
        self._lock = threading.Lock()  # the store is one object; the backup and prefetch threads share it
        self._rejected: set[tuple[int, int]] = set()  # (key, sequence) whose record failed here
        self.counters = {"l3_pages_spilled": 0, "l3_pages_written": 0, "l3_pages_not_copied": 0,
                         "l3_exists_hit_pages": 0, "l3_pages_read": 0, "l3_read_failures": 0}
        # Every rank of the node has recovered (read every rank's log) before any rank writes, and
        # they recovered the same index.
        if topology.node_group is not None and topology.node_size > 1:
            agree(self.store.digest(), group=topology.node_group, rank=topology.local_rank,
                  step="the L3 index after recovery", timeout_s=timeout_s)
        entries = staging_entries if staging_entries is not None else default_entries(page_bytes, self.store.slots)
        try:
            self.staging = L3ReadStaging(self.store, entries, lock=self._lock, process_group=topology.node_group,
                                         wait_s=timeout_s, timeout_s=timeout_s)
        except BaseException:
            self.store.close()
            raise

    # -- out of the slab (the backup thread) ------------------------------------------------------

    def spill(self, keys: Sequence[bytes], rows: Sequence[int], copied: Sequence[bool], pages: np.ndarray) -> int:
        """Places a store's victims (the same on every rank) and writes the ones this rank copied out,
        durable before it returns. Returns the pages this rank wrote."""
        if not len(keys):
            return 0
        l3_keys = [l3_key(k) for k in keys]
        writers = [int(row) % self.node_size for row in rows]
        written = 0
        with self._lock:
            batch = max(1, self.store.slots)
            for start in range(0, len(keys), batch):
                stop = min(len(keys), start + batch)
                part = [(l3_keys[i], pages[i] if copied[i] else None) for i in range(start, stop)]
                before = self.store.counters["pages_written"]
                self.store.put(part, writers=writers[start:stop])
                written += self.store.counters["pages_written"] - before
            self.counters["l3_pages_spilled"] += len(keys)
            self.counters["l3_pages_written"] += written
            self.counters["l3_pages_not_copied"] += sum(
                1 for w, c in zip(writers, copied) if w == self.local_rank and not c)
        return written

    # -- back up (the prefetch threads) -----------------------------------------------------------

    def _found(self, key: str) -> tuple[int, int, int] | None:
        k = l3_key(key)
        hit = self.store.index.peek(k)
        if hit is None or (k, hit[1]) in self._rejected:
            return None
        return k, hit[0], hit[1]

    def holds(self, key: str) -> bool:
        """Whether L3's index holds ``key`` (no disk read, no change)."""
        return self._found(key) is not None

    def read_into(self, keys: Sequence[str], wanted: Sequence[int], pool: Any, host_indices: Any) -> list[int]:
        """Reads the pages of ``keys[i]`` for ``i`` in ``wanted`` from their records into the host pool
        (``pool``: the ``SglangPool``; ``host_indices``: the call's); returns the positions served."""
        with self._lock:
            found: list[tuple[int, tuple[int, int, int]]] = []
            for i in wanted:
                hit = self._found(keys[i])
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
                if reason is not None:
                    key, _, sequence = found[j][1]
                    self._rejected.add((key, sequence))
                    self.store.rejects[reason] = self.store.rejects.get(reason, 0) + 1
            self.counters["l3_read_failures"] += len(found) - len(good)
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
                    "l3_recovery_s": s["recovery_s"], "l3_pages": s["index_pages"], "l3_slots": s["slots"],
                    "l3_disk_bytes": s["disk_bytes"], "l3_cap_bytes": s["cap_bytes"], "l3_mode": s["mode"],
                    "l3_rejects": s["rejects"], "l3_digest": self.digest()})
        out.update(self.staging.stats())
        return out

    def close(self) -> None:
        self.staging.close()
        with self._lock:
            self.store.close()
