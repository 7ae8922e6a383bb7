"""A stand-in for :class:`cpkv.tier.streams.CudaStreams` that runs the controller's device path (its
streams and events) on CPU tensors and records every ordering call, so a test can check who waits
for what, and when."""

from __future__ import annotations

import contextlib
import threading
from typing import Any


class Event:
    def __init__(self, number: int, stream: str) -> None:
        self.number, self.stream = number, stream

    def __repr__(self) -> str:
        return f"Event({self.number} on {self.stream})"


class RecordingStreams:
    """Streams are names ("caller" is the caller's); events are numbered in recording order.

    ``log`` holds ("record", stream, n), ("wait", stream, n), ("on", stream), ("off", stream) and
    ("sync", n); events in ``incomplete`` report not done until synchronised or released.
    """

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.incomplete: set[int] = set()
        self.hold = False  # new events start incomplete (copies still in flight)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._count = 0

    def new_stream(self, name: str) -> str:
        return name

    def current(self) -> str:
        return getattr(self._local, "stream", "caller")

    def record(self, stream: str) -> Event:
        with self._lock:
            self._count += 1
            self.log.append(("record", stream, self._count))
            if self.hold:
                self.incomplete.add(self._count)
            return Event(self._count, stream)

    def wait(self, stream: str, event: Event) -> None:
        with self._lock:
            self.log.append(("wait", stream, event.number))

    @contextlib.contextmanager
    def on(self, stream: str) -> Any:
        previous = self.current()
        self._local.stream = stream
        with self._lock:
            self.log.append(("on", stream))
        try:
            yield
        finally:
            with self._lock:
                self.log.append(("off", stream))
            self._local.stream = previous

    def done(self, event: Event) -> bool:
        return event.number not in self.incomplete

    def synchronize(self, event: Event) -> None:
        with self._lock:
            self.log.append(("sync", event.number))
            self.incomplete.discard(event.number)

    def device_guard(self) -> Any:
        return contextlib.nullcontext()

    def entries(self, kind: str, stream: str | None = None) -> list[tuple]:
        with self._lock:
            return [e for e in self.log if e[0] == kind and (stream is None or e[1] == stream)]
