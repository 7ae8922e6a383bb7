"""LocalGroup: all cp ranks in one process -- the reference transport."""

from __future__ import annotations

from typing import Any, Sequence

from cpkv.compose.groups.base import ComposeGroup, check_current_rows, check_pool, gather_planned
from cpkv.compose.plan import ComposePlan
from cpkv.errors import InvalidArgumentError
from cpkv.kernels.gather import gather_runs


class LocalGroup(ComposeGroup):
    """Composes every rank's dense buffer in this process (no transport, same plan, same bytes)."""

    def compose(
        self, plan: ComposePlan, pools: Sequence[Any], current: Sequence[Any], *, layer: int = 0,
        payload: str | None = None,
    ) -> list[Any]:
        """Staged single gather: stage each writer's rows at 1..n, then one gather per rank."""
        import torch

        pool_rows, current_rows = self._inputs(plan, pools, current, payload)
        row_bytes = pool_rows[0].shape[1]
        stagings = []
        for rank, rows in enumerate(current_rows):
            staging = torch.zeros(plan.staging_rows(rank), row_bytes, dtype=torch.uint8, device=rows.device)
            staging[1:].copy_(rows)
            stagings.append(staging)
        sources = [*pool_rows, *stagings]
        self.stats.composes += 1
        self.stats.barriers += 1  # the one (logical) barrier between staging and gather
        return [
            self._typed(gather_planned(self._dense(plan, pool_rows[0]), sources, plan, r), pools[r])
            for r in range(self.cp_size)
        ]

    def compose_allreduce(
        self, plan: ComposePlan, pools: Sequence[Any], current: Sequence[Any], *, layer: int = 0,
        payload: str | None = None,
    ) -> list[Any]:
        """The dense baseline: each rank fills the slots it owns in a zeroed buffer; the buffers are summed.

        Every slot has exactly one contributor, so a uint8 sum is exact (no carries).
        """
        pool_rows, current_rows = self._inputs(plan, pools, current, payload)
        total = self._dense(plan, pool_rows[0]).zero_()
        for rank in range(self.cp_size):
            contribution = self._dense(plan, pool_rows[0]).zero_()
            gather_runs(contribution, [pool_rows[rank], current_rows[rank]], plan.owned_runs(rank))
            total += contribution
        self.stats.composes += 1
        self.stats.collectives += 1
        return [self._typed(total.clone(), pools[r]) for r in range(self.cp_size)]

    def _inputs(
        self, plan: ComposePlan, pools: Sequence[Any], current: Sequence[Any], payload: str | None
    ) -> tuple[list, list]:
        self._check_plan(plan)
        if len(pools) != self.cp_size or len(current) != self.cp_size:
            raise InvalidArgumentError(
                f"need {self.cp_size} pools and {self.cp_size} current tensors, got {len(pools)} and {len(current)}"
            )
        shapes = {(tuple(p.shape[1:]), p.dtype) for p in pools}
        if len(shapes) != 1:
            raise InvalidArgumentError(f"pools differ in page shape or dtype: {sorted(map(str, shapes))}")
        pool_rows = [check_pool(plan, r, p, payload) for r, p in enumerate(pools)]
        row_bytes = pool_rows[0].shape[1]
        current_rows = [
            check_current_rows(plan, r, c, row_bytes, plan.staging_rows(r)) for r, c in enumerate(current)
        ]
        return pool_rows, current_rows

    @staticmethod
    def _dense(plan: ComposePlan, like: Any) -> Any:
        import torch

        return torch.empty(plan.num_slots, like.shape[1], dtype=torch.uint8, device=like.device)

    @staticmethod
    def _typed(dense: Any, pool: Any) -> Any:
        return dense.view(pool.dtype).view(dense.shape[0], *pool.shape[1:])
