"""Where a replay rank runs: its tensors' device, its compose group, its clock and its byte check.

``--device cpu``: pools in shared memory (:class:`~cpkv.compose.ShmGroup`), synchronous copies.
``--device cuda``: pools in GPU memory shared over CUDA IPC (:class:`~cpkv.compose.CudaIpcGroup`,
the Triton gather, gloo for control), the slab pinned, backups and load-backs on the controller's
side streams. Ranks share the GPUs: rank ``r`` runs on GPU ``r % gpus``, so one per GPU when there
are enough, several per GPU when not.

The device path never blocks the host inside a forward. Its timings are events on the caller's
stream and its byte check counts wrong rows on the device; both are read once per forward, after
the one synchronisation that ends its layers (:meth:`ReplayClock.sync_forward`). That synchronisation is
also what orders every peer's gathers of this forward before any rank's writes in the next: the
forward's commit all-reduce follows it on every rank, and pool rows are rewritten (new KV,
load-backs) only after that all-reduce.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cpkv.errors import InvalidArgumentError
from cpkv.replay.kv_rows import kv_rows
from cpkv.replay.options import KV_ROW_MIN_BYTES


def gpu_for_rank(rank: int, world: int, gpus: int) -> int:
    """The GPU of ``rank``: its own when ``world <= gpus``, else shared round robin."""
    if gpus < 1:
        raise InvalidArgumentError("--device cuda: no CUDA device is available here")
    if not 0 <= rank < world:
        raise InvalidArgumentError(f"rank {rank} is not in [0, {world})")
    return rank % gpus


@dataclass(frozen=True)
class ReplayDevice:
    """A rank's device and how it opens its compose group (``open_group(timeout_s)``)."""

    device: Any  # torch.device
    open_group: Callable[[float], Any]


def cpu_device() -> ReplayDevice:
    import torch

    from cpkv.compose import ShmGroup

    return ReplayDevice(torch.device("cpu"), lambda timeout_s: ShmGroup(timeout_s=timeout_s))


def cuda_device(rank: int, world: int) -> ReplayDevice:
    """This rank's GPU made current, and a CUDA IPC group on it (gloo carries its control)."""
    import torch

    from cpkv.compose import CudaIpcGroup

    index = gpu_for_rank(rank, world, torch.cuda.device_count())
    torch.cuda.set_device(index)
    device = torch.device("cuda", index)
    return ReplayDevice(device, lambda timeout_s: CudaIpcGroup(timeout_s=timeout_s, device=device))


def replay_device(name: str, rank: int, world: int) -> ReplayDevice:
    if name == "cuda":
        return cuda_device(rank, world)
    if name == "cpu":
        return cpu_device()
    raise InvalidArgumentError(f"--device {name!r}: cpu or cuda")


class ReplayClock:
    """Times a forward's composes, and the forward, on the caller's stream (device path: timing
    events, read after the forward's one synchronisation) or the host's clock (CPU path)."""

    def __init__(self, streams: Any) -> None:
        self._streams = streams  # the controller's stream ops (CudaStreams or a test's double), or None
        self._spans: list[tuple[Any, Any, int]] = []  # (start, end, bytes) of this forward's composes
        self._forward_started = 0.0
        self.compose_s = 0.0
        self.compose_bytes = 0
        self.forward_s = 0.0

    def start(self) -> Any:
        if self._streams is None:
            return time.perf_counter()
        return self._streams.record(self._streams.current(), timing=True)

    def stop(self, start: Any, nbytes: int) -> None:
        end = time.perf_counter() if self._streams is None else \
            self._streams.record(self._streams.current(), timing=True)
        self._spans.append((start, end, nbytes))

    def begin_forward(self) -> None:
        self._forward_started = time.perf_counter()

    def sync_forward(self) -> None:
        """Waits until the caller's stream has run the forward's layers (device path), then reads
        the composes' times."""
        if self._streams is not None:
            self._streams.synchronize(self._streams.record(self._streams.current()))
        for start, end, nbytes in self._spans:
            self.compose_s += end - start if self._streams is None else self._streams.elapsed_s(start, end)
            self.compose_bytes += nbytes
        self._spans.clear()

    def end_forward(self) -> None:
        """The forward is over (its commit point included)."""
        self.forward_s += time.perf_counter() - self._forward_started


class ExpectedRows:
    """:func:`~cpkv.replay.kv_rows.kv_rows` on the rank's device, for a batch's block ids.

    ``kv_rows(ids, l, p)`` is ``tile(ids | 0 | 0) ^ tile(0 | l | p) ^ ramp``: the second and third
    terms do not depend on the ids, so they are one row per (layer, payload), computed by
    ``kv_rows`` itself once; a forward adds the ids' term once per row size, and each (layer,
    payload) costs one XOR on the device.
    """

    def __init__(self, device: Any, layers: int, row_bytes: list[int]) -> None:
        import torch

        if sys.byteorder != "little":  # the ids' bytes are read as the device holds them
            raise InvalidArgumentError("the replay's byte check needs a little-endian host")
        self._torch, self._device = torch, device
        zero = np.zeros(1, dtype=np.int64)
        self._constant = {(layer, p): torch.from_numpy(kv_rows(zero, layer, p, rb)[0]).to(device)
                          for layer in range(layers) for p, rb in enumerate(row_bytes)}
        self._ids_term: dict[int, Any] = {}

    def set_blocks(self, block_ids: np.ndarray) -> None:
        """The batch's block ids (one per composed slot); uploaded once per forward."""
        torch = self._torch
        ids = torch.from_numpy(np.ascontiguousarray(block_ids, dtype=np.int64)).to(self._device)
        header = torch.zeros(len(ids), KV_ROW_MIN_BYTES, dtype=torch.uint8, device=self._device)
        header[:, :8] = ids.view(torch.uint8).view(len(ids), 8)
        self._header = header
        self._ids_term.clear()

    def rows(self, layer: int, payload: int) -> Any:
        """uint8 ``[slots, row_bytes]``: the expected bytes of every slot for this layer and payload."""
        constant = self._constant[layer, payload]
        row_bytes = constant.shape[0]
        term = self._ids_term.get(row_bytes)
        if term is None:
            reps = -(-row_bytes // KV_ROW_MIN_BYTES)
            term = self._ids_term[row_bytes] = self._header.repeat(1, reps)[:, :row_bytes]
        return term ^ constant


class ByteCheck:
    """Counts composed rows that differ from the expected ones, on the device: read once per forward."""

    def __init__(self, device: Any) -> None:
        import torch

        self._counts = torch.zeros(2, dtype=torch.int64, device=device)  # wrong rows, wrong rows' bytes

    def compare(self, got: Any, expected: Any) -> None:
        wrong = (got != expected).any(dim=1).sum()
        self._counts[0] += wrong
        self._counts[1] += wrong * got.shape[1]

    def take(self) -> tuple[int, int]:
        """(wrong rows, their bytes) since the last call (a host read: call after the forward's sync)."""
        rows, nbytes = (int(v) for v in self._counts.tolist())
        self._counts.zero_()
        return rows, nbytes
