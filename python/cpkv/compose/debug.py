"""Debug-mode checks of a plan and of the rows about to be staged (``CPKV_DEBUG_COMPOSE=1``).

Groups call these only when :func:`cpkv.config.config` says
``debug``; with it off, nothing here runs.
"""

from __future__ import annotations

import numpy as np

from cpkv.compose.plan import ComposePlan
from cpkv.errors import CpkvError


class ComposeCheckError(CpkvError, AssertionError):
    """A plan or staging write that breaks the compose invariants (an internal bug)."""


def check_plan(plan: ComposePlan, rank: int) -> None:
    """Every descriptor of ``rank``'s dense buffer is the one the spans define."""
    cp = plan.cp_size
    source, row = plan.descriptors(rank)
    if (source < 0).any() or (row < 0).any():
        bad = int(np.nonzero((source < 0) | (row < 0))[0][0])
        raise ComposeCheckError(f"rank {rank}: slot {bad} has a -1 sentinel descriptor ({source[bad]}, {row[bad]})")
    if (source >= 2 * cp).any():
        raise ComposeCheckError(f"rank {rank}: a descriptor names source >= {2 * cp}")
    covered = np.zeros(plan.num_slots, dtype=bool)
    for index, request in enumerate(plan.requests):
        for slot, page, count in request.prefix:
            pages = np.arange(page, page + count)
            slots = np.arange(slot, slot + count)
            covered[slots] = True
            if not ((source[slots] == pages % cp) & (row[slots] == pages // cp)).all():
                raise ComposeCheckError(f"rank {rank}: request {index} prefix span {(slot, page, count)} "
                                        "has a descriptor that is not its owner's local row")
    staged = {w: plan.current_pages(w) for w in range(cp)}
    for index, request in enumerate(plan.requests):
        for slot, page, count in request.current:
            for k in range(count):
                writer = (page + k) % cp
                covered[slot + k] = True
                s, r = int(source[slot + k]), int(row[slot + k])
                if s != cp + writer or not 1 <= r <= len(staged[writer]) or staged[writer][r - 1] != page + k:
                    raise ComposeCheckError(f"rank {rank}: request {index} current page {page + k} maps to "
                                            f"({s}, {r}), not into writer {writer}'s staging layout")
    unused = ~covered
    if not ((source[unused] == cp + rank) & (row[unused] == 0)).all():
        raise ComposeCheckError(f"rank {rank}: an unused slot does not read its own staging's dummy row")
    _check_runs(plan, rank, source, row)


def _check_runs(plan: ComposePlan, rank: int, source: np.ndarray, row: np.ndarray) -> None:
    hits = np.zeros(plan.num_slots, dtype=np.int64)
    for dst, dst_stride, count, src, src_row, src_stride in plan.copy_runs(rank).tolist():
        slots = dst + dst_stride * np.arange(count)
        hits[slots] += 1
        if not ((source[slots] == src) & (row[slots] == src_row + src_stride * np.arange(count))).all():
            raise ComposeCheckError(f"rank {rank}: copy run at slot {dst} disagrees with the descriptors")
    if (hits != 1).any():
        raise ComposeCheckError(f"rank {rank}: slot {int(np.nonzero(hits != 1)[0][0])} is written "
                                f"{int(hits[hits != 1][0])} times by the copy runs")


def check_current(plan: ComposePlan, rank: int, current_rows: int, staging_rows: int) -> None:
    """``rank``'s current rows fit its staging layout (rows 1..n of a buffer with room for them)."""
    expected = plan.num_current(rank)
    if current_rows != expected:
        raise ComposeCheckError(f"rank {rank}: {current_rows} current rows given, the plan stages {expected}")
    if plan.staging_rows(rank) > staging_rows:
        raise ComposeCheckError(
            f"rank {rank}: staging has {staging_rows} rows, the plan needs {plan.staging_rows(rank)}"
        )
