"""An L3 index log: a checksummed header (namespace, slot bytes, slots) and 32-byte checksummed
entries, appended by one writer and read back by :meth:`cpkv._cpkv.L3Index.recover`.

The one place a log is opened after recovery (started afresh, or cut at its last whole entry),
appended to, and compacted to its live entries. The main job's :class:`~cpkv.tier.l3.store.L3Store`
(one log per rank) and vLLM's catalog (one log per engine) both keep theirs here.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Sequence

from cpkv import _cpkv

LOG_HEADER = _cpkv.L3_LOG_HEADER_BYTES
LOG_ENTRY = _cpkv.L3_LOG_ENTRY_BYTES
# A log is compacted once it holds this many entries per slot of the store.
COMPACT_ENTRIES_PER_SLOT = 2


def read_log(path: Path) -> bytes:
    """A log's bytes, empty when there is none yet."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


class IndexLog:
    """An open log at ``path`` whose first ``valid_bytes`` recovery kept (``0``: no log, or one of
    another namespace or shape, started afresh). ``fd`` is the caller's descriptor on ``path``,
    opened for appending; the log owns it from here."""

    def __init__(self, path: Path, fd: int, namespace: int, slot_bytes: int, slots: int, valid_bytes: int) -> None:
        self.path = path
        self.fd = fd
        self.namespace = namespace
        self.slot_bytes = slot_bytes
        self.slots = slots
        try:
            if valid_bytes == 0:
                os.ftruncate(fd, 0)
                _write_all(fd, _cpkv.l3_log_header(namespace, slot_bytes, slots))
                os.fdatasync(fd)
                self.entries = 0
                self.size = LOG_HEADER
            else:
                if os.fstat(fd).st_size != valid_bytes:
                    os.ftruncate(fd, valid_bytes)  # a torn tail: cut at the last whole entry
                self.entries = (valid_bytes - LOG_HEADER) // LOG_ENTRY
                self.size = valid_bytes
        except BaseException:
            self.close()
            raise

    def append(self, entries: Sequence[tuple[int, int, int, int]]) -> None:
        """Appends and syncs ``(key, sequence, slot, page bytes)`` entries: once this returns, they
        survive a crash. When it raises (a full disk, an I/O error) none of them is in the log."""
        self._append(_cpkv.l3_log_entries(entries), len(entries), sync=True)

    def append_tombstone(self, tombstone: bytes) -> None:
        # Not synced: a lost tombstone costs a counted miss, never a wrong page.
        self._append(tombstone, 1, sync=False)

    def _append(self, data: bytes, count: int, *, sync: bool) -> None:
        """Whole entries or none: a write cut short (a file system that fills part way through one)
        or a failed sync cuts the log back to where it ended, so it never ends in a torn entry that
        would hide every later entry from recovery, and never names a record it did not acknowledge."""
        try:
            _write_all(self.fd, data)
            if sync:
                os.fdatasync(self.fd)
        except BaseException:
            os.ftruncate(self.fd, self.size)  # gives blocks back: never needs room
            raise
        self.size += len(data)
        self.entries += count

    @property
    def due(self) -> bool:
        """Whether the log has grown to its compaction point."""
        return self.entries > COMPACT_ENTRIES_PER_SLOT * self.slots

    def compact(self, live: Sequence[tuple[int, int, int, int]]) -> None:
        """Rewrites the log as ``live`` (temporary file, sync, rename, sync directory)."""
        tmp = self.path.with_suffix(".tmp")
        data = _cpkv.l3_log_header(self.namespace, self.slot_bytes, self.slots) + _cpkv.l3_log_entries(live)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, data)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:  # the log is still the old one, whole; the partial copy goes
            tmp.unlink(missing_ok=True)
            raise
        old, self.fd = self.fd, os.open(self.path, os.O_RDWR | os.O_APPEND)  # appends go to the new log
        os.close(old)
        self.entries = len(live)
        self.size = len(data)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _write_all(fd: int, data: bytes) -> None:
    """Writes all of ``data`` or raises: a short write is retried, and one that writes nothing is ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]
