"""Rate-limited fallback warnings: one per kind per interval, with the count suppressed meanwhile.

A fallback that repeats every tick must not flood the logs (the reference system wrote hundreds
of MB in minutes); every occurrence is still counted, for ``stats()``.
"""

from __future__ import annotations

import logging
import time
from typing import Callable


class RateLimitedLog:
    def __init__(self, interval_s: float, logger: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.counts: dict[str, int] = {}
        self._logger = logger
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, kind: str, message: str) -> bool:
        """Counts one ``kind`` event; logs it unless one was logged within the interval."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False
        suppressed = self._suppressed.pop(kind, 0)
        tail = f" ({suppressed} more suppressed in the last {self.interval_s:g} s)" if suppressed else ""
        self._logger.warning("%s: %s%s", kind, message, tail)
        self._last[kind] = now
        return True
