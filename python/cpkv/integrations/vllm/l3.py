"""The durable disk tier (L3) under vLLM's offloading connector: chunks the host tier evicts are
written to a node-local directory and come back as hits, after a restart too.

vLLM's connector gives a backend exactly two channels: the specs of the store and load jobs it
creates (scheduler -> workers) and the completion of those jobs (workers -> scheduler; a worker
may not fail one: vLLM asserts ``success``). So the work is split:

- the scheduler side (:class:`L3Catalog`, owned by the manager) decides everything: which evicted
  chunks go to disk (one batch per eviction), their slots and sequences (``L3Index``, recovered
  from the catalog's checksummed log at start), and writes the log: a batch's entries are appended
  and synced only when a job that carried the batch has completed on every worker, so an entry
  always names records that are on disk. Before a chunk found on disk is a hit it reads and checks
  every worker's record in a background thread (the lookup answers RETRY meanwhile, as vLLM's own
  tiering does for a secondary tier); a failed check is a counted miss and the chunk is dropped.
- each worker (:class:`L3Shard`) writes and reads only its own shard of a chunk (workers hold
  different bytes of the same chunk, so that is still one copy per node), in its own preallocated
  data files ``shard-R-of-W/data-N.bin``: the spills a spec carries before any row is written
  again, and a promoted chunk's record into its host rows before the load copies them out.

Every record is self-describing and CRC32C-checked (``cpkv._cpkv.l3_seal``/``l3_check``); its
namespace names the model, dtype, KV layout, chunk size, parallel geometry and the shard, so a page
of another configuration is never served.
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Collection, Sequence

import numpy as np

from cpkv import _cpkv
from cpkv.errors import InvalidArgumentError
from cpkv.tier.l3.store import COMPACT_ENTRIES_PER_SLOT, DATA_FILE_BYTES, HEADER, L3Namespace, slots_for

CATALOG_LOG = "catalog.log"


def l3_key(key: bytes) -> int:
    """The L3 key of a vLLM offload key (its chained block hash and group): 64 bits of BLAKE2b."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class L3Geometry:
    """What both sides compute alike from vLLM's ``OffloadingConfig``: the page one worker stores
    per chunk, the namespaces and the slot count."""

    directory: Path
    cap_bytes: int
    model: str
    dtype: str
    layout: str
    tokens_per_chunk: int
    world: int
    page_bytes: int

    @cached_property
    def slot_bytes(self) -> int:
        return int(_cpkv.l3_record_bytes(self.page_bytes))

    @cached_property
    def slots(self) -> int:
        # The cap covers every worker's data files (one shard each) and the catalog's log.
        slots = slots_for(self.cap_bytes // self.world, self.slot_bytes, 1)
        if slots < 1:
            raise InvalidArgumentError(
                f"kv_connector_extra_config['cpkv_l3_bytes']={self.cap_bytes} holds no chunk: {self.world} "
                f"worker(s) x {self.slot_bytes} bytes per record plus its log entry")
        return min(slots, int(_cpkv.L3_MAX_SLOTS))

    def namespace(self, shard: int | None) -> int:
        """The catalog's namespace (``shard=None``) or one worker's records'."""
        part = "catalog" if shard is None else f"shard {shard} of {self.world}"
        return L3Namespace(model=self.model, dtype=self.dtype, kv_layout=f"vllm offload chunk, {self.layout}, {part}",
                           page_size=self.tokens_per_chunk, cp_size=1, tp_size=self.world,
                           page_bytes=self.page_bytes).id()

    def shard_dir(self, rank: int) -> Path:
        return self.directory / f"shard-{rank}-of-{self.world}"

    def slots_per_file(self) -> int:
        return max(1, min(self.slots, DATA_FILE_BYTES // self.slot_bytes))

    def where(self, slot: int) -> tuple[int, int]:
        """(data file index, byte offset) of ``slot``."""
        per = self.slots_per_file()
        return slot // per, (slot % per) * self.slot_bytes


@dataclass
class SpillBatch:
    """Chunks one eviction sends to disk: ``rows[i]`` holds ``keys[i]``, written at ``slots[i]``
    with ``sequences[i]``. ``id`` orders batches: a worker applies them in id order, once."""

    id: int
    rows: np.ndarray
    keys: list[int]
    slots: list[int]
    sequences: list[int]


@dataclass
class Fill:
    """A promoted chunk: host ``row`` is filled from the record of ``key`` at (``slot``, ``sequence``)."""

    row: int
    key: int
    slot: int
    sequence: int


class L3Catalog:
    """The scheduler side: the L3 index (every decision) and its log, and the record checks that
    precede a hit."""

    def __init__(self, geometry: L3Geometry) -> None:
        self.geometry = geometry
        self.namespace = geometry.namespace(None)
        self.slots = geometry.slots
        path = geometry.directory / CATALOG_LOG
        try:
            log = path.read_bytes()
        except FileNotFoundError:
            log = b""
        self.index, report, valid = _cpkv.L3Index.recover(self.slots, 1, [log], self.namespace, geometry.slot_bytes)
        self.recovered = int(report["kept"])
        self._log_path = path
        self._log_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if valid[0] == 0:  # no log, or one of another namespace or shape: start afresh
            os.ftruncate(self._log_fd, 0)
            os.write(self._log_fd, _cpkv.l3_log_header(self.namespace, geometry.slot_bytes, self.slots))
            os.fdatasync(self._log_fd)
            self._log_entries = 0
        else:
            if os.fstat(self._log_fd).st_size != valid[0]:
                os.ftruncate(self._log_fd, valid[0])  # a torn tail: cut at the last whole entry
            self._log_entries = (valid[0] - _cpkv.L3_LOG_HEADER_BYTES) // _cpkv.L3_LOG_ENTRY_BYTES
        self._next_batch = 1
        self.pending: dict[int, SpillBatch] = {}  # placed, not yet acknowledged by every worker
        self._uncommitted: set[int] = set()  # keys of pending batches: not readable yet
        self.counters = {"spilled": 0, "not_spilled": 0, "committed": 0, "lookups": 0, "hits": 0, "verified": 0,
                         "corrupt_dropped": 0, "promoted": 0, "no_host_room": 0, "compactions": 0}
        self.rejects: dict[str, int] = {}
        self._inflight = 0  # checks started and not yet finished
        self._idle = threading.Condition()
        self._checks: queue.SimpleQueue[tuple[int, int, int] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[int, int, str | None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._check_loop, name="cpkv-l3-check", daemon=True)
        self._thread.start()

    # -- spills ---------------------------------------------------------------------------------

    def spill(self, keys: Sequence[int], rows: Sequence[int], protected: Collection[int] = ()) -> SpillBatch | None:
        """Places chunks leaving the host (the ones not on disk yet); returns their batch.
        ``protected``: chunks a load has yet to read from disk. They are used first, so the index's
        least-recently-used choice cannot take their slots, and the batch is cut to the slots left."""
        new = [(k, r) for k, r in zip(keys, rows) if self.index.peek(k) is None]
        kept = [k for k in protected if self.index.lookup(k) is not None]
        if len(new) > self.slots - len(kept):
            self.counters["not_spilled"] += len(new) - max(0, self.slots - len(kept))
            new = new[:max(0, self.slots - len(kept))]
        if not new:
            return None
        placed = self.index.place([k for k, _ in new])
        row_of = dict(new)
        for _, _, _, evicted, _ in placed:
            if evicted is not None:
                self._uncommitted.discard(evicted)
        batch = SpillBatch(self._next_batch, np.asarray([row_of[p[0]] for p in placed], dtype=np.int64),
                           [p[0] for p in placed], [p[1] for p in placed], [p[2] for p in placed])
        self._next_batch += 1
        self.pending[batch.id] = batch
        self._uncommitted.update(batch.keys)
        self.counters["spilled"] += len(batch.keys)
        return batch

    def carried(self) -> list[SpillBatch]:
        """Every batch not yet acknowledged, in id order (each spec carries them all, so the
        first job a worker runs applies them, in the order they were decided)."""
        return [self.pending[i] for i in sorted(self.pending)]

    def commit(self, batch_ids: Sequence[int]) -> None:
        """A job carrying these batches completed on every worker: their records are durable, so
        their log entries are appended and synced."""
        entries = []
        for batch_id in batch_ids:
            batch = self.pending.pop(batch_id, None)
            if batch is None:
                continue
            for key, slot, sequence in zip(batch.keys, batch.slots, batch.sequences):
                if key in self._uncommitted and self.index.peek(key) == (slot, sequence):
                    entries.append((key, sequence, slot, self.geometry.page_bytes))
                self._uncommitted.discard(key)
        if not entries:
            return
        os.write(self._log_fd, _cpkv.l3_log_entries(entries))
        os.fdatasync(self._log_fd)
        self._log_entries += len(entries)
        self.counters["committed"] += len(entries)
        if self._log_entries > COMPACT_ENTRIES_PER_SLOT * self.slots:
            self._compact()

    def forget_pending(self) -> None:
        """A cache reset: batches not acknowledged may never be written; forget their keys."""
        for batch in self.pending.values():
            for key in batch.keys:
                if key in self._uncommitted:
                    self.index.drop(key)  # never logged: no tombstone needed
        self.pending.clear()
        self._uncommitted.clear()

    # -- lookups and checks ----------------------------------------------------------------------

    def find(self, key: int) -> tuple[int, int] | None:
        """(slot, sequence) of a durable chunk (a use), or None."""
        if key in self._uncommitted:
            return None
        self.counters["lookups"] += 1
        found = self.index.lookup(key)
        self.counters["hits"] += found is not None
        return found

    def peek(self, key: int) -> tuple[int, int] | None:
        return None if key in self._uncommitted else self.index.peek(key)

    def start_check(self, key: int, slot: int, sequence: int) -> None:
        """Reads and checks every worker's record of ``key`` off the scheduler thread."""
        with self._idle:
            self._inflight += 1
        self._checks.put((key, slot, sequence))

    @property
    def checking(self) -> bool:
        with self._idle:
            return self._inflight > 0

    def wait_idle(self, timeout_s: float) -> bool:
        """Waits until every started check has finished (False on timeout)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout_s)

    def checked(self) -> list[tuple[int, int, str | None]]:
        """Checks finished since the last call: (key, sequence, None or the failure's reason)."""
        out = []
        while not self._results.empty():  # one reader (this thread): empty() is exact for it
            out.append(self._results.get_nowait())
        return out

    def drop(self, key: int, reason: str) -> None:
        """Forgets a chunk whose record failed its check (counted; a tombstone in the log)."""
        tombstone = self.index.drop(key)
        if tombstone is None:
            return
        self.counters["corrupt_dropped"] += 1
        self.rejects[reason] = self.rejects.get(reason, 0) + 1
        os.write(self._log_fd, tombstone)  # not synced: a lost tombstone costs a counted miss, never a wrong page
        self._log_entries += 1

    def _check_loop(self) -> None:
        g = self.geometry
        namespaces = [g.namespace(r) for r in range(g.world)]
        while True:
            item = self._checks.get()
            if item is None:
                return
            key, slot, sequence = item
            reason = None
            file, offset = g.where(slot)
            for rank in range(g.world):
                try:
                    with open(g.shard_dir(rank) / f"data-{file}.bin", "rb") as f:
                        f.seek(offset)
                        record = np.frombuffer(f.read(g.slot_bytes), dtype=np.uint8)
                    reason = _cpkv.l3_check(record, namespaces[rank], key, sequence, g.page_bytes)
                except OSError as err:
                    reason = f"unreadable ({errno.errorcode.get(err.errno or 0, err)})"
                if reason is not None:
                    reason = f"shard {rank}: {reason}"
                    break
            self._results.put((key, sequence, reason))
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _compact(self) -> None:
        """Rewrites the log as its live entries (temporary file, sync, rename, sync directory)."""
        entries = [(key, sequence, slot, self.geometry.page_bytes) for key, slot, sequence in self.index.entries()
                   if key not in self._uncommitted]
        tmp = self._log_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _cpkv.l3_log_header(self.namespace, self.geometry.slot_bytes, self.slots)
                     + _cpkv.l3_log_entries(entries))
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._log_path)
        dir_fd = os.open(self.geometry.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        os.close(self._log_fd)
        self._log_fd = os.open(self._log_path, os.O_RDWR | os.O_APPEND)
        self._log_entries = len(entries)
        self.counters["compactions"] += 1

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"l3_{k}": v for k, v in self.counters.items()}
        out.update({"l3_slots": self.slots, "l3_resident": len(self.index), "l3_recovered": self.recovered,
                    "l3_pending_batches": len(self.pending), "l3_rejects": dict(self.rejects),
                    "l3_digest": int(self.index.digest())})
        return out

    def close(self) -> None:
        self._checks.put(None)
        self._thread.join(timeout=30)
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1


class L3Shard:
    """One worker's data files: it writes the spills and reads the fills the specs carry, its own
    shard of each chunk only."""

    def __init__(self, geometry: L3Geometry, rank: int) -> None:
        self.geometry = geometry
        self.namespace = geometry.namespace(rank)
        self.directory = geometry.shard_dir(rank)
        self.directory.mkdir(exist_ok=True)
        slots, per = geometry.slots, geometry.slots_per_file()
        files = -(-slots // per)
        self._fds = []
        for i in range(files):
            size = min(per, slots - i * per) * geometry.slot_bytes
            fd = os.open(self.directory / f"data-{i}.bin", os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)  # reopened smaller: give the blocks back
            os.posix_fallocate(fd, 0, size)
            self._fds.append(fd)
        for stale in self.directory.glob("data-*.bin"):
            index = stale.stem.removeprefix("data-")
            if index.isdigit() and int(index) >= files:
                stale.unlink(missing_ok=True)
        self.applied_upto = 0  # the last batch id written
        self.counters = {"pages_written": 0, "pages_read": 0}

    def write(self, batches: Sequence[SpillBatch], pages_of: Any) -> None:
        """Writes the batches not written yet, in id order, then syncs: ``pages_of(rows)`` gives
        uint8 ``[len(rows), page_bytes]`` of host rows (read before any of them is written again)."""
        g = self.geometry
        touched = set()
        for batch in batches:
            if batch.id <= self.applied_upto:
                continue  # a gap below is a batch a cache reset forgot: never carried again
            pages = pages_of(batch.rows)
            buf = bytearray(g.slot_bytes)
            record = np.frombuffer(buf, dtype=np.uint8)
            for i, (key, slot, sequence) in enumerate(zip(batch.keys, batch.slots, batch.sequences)):
                record[HEADER:HEADER + g.page_bytes] = pages[i]
                record[HEADER + g.page_bytes:] = 0
                _cpkv.l3_seal(record, self.namespace, key, sequence, g.page_bytes)
                file, offset = g.where(slot)
                written = os.pwrite(self._fds[file], buf, offset)
                if written != g.slot_bytes:
                    raise OSError(errno.EIO, f"short L3 write: {written} of {g.slot_bytes} bytes")
                touched.add(file)
            self.counters["pages_written"] += len(batch.keys)
            self.applied_upto = batch.id
        for file in sorted(touched):
            os.fdatasync(self._fds[file])

    def read(self, fill: Fill) -> np.ndarray:
        """The checked payload of a promoted chunk. The scheduler checked this record before it
        answered HIT and no placement reuses its slot until the load ran, so a failure here is
        the disk changing under a reader: raised, never served."""
        g = self.geometry
        file, offset = g.where(fill.slot)
        buf = bytearray(g.slot_bytes)
        got = os.preadv(self._fds[file], [buf], offset)
        record = np.frombuffer(buf, dtype=np.uint8)[:got]
        reason = _cpkv.l3_check(record, self.namespace, fill.key, fill.sequence, g.page_bytes)
        if reason is not None:
            raise InvalidArgumentError(f"L3 record of key {fill.key:#x} at slot {fill.slot} failed its check on "
                                       f"the worker after the scheduler's check passed: {reason}")
        self.counters["pages_read"] += 1
        return record[HEADER:HEADER + g.page_bytes]

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

