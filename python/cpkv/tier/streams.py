"""How the cache orders its device copies against the engine's work: streams and events.

The controller never blocks the host to order copies. It records an event on one stream and makes
another stream wait on it:

- a backup of layer ``l`` runs on the backup stream after an event recorded on the caller's stream
  when ``backup_layer(l)`` is called (the layer's KV is written by then, in stream order), and marks
  the layer done with an event of its own;
- a load-back runs on the load stream after an event recorded on the caller's stream when ``load``
  is called (kernels of an earlier forward may still read the rows it overwrites), and
  ``LoadHandle.wait(l)`` makes the caller's stream wait on layer ``l``'s event.

:class:`CudaStreams` is the real thing, bound to the pools' device; tests drive the same calls
through a recording double with CPU tensors, so the order is checked without a GPU.
"""

from __future__ import annotations

from typing import Any


class CudaStreams:
    """Streams and events of one CUDA device (the device of the pools, not the current one)."""

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self.device = device

    def new_stream(self, name: str) -> Any:
        return self._torch.cuda.Stream(device=self.device)

    def current(self) -> Any:
        """The caller's stream on the pools' device."""
        return self._torch.cuda.current_stream(self.device)

    def record(self, stream: Any, *, timing: bool = False) -> Any:
        """An event on ``stream`` after its queued work; ``timing`` events can be read by :meth:`elapsed_s`."""
        event = self._torch.cuda.Event(enable_timing=timing)
        event.record(stream)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        """``stream``'s later work waits for ``event`` (on the device; the host goes on)."""
        stream.wait_event(event)

    def on(self, stream: Any) -> Any:
        """Makes ``stream`` (and its device) current for the copies issued in the block."""
        return self._torch.cuda.stream(stream)

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def elapsed_s(self, start: Any, end: Any) -> float:
        """Device time between two completed timing events (the copies or kernels queued between them)."""
        return float(start.elapsed_time(end)) / 1e3

    def device_guard(self) -> Any:
        return self._torch.cuda.device(self.device)


def stream_ops(device: Any) -> CudaStreams | None:
    """The ordering for pools on ``device``: CUDA streams, or None for CPU pools (copies there are
    synchronous native calls)."""
    if getattr(device, "type", "cpu") == "cuda":
        return CudaStreams(device)
    return None
