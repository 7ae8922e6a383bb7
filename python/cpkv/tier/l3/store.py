"""One rank's view of a node's L3 store: data files, its index log, the write order, recovery.

Files in the directory (shared by the node's ranks):

- ``data-N.bin``: preallocated (``posix_fallocate``) data files of whole slots; slot ``s`` lives in
  file ``s // slots_per_file``. Every rank opens every file; a rank writes only the slots of the
  pages it is the writer of (:meth:`cpkv._cpkv.L3Index.writer`), so each page is on disk once per
  node.
- ``index-rR.log``: rank R's log: a checksummed header (namespace, slot bytes, slots) and one
  32-byte checksummed entry per page R wrote (or dropped, a tombstone).
- ``slot-order.bin``: per slot the newest sequence written into it (:mod:`cpkv.tier.l3.order`): the
  ranks' writes into a slot are ordered by placement sequence (an older record never overwrites a
  newer one), and a read of a record not written yet is a transient miss, not a rejection.

**Acknowledged durable** means: the record was written and its data file ``fdatasync``'d, then its
log entry appended and the log ``fdatasync``'d; only then does :meth:`L3Store.put` return it. A
kill -9 at any point leaves either no entry (the page is simply absent after the restart) or an
entry whose record is on disk. Whatever else a slot holds (a torn write, another key placed there
later, a record of another namespace) fails the record check on read: a counted miss, dropped.

Bytes on disk are the data files (fixed at open from the cap) plus the logs, each compacted to its
live entries once it holds twice as many entries as the store has slots, so the total stays
within the cap at every moment, after a crash too (the slot count is chosen so that data files,
every rank's largest log and one compaction's temporary file fit).

A node's ranks must all finish :meth:`L3Store.open` (recovery reads every rank's log) before any
of them writes: the caller puts a barrier after it. Each rank's :meth:`digest` then agrees.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from cpkv import _cpkv
from cpkv.errors import InvalidArgumentError
from cpkv.tier.l3.direct import AlignedScratch, probe_direct, slot_runs, write_fully
from cpkv.tier.l3.directory import check_room, file_bytes
from cpkv.tier.l3.files import DATA_FILE_BYTES, DataFiles
from cpkv.tier.l3.log import COMPACT_ENTRIES_PER_SLOT, LOG_ENTRY, IndexLog, read_log
from cpkv.tier.l3.order import BYTES_PER_SLOT, NOT_WRITTEN, TABLE_NAME, SlotOrder

ALIGN = _cpkv.L3_RECORD_ALIGN
HEADER = _cpkv.L3_HEADER_BYTES
# The most records one pwritev/preadv moves from their own memory (two buffers each, under IOV_MAX).
SPLIT_RECORDS_PER_CALL = max(1, os.sysconf("SC_IOV_MAX") // 2) if hasattr(os, "sysconf") else 512


@dataclass(frozen=True)
class L3Namespace:
    """What a page must share with the server to be served (:func:`cpkv._cpkv.l3_namespace_id`)."""

    model: str
    dtype: str
    kv_layout: str
    page_size: int
    cp_size: int
    tp_size: int
    page_bytes: int

    def id(self) -> int:
        return int(_cpkv.l3_namespace_id(model=self.model, dtype=self.dtype, kv_layout=self.kv_layout,
                                         page_size=self.page_size, cp_size=self.cp_size, tp_size=self.tp_size,
                                         page_bytes=self.page_bytes))


def disk_bytes(directory: str | os.PathLike) -> int:
    """Bytes the directory's files hold on disk (allocated blocks, not lengths). Other ranks share the
    directory, so a file listed may be gone (a compaction's temporary file renamed) before its stat."""
    total = 0
    with os.scandir(os.fspath(directory)) as entries:
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def slots_for(cap_bytes: int, slot_bytes: int, ranks_on_node: int, *, slot_order: bool = True) -> int:
    """The most slots whose data files, logs (each up to its compaction point plus one page) and one
    compaction's temporary file fit in ``cap_bytes``, with the slot order's table
    (:mod:`cpkv.tier.l3.order`) unless ``slot_order`` is False (a store of one writer, as vLLM's
    shards), blocks rounded up."""
    table = BYTES_PER_SLOT if slot_order else 0
    per_slot = slot_bytes + ranks_on_node * COMPACT_ENTRIES_PER_SLOT * LOG_ENTRY + LOG_ENTRY + table
    fixed = (ranks_on_node + 1) * 2 * ALIGN + ALIGN * (cap_bytes // DATA_FILE_BYTES + 2 + (1 if slot_order else 0))
    return max(0, (cap_bytes - fixed) // per_slot)


class L3Store:
    """One rank's handle on a node's L3 store in ``directory``, at most ``cap_bytes`` on disk.

    ``rank`` is this process's rank within the node (``0..ranks_on_node``). ``put`` and ``lookup`` /
    ``drop`` must be called with the same arguments on every rank of every node (they are
    replicated decisions); ``read`` is I/O, done by the key's writer rank.
    """

    def __init__(self, directory: str | os.PathLike, cap_bytes: int, namespace: L3Namespace, *, rank: int = 0,
                 ranks_on_node: int = 1, direct: bool = True, cap_setting: str = "cap_bytes") -> None:
        if not isinstance(namespace, L3Namespace):
            raise InvalidArgumentError(f"namespace must be an L3Namespace, got {type(namespace).__name__}")
        for name, value, low in (("cap_bytes", cap_bytes, 1), ("ranks_on_node", ranks_on_node, 1), ("rank", rank, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidArgumentError(f"{name} must be an int >= {low}, got {value!r}")
        if rank >= ranks_on_node:
            raise InvalidArgumentError(f"rank {rank} is not below ranks_on_node {ranks_on_node}")
        page_bytes = namespace.page_bytes
        if not 1 <= page_bytes <= _cpkv.L3_MAX_PAYLOAD_BYTES:
            raise InvalidArgumentError(f"page_bytes must be in 1..{_cpkv.L3_MAX_PAYLOAD_BYTES}, got {page_bytes}")
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise InvalidArgumentError(f"L3 directory {self.directory} does not exist or is not a directory")
        self.cap_bytes = cap_bytes
        self.namespace = namespace
        self.namespace_id = namespace.id()
        self.page_bytes = page_bytes
        self.rank = rank
        self.ranks_on_node = ranks_on_node
        self.slot_bytes = int(_cpkv.l3_record_bytes(page_bytes))
        self.slots = slots_for(cap_bytes, self.slot_bytes, ranks_on_node)
        if self.slots < 1:
            raise InvalidArgumentError(f"--l3-bytes {cap_bytes} holds no page of {page_bytes} bytes "
                                       f"(a slot takes {self.slot_bytes} bytes plus its log)")
        self.files = DataFiles(self.directory, self.slots, self.slot_bytes)
        self.slots_per_file = self.files.per_file
        # *_in_place: pages moved straight between their own memory and the disk (no copy through scratch).
        self.counters = {"pages_written": 0, "bytes_written": 0, "pages_read": 0, "bytes_read": 0,
                         "pages_written_in_place": 0, "pages_read_in_place": 0,
                         "lookups": 0, "hits": 0, "corrupt_dropped": 0, "compactions": 0,
                         "pages_superseded": 0, "reads_not_written": 0}
        self.rejects: dict[str, int] = {}
        self._scratch = AlignedScratch()
        self._fds: list[int] = []
        self._log: IndexLog | None = None
        self.order: SlotOrder | None = None
        self._pending: list[tuple[int, int, int, int]] = []  # log entries of records not yet synced
        self._own: set[tuple[int, int]] = set()  # (key, sequence) of the records this rank wrote
        self._unsynced: set[int] = set()
        # read_many's raw records (in slot order) and the row of each page it read.
        self.last_records: tuple[np.ndarray, list[int]] = (np.empty(0, dtype=np.uint8), [])
        self.mode = "buffered"
        self.mode_reason = ""
        self._open(direct, cap_setting)

    # --- opening and recovery -------------------------------------------------------------

    def _log_path(self, rank: int) -> Path:
        return self.directory / f"index-r{rank}.log"

    def _own_files(self) -> list[Path]:
        """The files of an L3 store in the directory (of any rank count and size)."""
        return [*self.directory.glob("data-*.bin"), *self.directory.glob("index-r*.log"),
                *self.directory.glob("index-r*.tmp"), *self.directory.glob(TABLE_NAME)]

    def _open(self, direct: bool, cap_setting: str) -> None:
        # Nothing is allocated before the cap is known to fit; what a failed open created goes again.
        reusable = sum(file_bytes(p) for p in self._own_files())
        check_room(self.directory, self.cap_bytes, cap_setting, reusable)
        created: list[Path] = []
        try:
            self._open_files(direct, created)
        except BaseException:
            self._release()
            for path in created:
                path.unlink(missing_ok=True)
            raise

    def _open_files(self, direct: bool, created: list[Path]) -> None:
        started = time.perf_counter()
        files = self.files.count
        if self.rank == 0:  # files of a store of more slots or more ranks: given back before allocating
            for stale in self._own_files():
                kind, _, index = stale.stem.partition("-")
                number = index.removeprefix("r")
                if number.isdigit() and int(number) >= (files if kind == "data" else self.ranks_on_node):
                    stale.unlink(missing_ok=True)
        self.files.allocate(created)
        stale_tmp = self._log_path(self.rank).with_suffix(".tmp")
        stale_tmp.unlink(missing_ok=True)  # a compaction cut short by a crash
        self.mode, self.mode_reason = self._probe_direct() if direct else ("buffered", "O_DIRECT not asked for")
        extra = os.O_DIRECT if self.mode == "o_direct" else 0
        for i in range(files):  # one by one: a failure part way closes the ones opened (_release)
            self._fds.append(os.open(self.files.path(i), os.O_RDWR | extra))
        logs = [read_log(self._log_path(r)) for r in range(self.ranks_on_node)]
        self.index, report, valid = _cpkv.L3Index.recover(self.slots, self.ranks_on_node, logs, self.namespace_id,
                                                           self.slot_bytes)
        # This rank's own records: what its log names (a record's writer logs it; compaction and
        # tombstones go to the log of the rank that wrote the record).
        own_index, _, _ = _cpkv.L3Index.recover(self.slots, self.ranks_on_node, [logs[self.rank]], self.namespace_id,
                                                self.slot_bytes)
        self._own = {(key, sequence) for key, _, sequence in own_index.entries()}
        self.recovery: dict[str, float] = dict(report)
        own = self._log_path(self.rank)
        self._log = IndexLog(own, self._create(own, created, os.O_APPEND), self.namespace_id, self.slot_bytes,
                             self.slots, valid[self.rank])
        # Rank 0 rewrites the node's slot order from the recovered index (before any rank writes).
        if not (self.directory / TABLE_NAME).exists():
            created.append(self.directory / TABLE_NAME)
        self.order = SlotOrder(self.directory, self.slots, self.index.entries() if self.rank == 0 else None)
        self.recovery["recovery_s"] = time.perf_counter() - started

    @staticmethod
    def _create(path: Path, created: list[Path], extra: int = 0) -> int:
        """Opens ``path`` read-write, creating it (then noted in ``created``) when absent."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | extra, 0o644)
        except FileExistsError:
            return os.open(path, os.O_RDWR | extra)
        created.append(path)
        return fd

    def _probe_direct(self) -> tuple[str, str]:
        """O_DIRECT when the file system takes an aligned O_DIRECT read; otherwise buffered I/O, and why."""
        return probe_direct(self.directory / "data-0.bin", self._scratch)

    def close(self) -> None:
        """A clean stop: everything written is made durable first (the descriptors are closed
        whatever that flush raises)."""
        try:
            if self._fds and self._log is not None:
                self.flush()
        finally:
            self._release()

    def _release(self) -> None:
        """Closes the descriptors, nothing made durable (an open that failed, a dropped store)."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.order is not None:
            self.order.close()
            self.order = None

    def __del__(self) -> None:
        # Dropped without close(): no descriptor leaks (records not yet logged are not acknowledged).
        if hasattr(self, "_fds"):
            self._release()

    def __enter__(self) -> L3Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the replicated decisions -----------------------------------------------------------

    def digest(self) -> int:
        return int(self.index.digest())

    def lookup(self, key: int) -> tuple[int, int] | None:
        """(slot, sequence) of ``key`` (a use), or None: a replicated decision, on every rank."""
        self.counters["lookups"] += 1
        found = self.index.lookup(key)
        self.counters["hits"] += found is not None
        return found

    def drop(self, key: int, reason: str = "dropped") -> None:
        """Forget ``key`` (its record failed a check): replicated; the writer rank logs a tombstone."""
        found = self.index.peek(key)
        tombstone = self.index.drop(key)
        if tombstone is not None and found is not None:
            self.counters["corrupt_dropped"] += 1
            self.rejects[reason] = self.rejects.get(reason, 0) + 1
            if (key, found[1]) in self._own:
                self._own.discard((key, found[1]))
                assert self._log is not None, "the store is closed"
                self._log.append_tombstone(tombstone)

    # --- I/O ------------------------------------------------------------------------------

    def _where(self, slot: int) -> tuple[int, int]:
        file, offset = self.files.where(slot)
        return self._fds[file], offset

    def put(self, pages: Sequence[tuple[int, np.ndarray | bytes | None]], *, durable: bool = True,
            writers: Sequence[int] | None = None) -> list[tuple[int, int, int, int | None, int]]:
        """Places a batch of pages leaving the host slab (replicated) and writes this rank's share.
        Returns the placements ``(key, slot, sequence, evicted, writer)``. With ``durable`` (the
        default) it returns once this rank's pages are durable (acknowledged); with ``durable=False``
        the records are written and readable at once and their log entries wait for the next
        :meth:`flush` (group commit: one pair of syncs for many batches).

        ``writers`` (one node rank per page, the same on every rank) replaces the index's writer rule
        (:meth:`cpkv._cpkv.L3Index.writer`) for this batch: a caller whose bytes are only on one rank
        (the SGLang backend: a slab row's only writer copies its victim out) names that rank. A page
        given as None is placed but not written (its writer has no bytes for it): its slot keeps an
        older record, which fails the key and sequence check, a counted miss.

        Writes into a slot are ordered by sequence (:mod:`cpkv.tier.l3.order`): a record of this rank
        whose slot another rank has already written a newer placement into is discarded, not logged
        (``pages_superseded``); the index evicted it at that newer placement."""
        keys = [k for k, _ in pages]
        payloads: dict[int, np.ndarray | None] = {}
        for key, data in pages:
            if data is None:  # placed like any page; this rank has no bytes for it and writes nothing
                payloads[key] = None
                continue
            view = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
                else np.asarray(data).reshape(-1).view(np.uint8)
            if view.nbytes != self.page_bytes:
                raise InvalidArgumentError(f"page {key:#x} has {view.nbytes} bytes, the store's pages have "
                                           f"{self.page_bytes}")
            payloads[key] = view
        if writers is not None:
            if len(writers) != len(keys) or any(not 0 <= w < self.ranks_on_node for w in writers):
                raise InvalidArgumentError(f"writers must name a rank below {self.ranks_on_node} for each of the "
                                           f"{len(keys)} pages, got {list(writers)!r}")
            chosen = dict(zip(keys, writers))
        placed = self.index.place(keys)
        if writers is not None:
            placed = [(k, slot, seq, evicted, chosen[k]) for k, slot, seq, evicted, _ in placed]
        mine = sorted((p for p in placed if p[4] == self.rank and payloads[p[0]] is not None), key=lambda p: p[1])
        assert self.order is not None, "the store is closed"
        for key, slot, sequence, _, writer in placed:
            if writer == self.rank and payloads[key] is None:
                self.order.give_up(slot, sequence)
        if mine:
            self._write_records(mine, payloads)
        if durable:
            self.flush()
        return placed

    def _in_place(self, page: np.ndarray) -> bool:
        """Whether ``page`` (a whole record payload or a row of them) can be read or written where it
        lies: whole blocks, and block-aligned memory under O_DIRECT."""
        return self.page_bytes % ALIGN == 0 and (self.mode != "o_direct" or page.ctypes.data % ALIGN == 0)

    def _write_records(self, mine: list, payloads: dict) -> None:
        sources = [payloads[key] for key, *_ in mine]
        in_place = all(self._in_place(page) for page in sources)
        kept = self._write_split(mine, sources) if in_place else self._write_whole(mine, sources)
        if not all(kept):
            self.counters["pages_superseded"] += kept.count(False)
            mine = [p for p, k in zip(mine, kept) if k]
        self.counters["pages_written_in_place"] += len(mine) if in_place else 0
        self._pending.extend((key, sequence, slot, self.page_bytes) for key, slot, sequence, _, _ in mine)
        self._own.update((key, sequence) for key, _, sequence, _, _ in mine)
        self.counters["pages_written"] += len(mine)
        self.counters["bytes_written"] += len(mine) * self.page_bytes

    def _write_whole(self, mine: list, sources: list[np.ndarray]) -> list[bool]:
        """Records built whole in aligned scratch (a payload copied in), one write per run of
        consecutive slots, in slot order (:meth:`SlotOrder.write_runs`); per record whether written."""
        _cpkv.l3_seal_records(self._scratch.take(len(mine) * self.slot_bytes), sources, self.namespace_id,
                              [p[0] for p in mine], [p[2] for p in mine], self.page_bytes)
        slots = [p[1] for p in mine]

        def write(start: int, stop: int) -> None:
            fd, offset = self._where(slots[start])
            self._write_at(fd, [self._scratch.view(start * self.slot_bytes, stop * self.slot_bytes)], offset)

        assert self.order is not None
        return self.order.write_runs(slots, [p[2] for p in mine], slot_runs(slots, self.slots_per_file), write)

    def _write_split(self, mine: list, sources: list[np.ndarray]) -> list[bool]:
        """Records written from the pages' own memory: each payload goes to disk from where it lies,
        only its tail (padding and header) is built in scratch; one write per run of consecutive slots,
        in slot order (:meth:`SlotOrder.write_runs`); per record whether written."""
        tail = self.slot_bytes - self.page_bytes
        _cpkv.l3_seal_tails(self._scratch.take(len(mine) * tail), sources, self.namespace_id,
                            [p[0] for p in mine], [p[2] for p in mine], self.page_bytes)
        slots = [p[1] for p in mine]

        def write(start: int, stop: int) -> None:
            fd, offset = self._where(slots[start])
            buffers: list = []
            for i in range(start, stop):
                buffers += (sources[i], self._scratch.view(i * tail, (i + 1) * tail))
            self._write_at(fd, buffers, offset)

        assert self.order is not None
        return self.order.write_runs(slots, [p[2] for p in mine],
                                     slot_runs(slots, self.slots_per_file, SPLIT_RECORDS_PER_CALL), write)

    def _write_at(self, fd: int, buffers: list, offset: int) -> None:
        write_fully(fd, buffers, offset)
        self._unsynced.add(fd)

    def flush(self) -> int:
        """Makes every written record durable, then its log entry: the data files are synced before
        the log names them, so an entry in the log always names a record on disk. Returns the
        number of pages acknowledged."""
        if not self._pending:
            return 0
        # Taken before the syncs: a flush that fails acknowledges none of these records, then or
        # later (a later sync may succeed where this one failed without their bytes being on disk).
        entries, self._pending = self._pending, []
        unsynced, self._unsynced = self._unsynced, set()
        assert self._log is not None, "the store is closed"
        try:
            for fd in unsynced:
                os.fdatasync(fd)
            self._log.append(entries)
        except BaseException:
            self._own.difference_update((key, sequence) for key, sequence, _, _ in entries)  # never compacted in
            raise
        if self._log.due:
            self._compact()
        return len(entries)

    def read_many(self, found: Sequence[tuple[int, int, int]], out: np.ndarray, *,
                  keep_records: bool = False) -> list[str | None]:
        """Reads pages ``(key, slot, sequence)`` (from :meth:`lookup`) into ``out[i]``, one read per run
        of consecutive slots; per page ``None`` when served, else the reason its record failed (its row
        then holds whatever was read): :data:`~cpkv.tier.l3.order.NOT_WRITTEN` when its writer rank had
        not written it yet when the read began (a transient miss: never drop it for that), else a
        rejection. A payload is read straight into its row where the row allows
        (:meth:`_in_place`), else the whole record into scratch and the payload copied out; with
        ``keep_records`` always the latter, and the raw records stay in :attr:`last_records` until this
        store's next read or write (a node's read-staging area publishes them from there:
        :mod:`cpkv.tier.l3.staging`)."""
        if not out.flags.c_contiguous:
            raise InvalidArgumentError("out must be a C-contiguous array (pages are copied into it in place)")
        flat = out.reshape(-1).view(np.uint8)
        if flat.nbytes != len(found) * self.page_bytes:
            raise InvalidArgumentError(f"out holds {flat.nbytes} bytes, {len(found)} pages need "
                                       f"{len(found) * self.page_bytes}")
        order = sorted(range(len(found)), key=lambda i: found[i][1])
        slots = [found[i][1] for i in order]
        reasons: list[str | None] = [None] * len(found)
        split = not keep_records and self._in_place(flat)
        tail = self.slot_bytes - self.page_bytes if split else self.slot_bytes
        buf = self._scratch.take(len(found) * tail)
        if keep_records:
            rows = [0] * len(found)
            for row, i in enumerate(order):
                rows[i] = row
            self.last_records = (buf, rows)
        for start, stop in slot_runs(slots, self.slots_per_file, SPLIT_RECORDS_PER_CALL if split else None):
            fd, offset = self._where(slots[start])
            members = order[start:stop]
            keys, sequences = [found[i][0] for i in members], [found[i][2] for i in members]
            assert self.order is not None, "the store is closed"
            known = self.order.written(slots[start:stop])  # before the read: what was written by then
            if split:
                buffers: list = []
                for k, i in enumerate(members, start):
                    buffers += (flat[i * self.page_bytes:(i + 1) * self.page_bytes], self._scratch.view(k * tail, (k + 1) * tail))
                got = os.preadv(fd, buffers, offset)
                whole = [got >= (k + 1) * self.slot_bytes for k in range(stop - start)]
                run = _cpkv.l3_check_split(buf[start * tail:stop * tail], flat, members, whole, self.namespace_id,
                                           keys, sequences, self.page_bytes)
            else:
                got = os.preadv(fd, [self._scratch.view(start * tail, stop * tail)], offset)
                run = _cpkv.l3_check_into(buf[start * tail:start * tail + got], self.slot_bytes, self.namespace_id,
                                          keys, sequences, self.page_bytes, flat, members)
            for i, reason, written, sequence in zip(members, run, known, sequences):
                reasons[i] = reason if reason is None or written >= sequence else NOT_WRITTEN
            self.counters["reads_not_written"] += sum(reasons[i] == NOT_WRITTEN for i in members)
            served = run.count(None)
            self.counters["pages_read_in_place"] += served if split else 0
            self.counters["pages_read"] += served
            self.counters["bytes_read"] += served * self.page_bytes
        return reasons

    def read(self, key: int, slot: int, sequence: int, out: np.ndarray | None = None) -> np.ndarray | None:
        """The page of ``key`` found at (slot, sequence) by :meth:`lookup`, or None when the record fails
        its check (the reason is returned by :meth:`last_reject` and counted; call :meth:`drop` on every
        rank to forget it, unless it is :data:`~cpkv.tier.l3.order.NOT_WRITTEN`: a transient miss). I/O
        only: no decision changes."""
        fd, offset = self._where(slot)
        buf = self._scratch.take(self.slot_bytes)
        assert self.order is not None, "the store is closed"
        written = int(self.order.written([slot])[0])  # before the read: what was written by then
        got = os.preadv(fd, [self._scratch.view(0, self.slot_bytes)], offset)
        self.last_reject = _cpkv.l3_check(buf[:got], self.namespace_id, key, sequence, self.page_bytes)
        if self.last_reject is not None:
            if written < sequence:
                self.last_reject = NOT_WRITTEN
                self.counters["reads_not_written"] += 1
            return None
        self.counters["pages_read"] += 1
        self.counters["bytes_read"] += self.page_bytes
        page = buf[:self.page_bytes]
        if out is None:
            return page.copy()
        out.reshape(-1).view(np.uint8)[:] = page
        return out

    def get(self, key: int) -> np.ndarray | None:
        """Lookup, read and (on a failed check) drop, for a store of one rank."""
        found = self.lookup(key)
        if found is None:
            return None
        page = self.read(key, *found)
        if page is None and self.last_reject != NOT_WRITTEN:
            self.drop(key, self.last_reject or "dropped")
        return page

    def _compact(self) -> None:
        """Rewrites this rank's log as its live entries (temporary file, sync, rename, sync dir)."""
        entries = [(key, sequence, slot, self.page_bytes) for key, slot, sequence in self.index.entries()
                   if (key, sequence) in self._own]
        self._own = {(key, sequence) for key, sequence, _, _ in entries}
        assert self._log is not None, "the store is closed"
        self._log.compact(entries)
        self.counters["compactions"] += 1

    def stats(self) -> dict:
        out: dict = dict(self.counters)
        out.update({f"index_{k}": v for k, v in dict(self.index.stats()).items()})
        out["mode"] = self.mode
        out["mode_reason"] = self.mode_reason
        out["slots"] = self.slots
        out["cap_bytes"] = self.cap_bytes
        out["disk_bytes"] = disk_bytes(self.directory)
        out["recovered_pages"] = self.recovery["kept"]
        out["recovery_s"] = self.recovery["recovery_s"]
        out["rejects"] = dict(self.rejects)
        return out
