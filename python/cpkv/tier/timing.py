"""How long the cache's copies took: bytes and seconds per direction, for :meth:`CacheController.stats`.

CPU pools copy synchronously, so a copy's time is the host's. Device pools copy on side streams
that the host never waits for: each copy is bracketed by two timing events on its stream, and the
pair is read once both completed (:meth:`CopyTimes.settle`), never by blocking the host, except
at close. The time is the stream's between the events: the copy itself, not the waits before it.
"""

from __future__ import annotations

import threading
from typing import Any

DIRECTIONS = ("backup", "load")


class CopyTimes:
    """Per direction: bytes copied and nanoseconds spent, counted once a copy's time is known."""

    def __init__(self, streams: Any) -> None:
        self._streams = streams  # CudaStreams (or a test's double); None for CPU pools
        self._lock = threading.Lock()  # the load-back worker adds, the caller settles
        self._pending: list[tuple[str, int, Any, Any]] = []  # (direction, bytes, start, end) on a device
        self._bytes = dict.fromkeys(DIRECTIONS, 0)
        self._ns = dict.fromkeys(DIRECTIONS, 0)

    def add_host(self, direction: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            self._bytes[direction] += nbytes
            self._ns[direction] += round(seconds * 1e9)

    def add_device(self, direction: str, nbytes: int, start: Any, end: Any) -> None:
        """A copy queued between timing events ``start`` and ``end`` of one stream."""
        with self._lock:
            self._pending.append((direction, nbytes, start, end))

    def settle(self, *, wait: bool = False) -> None:
        """Counts every device copy whose end event completed (``wait``: waits for all of them)."""
        with self._lock:
            pending, self._pending = self._pending, []
        later = []
        for direction, nbytes, start, end in pending:
            if wait:
                self._streams.synchronize(end)
            elif not self._streams.done(end):
                later.append((direction, nbytes, start, end))
                continue
            self.add_host(direction, nbytes, self._streams.elapsed_s(start, end))
        with self._lock:
            self._pending[:0] = later

    def counters(self) -> dict[str, int]:
        with self._lock:
            out = {f"{d}_copy_bytes": self._bytes[d] for d in DIRECTIONS}
            out.update({f"{d}_copy_ns": self._ns[d] for d in DIRECTIONS})
            return out
