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

A clean stop spills what is still in host memory. vLLM 0.33 stops the workers first (``EngineCore.shutdown``:
the executor, then the scheduler), so no job can carry that spill and no completion can report it. Each
worker, at its close, writes a *stop copy*: its shard of at most ``L3Geometry.stop_rows`` host rows it
holds a chunk in, each sealed with that chunk's key (the specs tell it which key each store and fill
put in which row), densely into ``shard-R-of-W/stop.bin`` (not synced: the catalog rewrites it). The
catalog, at its close, takes each chunk the host still holds (and each spill no worker acknowledged)
whose record checks out on every worker's stop copy, places it, writes every shard's record into its
data file, syncs, and only then logs it; then it removes the stop copies. A stop copy the catalog
never took in (a kill during the stop) is removed when the next life's workers open, before they
size their data files.

The cap holds at every moment, the stop included: the stop copies are part of it. The geometry
reserves ``stop_rows`` records per worker (an eighth of what the worker's share of the cap would hold;
not sized by the host, so that ``cpkv_host_blocks`` does not change the log's shape) and sizes the data
slots from the rest, so data files, log and stop copies together stay within ``cpkv_l3_bytes``; the
host's chunks beyond the reserve are not kept at a stop (``l3_not_spilled``). Chosen over taking the
stop copies in piecemeal (a worker could not shrink its copy as the catalog goes: vLLM has closed it)
and over a sparse copy at the rows' offsets (bounded by the rows written, not by a size both sides
know). Which rows a worker
keeps is its own rule, no channel needed: the chunks of its most recent jobs first, each job's in
the order the job lists them (a prefix before its continuation), as a prefix cache values them. The
catalog reads back what each copy holds (every record names its key) and takes in the chunks every
worker's copy proves.

I/O: spills are written O_DIRECT where the file system takes it (:mod:`cpkv.tier.l3.direct`; else
buffered, the reason in ``stats()``); reads stay buffered with read-ahead off, so a promoted record is
read from disk once per node: by the scheduler's check, the worker's fill then finding it in the page
cache (and dropping it).

An I/O error at run time (a full disk, a failed write or sync) stops the tier, never the engine:
the catalog places nothing more, forgets what it has not logged and keeps serving what it has. A
worker may not fail its job, so one whose write fails removes its shard's ``writing`` file before
vLLM hears of the job, and the catalog, which looks for every shard's file before it logs a batch,
logs none of that job's chunks and stops (:meth:`L3Catalog.stop`, :meth:`L3Shard._stop`).

Every record is self-describing and CRC32C-checked (``cpkv._cpkv.l3_seal``/``l3_check``); its
namespace names the model, dtype, KV layout, chunk size, parallel geometry and the shard, so a page
of another configuration is never served.
"""

from __future__ import annotations

import errno
import logging
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
from cpkv.tier.l3.direct import AlignedScratch, errno_name, probe_direct, slot_runs, write_fully
from cpkv.tier.l3.directory import InstanceLock, check_room, tree_bytes
from cpkv.tier.l3.files import DataFiles
from cpkv.tier.l3.keys import hash64
from cpkv.tier.l3.log import IndexLog, read_log
from cpkv.tier.l3.store import HEADER, L3Namespace, slots_for

CATALOG_LOG = "catalog.log"
DIR_SETTING = "kv_connector_extra_config['cpkv_l3_dir']"
BYTES_SETTING = "kv_connector_extra_config['cpkv_l3_bytes']"
STOP_COPY = "stop.bin"  # a worker's shard of the host rows, written at its close
STOP_BATCH = 256  # chunks the catalog takes in from the stop copies per write, sync and log append
WRITE_GROUP_BYTES = 64 << 20  # records a worker seals in aligned scratch memory per write group
STOP_SEQUENCE = 0  # the sequence of every stop-copy record (its namespace tells it from a slot's)
STOP_SHARE = 8  # the stop copy's reserve: 1/STOP_SHARE of the slots a worker's share of the cap would hold
WRITING = "writing"  # an empty file in a shard's directory while its worker writes every record it is given
log = logging.getLogger(__name__)


def _random_reader(path: Path) -> int:
    """A buffered read-only descriptor with read-ahead off: a promotion reads one record."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def l3_key(key: bytes) -> int:
    """The L3 key of a vLLM offload key (its chained block hash and group): 64 bits of BLAKE2b."""
    return hash64(key)


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
    instance: str = ""  # vLLM's instance id: the processes of one engine hold the directory together

    @cached_property
    def slot_bytes(self) -> int:
        return int(_cpkv.l3_record_bytes(self.page_bytes))

    @cached_property
    def stop_rows(self) -> int:
        """The records a worker's stop copy holds at most, reserved out of the cap: an eighth of what
        the worker's share of the cap would hold as data slots. Not sized by the host: the data
        slots, and so the log's shape, must not change with ``cpkv_host_blocks`` (a log of another
        shape is not recovered: the restart would be cold)."""
        return slots_for(self.cap_bytes // self.world, self.slot_bytes, 1, slot_order=False) // STOP_SHARE

    @cached_property
    def slots(self) -> int:
        # The cap covers every worker's data files and stop copy (one shard each) and the catalog's log.
        slots = slots_for(self.cap_bytes // self.world - self.stop_rows * self.slot_bytes, self.slot_bytes, 1,
                          slot_order=False)
        if slots < 1:
            raise InvalidArgumentError(
                f"{BYTES_SETTING}={self.cap_bytes} holds no chunk: {self.world} "
                f"worker(s) x {self.slot_bytes} bytes per record plus its log entry")
        return min(slots, int(_cpkv.L3_MAX_SLOTS))

    def namespace(self, shard: int | None, *, stop_copy: bool = False) -> int:
        """The catalog's namespace (``shard=None``), one worker's records' or its stop copy's."""
        part = "catalog" if shard is None else f"{'stop copy of ' if stop_copy else ''}shard {shard} of {self.world}"
        return L3Namespace(model=self.model, dtype=self.dtype, kv_layout=f"vllm offload chunk, {self.layout}, {part}",
                           page_size=self.tokens_per_chunk, cp_size=1, tp_size=self.world,
                           page_bytes=self.page_bytes).id()

    def hold(self) -> InstanceLock:
        """This process's share of its engine's hold on the directory, once the cap is known to fit
        (checked whole by every process: the same answer whichever opened first). Refuses by name."""
        # Without vLLM's instance id (no config in reach), the catalog's namespace names the group:
        # an engine of another model or layout is still refused.
        lock = InstanceLock(self.directory, self.instance or f"namespace-{self.namespace(None):016x}", DIR_SETTING)
        try:
            check_room(self.directory, self.cap_bytes, BYTES_SETTING, tree_bytes(self.directory))
        except BaseException:
            lock.release()
            raise
        return lock

    def shard_dir(self, rank: int) -> Path:
        return self.directory / f"shard-{rank}-of-{self.world}"

    def stop_copy(self, rank: int) -> Path:
        return self.shard_dir(rank) / STOP_COPY

    def writing(self, rank: int) -> Path:
        """Present while worker ``rank`` writes its shard: its worker creates it at open and removes it
        at its first failed write (a removal needs no room on a full disk)."""
        return self.shard_dir(rank) / WRITING

    def data_files(self, rank: int) -> DataFiles:
        return DataFiles(self.shard_dir(rank), self.slots, self.slot_bytes)

    def slots_per_file(self) -> int:
        return self.data_files(0).per_file

    def where(self, slot: int) -> tuple[int, int]:
        """(data file index, byte offset) of ``slot`` (the same in every shard)."""
        return self.data_files(0).where(slot)


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
        self._log: IndexLog | None = None
        self._hold = geometry.hold()  # before the log is read or truncated: no other engine's
        existed = path.exists()
        try:
            self._open_log(path)
        except BaseException:  # what this open created goes again; the directory is free for a retry
            if self._log is not None:
                self._log.close()
                self._log = None
            if not existed:
                path.unlink(missing_ok=True)
            self._hold.release()
            raise
        # What the workers' probe of the same directory finds (their writes' mode), for stats().
        self.io_mode, self.io_reason = probe_direct(path)
        self._next_batch = 1
        self.pending: dict[int, SpillBatch] = {}  # placed, not yet acknowledged by every worker
        self._uncommitted: set[int] = set()  # keys of pending batches: not readable yet
        self.counters = {"spilled": 0, "not_spilled": 0, "committed": 0, "lookups": 0, "hits": 0, "verified": 0,
                         "corrupt_dropped": 0, "promoted": 0, "no_host_room": 0, "compactions": 0,
                         "stop_spilled": 0, "stop_unproven": 0}
        self.rejects: dict[str, int] = {}
        self.stopped: str | None = None  # why no more chunks go to disk (an I/O error, here or on a worker)
        self._inflight = 0  # checks started and not yet finished
        self._idle = threading.Condition()
        self._checks: queue.SimpleQueue[tuple[int, int, int] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[int, int, str | None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._check_loop, name="cpkv-l3-check", daemon=True)
        self._thread.start()

    def _open_log(self, path: Path) -> None:
        slot_bytes = self.geometry.slot_bytes
        self.index, report, valid = _cpkv.L3Index.recover(self.slots, 1, [read_log(path)], self.namespace, slot_bytes)
        self.recovered = int(report["kept"])
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._log = IndexLog(path, fd, self.namespace, slot_bytes, self.slots, valid[0])

    # -- spills ---------------------------------------------------------------------------------

    def spill(self, keys: Sequence[int], rows: Sequence[int], protected: Collection[int] = ()) -> SpillBatch | None:
        """Places chunks leaving the host (the ones not on disk yet); returns their batch.
        ``protected``: chunks a load has yet to read from disk. They are used first, so the index's
        least-recently-used choice cannot take their slots, and the batch is cut to the slots left."""
        new = [(k, r) for k, r in zip(keys, rows) if self.index.peek(k) is None]
        if self.stopped is not None:
            self.counters["not_spilled"] += len(new)
            return None
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
        their log entries are appended and synced. When a worker has stopped writing (its
        :meth:`L3Geometry.writing` file is gone: removed before it reported the job) or the append
        fails, they are not logged, and the tier stops (:meth:`stop`)."""
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
        assert self._log is not None, "the catalog is closed"
        failed = self._stopped_shard()
        if failed is None:
            try:
                self._log.append(entries)  # whole or nothing: a failed append leaves the log as it was
            except OSError as err:
                failed = f"its log append failed: {errno_name(err)} ({err.strerror})"
        if failed is not None:
            for key, _, _, _ in entries:
                self.index.drop(key)  # never logged: no tombstone needed
            self.stop(failed)
            return
        self.counters["committed"] += len(entries)
        if self._log.due:
            try:
                self._compact()
            except OSError as err:  # the log is still the one before, whole
                self.stop(f"its log compaction failed: {errno_name(err)} ({err.strerror})")

    def _stopped_shard(self) -> str | None:
        for rank in range(self.geometry.world):
            if not self.geometry.writing(rank).exists():
                return f"worker rank {rank} stopped writing its shard (its log names the error)"
        return None

    def stop(self, reason: str) -> None:
        """No more chunks go to disk, on any worker: nothing more is placed (every worker writes only
        what the catalog places) and the placements not logged yet are forgotten. The chunks already
        logged are still found, checked and served. Warned once, naming the directory."""
        if self.stopped is not None:
            return
        self.stopped = reason
        self.forget_pending()
        log.warning("cpkv L3 in %s takes no more chunks: %s", self.geometry.directory, reason)

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
        assert self._log is not None, "the catalog is closed"
        if self.stopped is not None:
            return  # a lost tombstone costs a counted miss after a restart, never a wrong page
        try:
            self._log.append_tombstone(tombstone)
        except OSError as err:
            self.stop(f"its log append failed: {errno_name(err)} ({err.strerror})")

    def _check_loop(self) -> None:
        g = self.geometry
        namespaces = [g.namespace(r) for r in range(g.world)]
        readers: dict[tuple[int, int], int] = {}
        while True:
            item = self._checks.get()
            if item is None:
                for fd in readers.values():
                    os.close(fd)
                return
            key, slot, sequence = item
            reason = None
            file, offset = g.where(slot)
            for rank in range(g.world):
                try:
                    if (rank, file) not in readers:  # opened once: the workers create their files
                        readers[(rank, file)] = _random_reader(g.data_files(rank).path(file))
                    record = np.frombuffer(os.pread(readers[(rank, file)], g.slot_bytes, offset), dtype=np.uint8)
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
        """Rewrites the log as its live (logged) entries."""
        assert self._log is not None, "the catalog is closed"
        self._log.compact([(key, sequence, slot, self.geometry.page_bytes)
                           for key, slot, sequence in self.index.entries() if key not in self._uncommitted])
        self.counters["compactions"] += 1

    # -- the clean stop ---------------------------------------------------------------------------

    def spill_at_stop(self, chunks: Sequence[tuple[int, int]]) -> int:
        """At a clean stop, after every worker closed: takes in the chunks (L3 key, host row) the host
        still holds, oldest first, and those of spills no worker acknowledged, from the workers' stop
        copies (the newest ``slots`` of them when there are more).
        A chunk is placed only when every worker's stop copy holds a good record of that very key;
        its records are written into the data files and synced before its log entry. Returns the
        chunks logged; ``l3_stop_unproven`` counts the ones no stop copy proved, ``l3_not_spilled``
        the ones full stop copies had no room for (their reserve, ``L3Geometry.stop_rows``)."""
        g = self.geometry
        unacknowledged = [(k, r) for b in self.carried() for k, r in zip(b.keys, b.rows.tolist())]
        self.forget_pending()  # their jobs never completed: placed again below if a stop copy proves them
        wanted, seen = [], set()
        for key, _ in [*unacknowledged, *chunks]:
            if key not in seen and self.index.peek(key) is None:
                seen.add(key)
                wanted.append(key)
        copies: list[int] = []
        data: dict[tuple[int, int], int] = {}
        logged = 0
        try:
            if self.stopped is not None:
                self.counters["not_spilled"] += len(wanted)
                return 0
            try:
                copies = [os.open(g.stop_copy(rank), os.O_RDONLY) for rank in range(g.world)]
            except FileNotFoundError:  # a worker that did not close (or closed after this)
                self.counters["stop_unproven"] += len(wanted)
                return 0
            at = [_stop_copy_keys(fd, g) for fd in copies]  # per worker: key -> its record's offset
            full = all(len(keys) == g.stop_rows for keys in at)
            present = []
            for key in wanted:
                if all(key in keys for keys in at):
                    present.append(key)
                elif full and not any(key in keys for keys in at):
                    self.counters["not_spilled"] += 1  # beyond the reserve on every worker
                else:
                    self.counters["stop_unproven"] += 1
            if len(present) > self.slots:  # the cap holds fewer: keep the most recently placed
                self.counters["not_spilled"] += len(present) - self.slots
                present = present[len(present) - self.slots:]
            stop_namespaces = [g.namespace(r, stop_copy=True) for r in range(g.world)]
            namespaces = [g.namespace(r) for r in range(g.world)]
            for start in range(0, len(present), STOP_BATCH):
                proven: dict[int, list[np.ndarray]] = {}
                for key in present[start:start + STOP_BATCH]:
                    records = []
                    for rank, fd in enumerate(copies):
                        record = np.frombuffer(bytearray(os.pread(fd, g.slot_bytes, at[rank][key])), dtype=np.uint8)
                        if _cpkv.l3_check(record, stop_namespaces[rank], key, STOP_SEQUENCE, g.page_bytes) is not None:
                            break
                        records.append(record)
                    if len(records) == g.world:
                        proven[key] = records
                    else:
                        self.counters["stop_unproven"] += 1
                batch = self.spill(list(proven), [0] * len(proven))  # rows unused: the catalog writes
                if batch is None:
                    continue
                touched = set()
                for key, slot, sequence in zip(batch.keys, batch.slots, batch.sequences):
                    file, offset = g.where(slot)
                    for rank, record in enumerate(proven[key]):
                        _cpkv.l3_seal(record, namespaces[rank], key, sequence, g.page_bytes)
                        if (rank, file) not in data:
                            data[(rank, file)] = os.open(g.data_files(rank).path(file), os.O_WRONLY)
                        write_fully(data[(rank, file)], [record], offset)
                        touched.add((rank, file))
                for where in sorted(touched):
                    os.fdatasync(data[where])
                self.commit([batch.id])  # every record of the batch is on disk: log it
                if self.stopped is not None:
                    break
                logged += len(batch.keys)
        except OSError as err:  # placed, not logged: forgotten by the stop
            self.stop(f"its stop spill failed: {errno_name(err)} ({err.strerror})")
        finally:
            for fd in [*copies, *data.values()]:
                os.close(fd)
            for rank in range(g.world):
                g.stop_copy(rank).unlink(missing_ok=True)
            self.counters["stop_spilled"] += logged
        return logged

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"l3_{k}": v for k, v in self.counters.items()}
        out.update({"l3_slots": self.slots, "l3_resident": len(self.index), "l3_recovered": self.recovered,
                    "l3_pending_batches": len(self.pending), "l3_rejects": dict(self.rejects),
                    "l3_io": self.io_mode, "l3_io_reason": self.io_reason,
                    "l3_digest": int(self.index.digest()), "l3_stopped": self.stopped})
        return out

    @property
    def closed(self) -> bool:
        return self._log is None

    def close(self) -> None:
        self._checks.put(None)
        self._thread.join(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None
        self._hold.release()


class L3Shard:
    """One worker's data files: it writes the spills and reads the fills the specs carry, its own
    shard of each chunk only."""

    def __init__(self, geometry: L3Geometry, rank: int) -> None:
        self.geometry = geometry
        self.rank = rank
        self.namespace = geometry.namespace(rank)
        self.directory = geometry.shard_dir(rank)
        self._fds: list[int] = []
        self._read_fds: list[int] = []
        self._hold = geometry.hold()  # before anything in the directory changes: no other engine's
        created: list[Path] = []
        try:
            self._open(created)
        except BaseException:  # what this open created goes again
            self.close()
            for path in reversed(created):
                if path.is_dir():
                    path.rmdir()
                else:
                    path.unlink(missing_ok=True)
            raise
        self.applied_upto = 0  # the last batch id written
        self.counters = {"pages_written": 0, "pages_read": 0, "stop_copied": 0, "pages_not_written": 0}
        self.stopped: str | None = None  # why this worker writes no more records (its first failed write)
        # host row -> (the L3 key of the chunk this worker last put there by a store or a fill it
        # ran, that job's number, the chunk's place in the job): what its stop copy seals each row
        # with, and the order in which it chooses rows
        self.held: dict[int, tuple[int, int, int]] = {}
        self._jobs = 0

    def _open(self, created: list[Path]) -> None:
        geometry, rank = self.geometry, self.rank
        if not self.directory.exists():
            self.directory.mkdir()
            created.append(self.directory)
        # A stop copy the last life's catalog never took in goes before the data files may grow.
        geometry.stop_copy(rank).unlink(missing_ok=True)
        files = geometry.data_files(rank)
        files.allocate(created)
        # Writes O_DIRECT where the file system takes it (else buffered, the reason in stats());
        # reads buffered with no read-ahead: see read().
        self._scratch = AlignedScratch()
        self.mode, self.mode_reason = probe_direct(files.path(0), self._scratch)
        direct = os.O_DIRECT if self.mode == "o_direct" else 0
        for i in range(files.count):  # one by one: a failure part way closes the ones opened
            self._fds.append(os.open(files.path(i), os.O_RDWR | direct))
            self._read_fds.append(_random_reader(files.path(i)))
        for stale in files.stale():
            stale.unlink(missing_ok=True)
        writing = geometry.writing(rank)
        if not writing.exists():
            os.close(os.open(writing, os.O_WRONLY | os.O_CREAT, 0o644))
            created.append(writing)

    def note_store(self, rows: np.ndarray, keys: Sequence[int], released: np.ndarray) -> None:
        """A store ran: the rows its eviction released hold no chunk of this worker's any more
        (their spills are written), then ``rows[i]`` holds ``keys[i]``."""
        for row in released.tolist():
            self.held.pop(row, None)
        self._note(np.asarray(rows).tolist(), keys)

    def note_fills(self, fills: Sequence[Any]) -> None:
        """A load's fills ran (from L3 or the cluster: each names a ``row`` and its chunk's ``key``):
        each fill's row holds its chunk."""
        self._note([f.row for f in fills], [f.key for f in fills])

    def _note(self, rows: Sequence[int], keys: Sequence[int]) -> None:
        self._jobs += 1
        for place, (row, key) in enumerate(zip(rows, keys)):
            self.held[row] = (key, self._jobs, place)

    def stop_copy_rows(self) -> list[tuple[int, int]]:
        """(host row, L3 key) of the rows the stop copy holds: the chunks of the most recent jobs
        first, each job's in its own order (a prefix before its continuation), ``stop_rows`` at most."""
        newest = sorted(self.held.items(), key=lambda item: (-item[1][1], item[1][2]))
        return [(row, key) for row, (key, _, _) in newest[:self.geometry.stop_rows]]

    def write_stop_copy(self, pages_of: Any) -> int:
        """At this worker's close: its shard of the rows ``stop_copy_rows`` names, one sealed record
        each, back to back in ``stop.bin`` (at most ``stop_rows`` records: the reserve the cap keeps
        for them; not synced: the catalog checks, rewrites and syncs what it takes in). Written even
        when empty: the catalog tells a worker that closed from one that did not. A worker that has
        stopped writing, or whose copy fails (a full disk), leaves none: the catalog then takes in
        nothing. Returns the rows written."""
        g = self.geometry
        path = g.stop_copy(self.rank)
        if self.stopped is not None:
            path.unlink(missing_ok=True)
            return 0
        namespace = g.namespace(self.rank, stop_copy=True)
        chosen = self.stop_copy_rows()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for start in range(0, len(chosen), STOP_BATCH):
                    part = chosen[start:start + STOP_BATCH]
                    pages = pages_of(np.asarray([row for row, _ in part], dtype=np.int64))
                    records = np.empty(len(part) * g.slot_bytes, dtype=np.uint8)
                    _cpkv.l3_seal_records(records, list(pages), namespace, [key for _, key in part],
                                          [STOP_SEQUENCE] * len(part), g.page_bytes)
                    write_fully(fd, [records], start * g.slot_bytes)
            finally:
                os.close(fd)
        except OSError as err:
            path.unlink(missing_ok=True)
            self._stop(err, "stop copy")
            return 0
        self.counters["stop_copied"] += len(chosen)
        return len(chosen)

    def write(self, batches: Sequence[SpillBatch], pages_of: Any) -> None:
        """Writes the batches not written yet, in id order, then syncs: ``pages_of(rows)`` gives
        uint8 ``[len(rows), page_bytes]`` of host rows (read before any of them is written again).
        Records are sealed in page-aligned scratch memory and written a run of consecutive slots at
        a time (O_DIRECT where the file system takes it: spills never fill the page cache). A failed
        write or sync stops this worker's writes (:meth:`_stop`); the job goes on."""
        g = self.geometry
        per_group = max(1, WRITE_GROUP_BYTES // g.slot_bytes)  # scratch is sized by a group, not a batch
        touched: set[int] = set()
        for batch in batches:
            if batch.id <= self.applied_upto:
                continue  # a gap below is a batch a cache reset forgot: never carried again
            if self.stopped is None:
                try:
                    self._write_batch(batch, pages_of, per_group, touched)
                except OSError as err:
                    self._stop(err, "write")
            if self.stopped is not None:
                self.counters["pages_not_written"] += len(batch.keys)
            self.applied_upto = batch.id
        if self.stopped is None:
            try:
                for file in sorted(touched):
                    os.fdatasync(self._fds[file])
            except OSError as err:
                self._stop(err, "sync")

    def _write_batch(self, batch: SpillBatch, pages_of: Any, per_group: int, touched: set[int]) -> None:
        g = self.geometry
        pages = pages_of(batch.rows)
        order = sorted(range(len(batch.keys)), key=lambda i: batch.slots[i])
        for first in range(0, len(order), per_group):
            group = order[first:first + per_group]
            _cpkv.l3_seal_records(self._scratch.take(len(group) * g.slot_bytes), [pages[i] for i in group],
                                  self.namespace, [batch.keys[i] for i in group],
                                  [batch.sequences[i] for i in group], g.page_bytes)
            for start, stop in slot_runs([batch.slots[i] for i in group], g.slots_per_file()):
                file, offset = g.where(batch.slots[group[start]])
                touched.add(file)
                write_fully(self._fds[file], [self._scratch.view(start * g.slot_bytes, stop * g.slot_bytes)], offset)
        self.counters["pages_written"] += len(batch.keys)

    def _stop(self, err: OSError, what: str) -> None:
        """This worker's first failed write (a full disk, an I/O error): it writes nothing more, and
        removes its :meth:`L3Geometry.writing` file before vLLM hears of the job, so the catalog logs
        none of the job's records and stops placing chunks for every worker (:meth:`L3Catalog.stop`).
        vLLM's connector asserts that a worker's job succeeded: the job itself (the host copy) goes on."""
        if self.stopped is not None:
            return
        self.stopped = f"rank {self.rank}'s {what} failed: {errno_name(err)} ({err.strerror})"
        self.geometry.writing(self.rank).unlink(missing_ok=True)
        log.warning("cpkv L3 shard %s writes no more records: %s", self.directory, self.stopped)

    def read(self, fill: Fill) -> np.ndarray:
        """The checked payload of a promoted chunk. The scheduler checked this record before it
        answered HIT and no placement reuses its slot until the load ran, so a failure here is
        the disk changing under a reader: raised, never served. Buffered on purpose: the
        scheduler's check has just read this record, so it comes from the page cache (one disk
        read per chunk per node, ``tests_vllm/l3_read_io.py``); dropped from the cache afterwards."""
        g = self.geometry
        file, offset = g.where(fill.slot)
        buf = bytearray(g.slot_bytes)
        got = os.preadv(self._read_fds[file], [buf], offset)
        os.posix_fadvise(self._read_fds[file], offset, g.slot_bytes, os.POSIX_FADV_DONTNEED)
        record = np.frombuffer(buf, dtype=np.uint8)[:got]
        reason = _cpkv.l3_check(record, self.namespace, fill.key, fill.sequence, g.page_bytes)
        if reason is not None:
            raise InvalidArgumentError(f"L3 record of key {fill.key:#x} at slot {fill.slot} failed its check on "
                                       f"the worker after the scheduler's check passed: {reason}")
        self.counters["pages_read"] += 1
        return record[:g.page_bytes]

    def stats(self) -> dict[str, Any]:
        return {**{f"l3_{k}": v for k, v in self.counters.items()}, "l3_io": self.mode,
                "l3_io_reason": self.mode_reason, "l3_stopped": self.stopped}

    def close(self) -> None:
        for fd in [*self._fds, *self._read_fds]:
            os.close(fd)
        self._fds = []
        self._read_fds = []
        self._hold.release()


def _stop_copy_keys(fd: int, g: L3Geometry) -> dict[int, int]:
    """key -> byte offset of the first record naming it, over the first ``stop_rows`` records of a
    stop copy (a key read here is a candidate: its record is checked in full before use)."""
    out: dict[int, int] = {}
    key_at = _cpkv.L3_RECORD_KEY_AT
    header_at = g.slot_bytes - HEADER  # a record's header is its last bytes
    for i in range(g.stop_rows):
        header = os.pread(fd, HEADER, i * g.slot_bytes + header_at)
        if len(header) < HEADER:
            break
        out.setdefault(int.from_bytes(header[key_at:key_at + 8], "little"), i * g.slot_bytes)
    return out
