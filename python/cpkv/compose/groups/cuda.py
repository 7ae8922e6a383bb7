"""CudaIpcGroup: one process per rank; pools and stagings shared through CUDA IPC.

Each rank allocates one device buffer per payload (pool plus two stagings),
exchanges its IPC handle at registration (every rank, before any return) and
opens every peer's, so the Triton gather reads peers' rows through a table of
2 * cp device addresses. Same staging protocol as :class:`ShmGroup`
(double-buffered by call parity, one barrier per call).

The barrier depends on the process group's backend:

- NCCL (one GPU per rank): a one-element all-reduce, stream-ordered, so the
  host never waits; a stalled peer surfaces through the NCCL watchdog after the
  process group's timeout (set ``TORCH_NCCL_BLOCKING_WAIT=1`` to get it as an
  exception in the caller).
- gloo (several ranks sharing one GPU, where NCCL refuses to run): synchronise
  this rank's stream, then a monitored barrier with the group's timeout.

A batch the stagings cannot hold raises :class:`~cpkv.errors.FallbackError`:
on CUDA there is no silent fallback to the dense all-reduce, which stays an
explicit call (:meth:`compose_allreduce`).

Devices: ``device`` (default: the current CUDA device) is resolved to ``cuda:N`` once, and every
allocation, copy and kernel launch of the group runs under it, whatever the caller's current device.
A peer's IPC handle is opened in this rank's device context (peer access enabled lazily by the
driver), never in the peer's device index: in one-GPU-per-rank mode that would put the mapping in a
context of the peer's GPU, created in this process, which this rank's kernels cannot use.

Handles travel over gloo: the process group itself when it is gloo, else a gloo group of exactly its
ranks (:func:`~cpkv.runtime.gloo_group.gloo_group_of`), made with the group's timeout.

Importing this module needs neither CUDA nor triton; constructing the group does.
"""

from __future__ import annotations

import inspect
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

from cpkv.compose.groups.base import DistributedGroup, check_current_rows, check_pool, on_every_rank, resolve_device
from cpkv.compose.plan import ComposePlan, PlanCache, PlanKey
from cpkv.errors import FallbackError, InvalidArgumentError
from cpkv.kernels.gather import gather_triton
from cpkv.runtime.gloo_group import gloo_group_of
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, as_timedelta, guarded

_ALIGN = 256
_DESCRIPTOR_CACHE = 64


@dataclass
class _DevicePayload:
    rows: int
    page_shape: tuple[int, ...]
    dtype: Any
    row_bytes: int
    staging_capacity: int
    own: Any  # this rank's allocation (keeps it, and so the peers' mappings, alive)
    pools: list[Any]
    stagings: list[list[Any]]
    tables: list[Any]  # per parity: int64 [2 * cp] device addresses
    addresses: list[list[int]]  # the same, on the host
    calls: int = 0
    descriptors: OrderedDict[tuple[PlanKey, int], tuple[Any, Any]] = field(default_factory=OrderedDict)


class CudaIpcGroup(DistributedGroup):
    """A rank whose peers' device pools are mapped into this process by CUDA IPC."""

    def __init__(self, *, process_group: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S, device: Any = None) -> None:
        import torch
        import torch.distributed as dist

        if not torch.cuda.is_available():
            raise InvalidArgumentError("CudaIpcGroup needs CUDA")
        if not dist.is_initialized():
            raise InvalidArgumentError("CudaIpcGroup needs torch.distributed initialised in every rank")
        self._torch, self._dist, self._pg = torch, dist, process_group
        self.rank = dist.get_rank(process_group)
        super().__init__(dist.get_world_size(process_group))
        self.device = cuda_device(device)
        self.backend = str(dist.get_backend(process_group)).lower()
        self.timeout_s = float(timeout_s)
        self._timeout = as_timedelta(self.timeout_s)
        with torch.cuda.device(self.device):
            self._flag = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._payloads: dict[str, _DevicePayload] = {}
        self.plans = PlanCache()
        # Handles are Python objects: exchanged over gloo whatever the data backend is (made here, on
        # every rank of the group, in the same order).
        self._objects = gloo_group_of(process_group, self.timeout_s)
        self._init_protocol()

    def _agreement_group(self) -> Any:
        return self._objects  # a CPU int64 all-reduce, once per batch, whatever the data backend

    def register_pool(
        self, payload: str, rows: int, page_shape: Sequence[int], dtype: Any, max_current_pages: int
    ) -> Any:
        """Collective: allocates this rank's pool and stagings, maps every peer's; returns the pool."""
        with self._protocol(f"registration of payload {payload!r}"), self._torch.cuda.device(self.device):
            return self._register_pool(payload, rows, page_shape, dtype, max_current_pages)

    def _register_pool(
        self, payload: str, rows: int, page_shape: Sequence[int], dtype: Any, max_current_pages: int
    ) -> Any:
        from torch.multiprocessing.reductions import reduce_tensor

        torch = self._torch
        spec = (payload, int(rows), tuple(int(d) for d in page_shape), str(dtype), int(max_current_pages))
        row_bytes = math.prod(spec[2]) * torch.empty((), dtype=dtype).element_size()
        capacity = max_current_pages + 1
        pool_bytes = _round_up(rows * row_bytes)
        staging_bytes = _round_up(capacity * row_bytes)
        own = torch.zeros(pool_bytes + 2 * staging_bytes, dtype=torch.uint8, device=self.device)
        handle = reduce_tensor(own)
        gathered: list[Any] = [None] * self.cp_size
        guarded("pool registration", self.rank, -1, self.timeout_s,
                lambda: self._dist.all_gather_object(
                    gathered, (spec, payload in self._payloads, handle), group=self._objects))
        # Decided from the gathered values only, so every rank raises (or not) alike.
        specs = [s for s, _, _ in gathered]
        if any(s != spec for s in specs) or any(again for _, again, _ in gathered):
            raise on_every_rank(InvalidArgumentError(
                f"payload {payload!r}: ranks registered different (or repeated) pools: {specs}"))
        index = self.device.index
        buffers = [own if r == self.rank else open_peer_buffer(fn, args, index)
                   for r, (_, _, (fn, args)) in enumerate(gathered)]
        pools = [b[: rows * row_bytes].view(rows, row_bytes) for b in buffers]
        stagings = [
            [b[start : start + capacity * row_bytes].view(capacity, row_bytes)
             for start in (pool_bytes, pool_bytes + staging_bytes)]
            for b in buffers
        ]
        addresses = [[t.data_ptr() for t in pools] + [s[parity].data_ptr() for s in stagings] for parity in (0, 1)]
        tables = [torch.tensor(a, dtype=torch.int64, device=self.device) for a in addresses]
        self._payloads[payload] = _DevicePayload(
            rows, spec[2], dtype, row_bytes, capacity, own, pools, stagings, tables, addresses
        )
        torch.cuda.synchronize(self.device)
        self.barrier("pool registration", layer=-1)
        return self.pool(payload)

    def compose(self, plan: ComposePlan, payload: str, current: Any, *, layer: int = 0, out: Any = None) -> Any:
        with self._torch.cuda.device(self.device):  # the staging copy and the kernel run on the group's device
            return super().compose(plan, payload, current, layer=layer, out=out)

    def compose_allreduce(
        self, plan: ComposePlan, payload: str, current: Any, *, layer: int = 0, out: Any = None
    ) -> Any:
        with self._torch.cuda.device(self.device):
            return super().compose_allreduce(plan, payload, current, layer=layer, out=out)

    def _compose(self, plan: ComposePlan, payload: str, current: Any, layer: int, out: Any) -> Any:
        """Stage, one barrier, one Triton gather through the address table."""
        p = self._payload(payload)
        self._check_plan(plan)
        self._agree(plan, layer)
        check_pool(plan, self.rank, self.pool(payload), payload)
        if plan.max_staging_rows > p.staging_capacity:
            raise on_every_rank(FallbackError(
                f"payload {payload!r} layer {layer}: the batch stages {plan.max_staging_rows - 1} current pages on "
                f"one rank, the staging holds {p.staging_capacity - 1}; refusing to fall back to a dense all-reduce"
            ))
        if current.device != self.device:
            raise InvalidArgumentError(
                f"rank {self.rank}: current rows are on {current.device}, the group on {self.device}"
            )
        rows = check_current_rows(plan, self.rank, current, p.row_bytes, p.staging_capacity)
        source, row = self._descriptors(plan, p)
        parity = p.calls % 2
        p.calls += 1
        p.stagings[self.rank][parity][1 : rows.shape[0] + 1].copy_(rows)
        self.barrier("compose barrier", layer=layer)
        dense = self._out(plan, p, out)
        gather_triton(dense, p.tables[parity], source, row, addresses=p.addresses[parity])
        self.stats.composes += 1
        return dense.view(p.dtype).view(plan.num_slots, *p.page_shape)


    def barrier(self, what: str = "barrier", *, layer: int = -1) -> None:
        started = time.perf_counter()
        with self._protocol(what), self._torch.cuda.device(self.device):
            if self.backend == "nccl":
                guarded(what, self.rank, layer, self.timeout_s,
                        lambda: self._dist.all_reduce(self._flag, group=self._pg))
            else:
                self._torch.cuda.current_stream(self.device).synchronize()
                guarded(what, self.rank, layer, self.timeout_s,
                        lambda: self._dist.monitored_barrier(group=self._pg, timeout=self._timeout))
        self.stats.barriers += 1
        self.stats.barrier_s += time.perf_counter() - started  # host time (gloo: the stream sync included)

    def _quiesce(self) -> None:
        self._torch.cuda.synchronize(self.device)

    def abort(self) -> None:
        """Local, for error paths: drops every mapping without waiting for peers (which may be gone).

        Peers' allocations stay alive in their own processes until those exit; this rank only stops
        referring to them. Waits for this rank's own queued work first, so no kernel still reads them.
        """
        try:
            self._torch.cuda.synchronize(self.device)
        except Exception:  # noqa: BLE001 -- a failed device must not stop the release
            pass
        self._release()

    def _release(self) -> None:
        self._closed = True
        self._payloads.clear()

    def _descriptors(self, plan: ComposePlan, p: _DevicePayload) -> tuple[Any, Any]:
        """The plan's per-slot descriptors on the device, uploaded once per (plan key, rank)."""
        key = (plan.key, self.rank)
        cached = p.descriptors.get(key)
        if cached is None:
            source, row = plan.descriptors(self.rank)
            torch = self._torch
            cached = (
                torch.from_numpy(source.astype("int32")).to(self.device, non_blocking=True),
                torch.from_numpy(row.copy()).to(self.device, non_blocking=True),
            )
            if len(p.descriptors) >= _DESCRIPTOR_CACHE:
                p.descriptors.popitem(last=False)
            p.descriptors[key] = cached
        return cached

    def _out(self, plan: ComposePlan, p: _DevicePayload, out: Any) -> Any:
        torch = self._torch
        if out is None:
            return torch.empty(plan.num_slots, p.row_bytes, dtype=torch.uint8, device=self.device)
        if out.dtype != torch.uint8 or tuple(out.shape) != (plan.num_slots, p.row_bytes) or not out.is_contiguous():
            raise InvalidArgumentError(f"out must be contiguous uint8 [{plan.num_slots}, {p.row_bytes}]")
        if out.device != self.device:  # the kernel would write through a pointer of another device
            raise InvalidArgumentError(f"rank {self.rank}: out is on {out.device}, the group on {self.device}")
        return out


def cuda_device(device: Any) -> Any:
    """The group's device as ``cuda:N`` (``None`` or ``"cuda"``: the current device); anything else
    (a CPU device, an index past the devices present) is an :class:`InvalidArgumentError`."""
    import torch

    try:
        resolved = resolve_device("cuda" if device is None else device)
    except (RuntimeError, TypeError) as err:
        raise InvalidArgumentError(f"device {device!r} is not a device: {err}") from None
    if resolved.type != "cuda":
        raise InvalidArgumentError(f"CudaIpcGroup needs a CUDA device, got {device!r}")
    count = torch.cuda.device_count()
    if not 0 <= resolved.index < count:
        raise InvalidArgumentError(f"device {device!r}: this process sees {count} CUDA devices")
    return resolved


def open_peer_buffer(rebuild: Any, args: tuple, device_index: int) -> Any:
    """A peer's buffer from its CUDA IPC handle (``reduce_tensor``'s ``(rebuild, args)``), opened in
    this rank's device context: the handle names the peer's device, which is another GPU when every
    rank has its own."""
    params = list(inspect.signature(rebuild).parameters)
    if "storage_device" not in params:
        raise FallbackError(f"cannot open a CUDA IPC handle rebuilt by {getattr(rebuild, '__name__', rebuild)!r}: "
                            "this torch names no storage_device argument")
    opened = list(args)
    opened[params.index("storage_device")] = device_index
    return rebuild(*opened)


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN
