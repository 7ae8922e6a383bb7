"""CudaIpcGroup's compose on the CPU, for the replay's device path: ShmGroup's pools and stagings in
shared memory, gathered the way the GPU gathers them, by the Triton kernel (run with
``TRITON_INTERPRET=1``) reading through a table of the 2 * cp sources' raw addresses, with the
plan's per-slot descriptors; no silent fallback. Every compose is logged (``("compose", layer)``)
into a :class:`stream_double.RecordingStreams` log, so a test can see it among the stream waits."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cpkv.compose import ShmGroup
from cpkv.compose.groups.base import check_current_rows, check_pool, on_every_rank
from cpkv.errors import FallbackError
from cpkv.kernels.gather import gather_triton


class TritonShmGroup(ShmGroup):
    def __init__(self, streams: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._streams = streams
        self.triton_gathers = 0

    def _compose(self, plan: Any, payload: str, current: Any, layer: int, out: Any) -> Any:
        p = self._payload(payload)
        self._check_plan(plan)
        self._agree(plan, layer)
        check_pool(plan, self.rank, self.pool(payload), payload)
        if plan.max_staging_rows > p.staging_capacity:
            raise on_every_rank(FallbackError(f"payload {payload!r}: the batch outgrows the staging"))
        rows = check_current_rows(plan, self.rank, current, p.row_bytes, p.staging_capacity)
        source, row = plan.descriptors(self.rank)
        parity = p.calls % 2
        p.calls += 1
        p.stagings[self.rank][parity][1 : rows.shape[0] + 1].copy_(rows)
        self.barrier("compose barrier", layer=layer)
        addresses = [t.data_ptr() for t in p.pools] + [s[parity].data_ptr() for s in p.stagings]
        dense = self._out(plan, p, out)
        gather_triton(dense, torch.tensor(addresses, dtype=torch.int64), torch.from_numpy(source.astype(np.int32)),
                      torch.from_numpy(row.copy()), addresses=addresses)
        self.triton_gathers += 1
        self.stats.composes += 1
        with self._streams._lock:
            self._streams.log.append(("compose", layer))
        return dense.view(p.dtype).view(plan.num_slots, *p.page_shape)
