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
    ("sync", n); events in ``incomplete`` report not done until synchronised or released. As on a
    device, synchronising an event completes everything its stream ran before it: the stream's
    earlier events, and every event it waited for (and, in turn, what those streams ran before).
    Events on a stream in ``held`` start incomplete (that stream is busy until the host
    synchronises it, or a stream that waited for it).
    """

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.incomplete: set[int] = set()
        self.hold = False  # new events start incomplete (copies still in flight)
        self.held: set[str] = set()
        self.timed: set[int] = set()  # events recorded with timing=True
        self._streams: dict[int, str] = {}  # event number -> its stream
        self._history: dict[str, list[tuple[str, int]]] = {}  # per stream: ("record" | "wait", event) in order
        self._position: dict[int, int] = {}  # event number -> its place in its stream's history
        self._done_upto: dict[str, int] = {}  # per stream: how much of its history has completed
        self.elapsed: list[tuple[int, int]] = []  # (start, end) of every elapsed_s call
        self._lock = threading.Lock()
        self._local = threading.local()
        self._count = 0

    def new_stream(self, name: str) -> str:
        return name

    def current(self) -> str:
        return getattr(self._local, "stream", "caller")

    def record(self, stream: str, *, timing: bool = False) -> Event:
        with self._lock:
            self._count += 1
            self.log.append(("record", stream, self._count))
            self._streams[self._count] = stream
            self._position[self._count] = len(self._history.setdefault(stream, []))
            self._history[stream].append(("record", self._count))
            if timing:
                self.timed.add(self._count)
            if self.hold or stream in self.held:
                self.incomplete.add(self._count)
            return Event(self._count, stream)

    def wait(self, stream: str, event: Event) -> None:
        with self._lock:
            self.log.append(("wait", stream, event.number))
            self._history.setdefault(stream, []).append(("wait", event.number))

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
            self._complete(event.number)

    def _complete(self, number: int) -> None:
        """``number`` and everything its stream ran before it have completed."""
        stream = self._streams[number]
        history = self._history[stream]
        end = self._position[number] + 1
        while self._done_upto.get(stream, 0) < end:
            kind, n = history[self._done_upto.get(stream, 0)]
            self._done_upto[stream] = self._done_upto.get(stream, 0) + 1
            if kind == "record":
                self.incomplete.discard(n)
            else:
                self._complete(n)

    def elapsed_s(self, start: Event, end: Event) -> float:
        """A millisecond per event recorded from ``start`` to ``end``: a deterministic stand-in that
        the real thing's contract shares (both events timed and completed, ``end`` after ``start``)."""
        with self._lock:
            if not {start.number, end.number} <= self.timed:
                raise RuntimeError(f"elapsed_s of an event recorded without timing: {start}, {end}")
            if {start.number, end.number} & self.incomplete or end.number < start.number:
                raise RuntimeError(f"elapsed_s({start}, {end}): not both completed, in order")
            self.elapsed.append((start.number, end.number))
            return (end.number - start.number) * 1e-3

    def device_guard(self) -> Any:
        return contextlib.nullcontext()

    def entries(self, kind: str, stream: str | None = None) -> list[tuple]:
        with self._lock:
            return [e for e in self.log if e[0] == kind and (stream is None or e[1] == stream)]
