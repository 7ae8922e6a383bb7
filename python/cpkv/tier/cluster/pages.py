"""The cluster tier for an engine adapter: one process's checked page records in Mooncake Store,
with no collective of its own (the engine's own agreement points carry its health).

The records and keys are :class:`~cpkv.tier.cluster.tier.ClusterTier`'s (a page's payload, then
the L3 trailer naming namespace, key, sequence 0, length and CRC32C, under
:func:`~cpkv.tier.cluster.tier.object_key`), so every cpkv process of one configuration shares
them: a replay and a server, two servers, any number of instances.

- :class:`ClusterClient`: one connection per process (a :class:`BoundedStore`, every call bounded by
  the timeout), shared by the adapter's threads one call at a time, and the process's health: a
  call that fails with a store fault or does not answer marks it down (every later call a miss, no
  call made) until the adapter's agreement point says otherwise. While down it probes the store
  (:class:`~cpkv.tier.cluster.probe.StoreProbe`, polled by the adapter at its agreement point) and
  the adapter re-attaches it (:meth:`~ClusterClient.reattach`) once the store answers again: cold,
  nothing assumed present, every record checked as always.
- :class:`ClusterPages`: one namespace's pages (one per pool: a KV record is never served as
  indexer bytes): :meth:`~ClusterPages.present` (``batch_is_exist``), :meth:`~ClusterPages.get`
  (``batch_get_into`` registered staging rows nothing else sees, each record checked before a
  byte is handed out; a record that fails is a counted miss and its key is written again by
  ``upsert`` at its next put) and :meth:`~ClusterPages.put` (``batch_is_exist``, then
  ``batch_put_from`` of what the cluster lacks: one copy per cluster).
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from cpkv.errors import ClusterUnavailableError, InvalidArgumentError
from cpkv.tier.cluster.mooncake import BoundedStore, is_fault
from cpkv.tier.cluster.probe import StoreProbe
from cpkv.tier.cluster.tier import DEFAULT_BATCH, TRAILER, connect, get_checked, object_key, put_missing


class ClusterClient:
    """One process's Mooncake client, its calls serialized, and its health (see the module docstring).

    ``setting``: how the engine names the master's key; a master that does not answer at start is
    an :class:`~cpkv.errors.InvalidArgumentError` naming it. ``probe_every``: while down, a probe
    starts at most every that many :meth:`probe_ok` calls (the adapter's agreement points)."""

    def __init__(self, master: str, metadata: str, timeout_s: float, *, setting: str,
                 segment_bytes: int = 0, probe_every: int = 1) -> None:
        self.store: BoundedStore | None = None
        try:
            self.store = connect(master, metadata, timeout_s, segment_bytes)
            self.probe = StoreProbe(self.store, every=probe_every)
        except ClusterUnavailableError as err:
            self.close()
            raise InvalidArgumentError(f"{setting} {master!r}: {err}") from err
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self.down: str | None = None  # why this process makes no more calls (its first fault)
        self.faults = 0
        self.reattaches = 0

    def call(self, job: Callable[[BoundedStore], list[int]]) -> list[int] | None:
        """One store call; None when this process is down, the call failed or did not answer (it is
        then down), or another thread's call held the client for a whole timeout (a miss only)."""
        if self.down is not None or self.store is None:
            return None
        if not self._lock.acquire(timeout=self.timeout_s):
            return None
        try:
            if self.down is not None or self.store is None:
                return None
            codes = job(self.store)
        except ClusterUnavailableError as err:
            self.mark_down(str(err))
            return None
        finally:
            self._lock.release()
        bad = [code for code in codes if is_fault(code)]
        if bad:
            self.mark_down(f"the Mooncake store answered with error code {bad[0]}")
        return codes

    def mark_down(self, reason: str, *, fault: bool = True) -> None:
        """No more calls until :meth:`reattach`; ``fault``: this process's own call failed (counted)."""
        if self.down is None:
            self.down = reason
            self.faults += int(fault)

    def probe_ok(self) -> bool:
        """While down, at the adapter's agreement point: whether this process's last probe of the
        store succeeded (:meth:`StoreProbe.poll`; it starts the next one when due). False while up."""
        if self.down is None or self.store is None:
            return False
        if not self._lock.acquire(timeout=self.timeout_s):
            return False
        try:
            return self.probe.poll()
        finally:
            self._lock.release()

    def reattach(self) -> None:
        """The adapter's agreement point says the store answers again: calls are made again (cold:
        nothing is assumed present; every record read is checked as always)."""
        with self._lock:
            if self.down is None:
                return
            self.down = None
            self.probe.reset()
            self.reattaches += 1

    def register(self, buffer: np.ndarray) -> None:
        assert self.store is not None
        with self._lock:
            self.store.register(buffer.ctypes.data, buffer.nbytes)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None


class ClusterPages:
    """One namespace's page records (pages of ``page_bytes``), read and written through ``client``.
    Safe for concurrent callers (one reader and one writer at a time)."""

    def __init__(self, client: ClusterClient, namespace_id: int, page_bytes: int, batch: int = DEFAULT_BATCH) -> None:
        self.client = client
        self.namespace_id = namespace_id
        self.page_bytes = page_bytes
        self.record_bytes = page_bytes + TRAILER
        self.batch = batch
        # Registered once: the staging rows the store reads into and writes from.
        self._read_rows = np.zeros((batch, self.record_bytes), dtype=np.uint8)
        self._write_rows = np.zeros((batch, self.record_bytes), dtype=np.uint8)
        client.register(self._read_rows)
        client.register(self._write_rows)
        self._reading = threading.Lock()
        self._writing = threading.Lock()
        self._replace: set[int] = set()  # keys whose stored record failed its check: put again by upsert
        self.counters = {"cluster_pages_put": 0, "cluster_pages_read": 0, "cluster_corrupt_dropped": 0}

    def _names(self, keys: Sequence[int]) -> list[str]:
        return [object_key(self.namespace_id, int(k)) for k in keys]

    def present(self, keys: Sequence[int]) -> list[bool]:
        """Per key: the cluster holds an object under it now (all False when the call failed)."""
        out: list[bool] = []
        for start in range(0, len(keys), self.batch):
            part = keys[start:start + self.batch]
            codes = self.client.call(partial(BoundedStore.exist, keys=self._names(part)))
            if codes is None:
                return [False] * len(keys)
            out.extend(code == 1 for code in codes)
        return out

    def get(self, keys: Sequence[int]) -> tuple[list[int], np.ndarray]:
        """Reads and checks the records of ``keys``: (the positions that read back whole and checked,
        uint8 ``[n, page_bytes]`` of those pages, in that order). Every other key is a miss."""
        out = np.empty((len(keys), self.page_bytes), dtype=np.uint8)
        good: list[int] = []
        with self._reading:
            rows = self._read_rows
            for start in range(0, len(keys), self.batch):
                part = [int(k) for k in keys[start:start + self.batch]]
                checked = get_checked(self.client.call, self.namespace_id, rows, self.page_bytes, part)
                if checked is None:
                    break
                for j, (code, reason) in enumerate(checked):
                    if code == self.record_bytes and reason is None:
                        out[len(good)] = rows[j, :self.page_bytes]
                        good.append(start + j)
                    elif code >= 0:  # an object is there, but not the record it must be
                        self.counters["cluster_corrupt_dropped"] += 1
                        self._replace.add(part[j])
        self.counters["cluster_pages_read"] += len(good)
        return good, out[:len(good)]

    def put(self, keys: Sequence[int], pages: Any) -> int:
        """Puts the pages (``pages[i]``: ``page_bytes`` bytes of ``keys[i]``) the cluster lacks, or
        whose stored record failed a check; returns the pages put."""
        put = 0
        with self._writing:
            for start in range(0, len(keys), self.batch):
                part = pages[start:start + self.batch]

                def fill(rows: np.ndarray, part: Any = part) -> None:
                    for j, page in enumerate(part):
                        rows[j, :self.page_bytes] = np.asarray(page).reshape(-1).view(np.uint8)

                put += put_missing(self.client.call, self.namespace_id, self._write_rows, self.page_bytes,
                                   [int(k) for k in keys[start:start + self.batch]], self._replace, fill)
        self.counters["cluster_pages_put"] += put
        return put
