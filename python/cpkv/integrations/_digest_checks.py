"""The digest-check cadence every engine adapter with replicated ranks shares: every
``cpkv_check_every`` replicated stores, the state at that point of the stream is taken on the
thread that made the store (the same point on every rank) and compared across the ranks on a
thread of its own, so a rank's stores never wait for a slower rank's and the engine's threads
never wait for a collective.

An adapter supplies what one check compares (``check``: its collectives) and keeps the failure:
a :class:`~cpkv.errors.CpkvError` from a check stops the thread, and the adapter's own
``is_broken`` tells this module that no later check may run (every rank has the same error, or
times out on the rank that stopped).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, TypeVar

from cpkv.errors import CpkvError

CHECK_EVERY = 64  # replicated stores between digest checks, unless cpkv_check_every says otherwise
CHECK_EVERY_KEY = "cpkv_check_every"
CHECK_EVERY_HELP = (f"compare the replicated index's digest across the CP ranks every N stores, int >= 1 "
                    f"(default {CHECK_EVERY})")

Point = TypeVar("Point")


class DigestChecks(Generic[Point]):
    """Queues one check every ``every`` stores and runs them in order on one daemon thread.

    ``check(point)`` runs a check of what :meth:`after_store`'s ``take`` captured; ``is_broken()``
    says that the adapter has failed (no later check runs)."""

    def __init__(self, every: int, check: Callable[[Point], None], is_broken: Callable[[], bool], *,
                 name: str = "cpkv-digest-check") -> None:
        self.every = every
        self._check = check
        self._is_broken = is_broken
        self._name = name
        self._queue: queue.Queue[Point | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._queued = self._done = 0

    def after_store(self, stores: int, take: Callable[[], Point]) -> None:
        """Called right after replicated store number ``stores``: at every ``every``-th, ``take()``
        captures this point's state (on the caller's thread) for the checker."""
        if stores % self.every:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        with self._idle:
            self._queued += 1
        self._queue.put(take())

    def _loop(self) -> None:
        while True:
            point = self._queue.get()
            if point is None or self._is_broken():
                return
            try:
                self._check(point)
            except CpkvError:
                return  # the adapter keeps it: every later call raises it
            finally:
                with self._idle:
                    self._done += 1
                    self._idle.notify_all()

    def wait(self, timeout_s: float) -> None:
        """Until every queued check has run, or the adapter has failed, or ``timeout_s`` passed."""
        with self._idle:
            self._idle.wait_for(lambda: self._done >= self._queued or self._is_broken(), timeout=timeout_s)

    def close(self, timeout_s: float) -> None:
        """Stops the thread after the checks already queued (waiting at most ``timeout_s``)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
