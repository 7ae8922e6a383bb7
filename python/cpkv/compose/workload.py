"""Random batches in the shape a serving engine produces (tests and benchmarks).

Requests take consecutive logical pages from one global page space (so no two
requests share a current page); each has a cached prefix of 0..many pages and
current pages after it, with dense slots laid out request after request and
a few unused slots in between.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cpkv.compose.spans import SlotSpans


@dataclass(frozen=True)
class Batch:
    requests: tuple[SlotSpans, ...]
    num_slots: int
    pool_rows: int  # rows every rank's pool needs (uniform across ranks)
    max_current_pages: int  # the most current pages any one rank writes


def random_batch(
    rng: np.random.Generator,
    cp_size: int,
    *,
    max_requests: int = 16,
    max_prefix_pages: int = 40,
    max_current_pages: int = 6,
    max_gap: int = 2,
    split_spans: bool = True,
) -> Batch:
    requests = []
    slot = 0
    next_page = int(rng.integers(0, 3 * cp_size))
    for _ in range(int(rng.integers(1, max_requests + 1))):
        slot += int(rng.integers(0, max_gap + 1))
        next_page += int(rng.integers(0, 2 * cp_size))  # pages of other, idle requests
        prefix_len = int(rng.integers(0, max_prefix_pages + 1))
        current_len = int(rng.integers(1, max_current_pages + 1))
        prefix = _spans(rng, slot, next_page, prefix_len, split_spans)
        slot += prefix_len
        current = _spans(rng, slot, next_page + prefix_len, current_len, split_spans)
        slot += current_len
        next_page += prefix_len + current_len
        requests.append(SlotSpans(prefix=prefix, current=current))
    num_slots = slot + int(rng.integers(0, max_gap + 1))
    pool_rows = next_page // cp_size + 1
    per_writer = np.zeros(cp_size, dtype=np.int64)
    for r in requests:
        np.add.at(per_writer, np.asarray(r.current_pages) % cp_size, 1)
    return Batch(tuple(requests), num_slots, pool_rows, int(per_writer.max()))


def uniform_batch(cp_size: int, requests: int, prefix_pages: int, current_pages: int) -> Batch:
    """A deterministic batch: every request has the same prefix and current lengths (benchmarks)."""
    spans, slot, page = [], 0, 0
    for _ in range(requests):
        prefix = [(slot, page, prefix_pages)] if prefix_pages else []
        spans.append(SlotSpans(prefix=prefix, current=[(slot + prefix_pages, page + prefix_pages, current_pages)]))
        slot += prefix_pages + current_pages
        page += prefix_pages + current_pages
    per_writer = np.bincount(
        np.concatenate([np.asarray(r.current_pages) for r in spans]) % cp_size, minlength=cp_size
    )
    return Batch(tuple(spans), slot, page // cp_size + 1, int(per_writer.max()))


def _spans(rng: np.random.Generator, slot: int, page: int, count: int, split: bool) -> list[tuple[int, int, int]]:
    """``count`` pages as one span, or cut into a few pieces (dense slots and pages stay in step)."""
    if count == 0:
        return []
    cuts = sorted(set(rng.integers(1, count, size=int(rng.integers(0, 3))).tolist())) if split and count > 1 else []
    bounds = [0, *cuts, count]
    return [(slot + a, page + a, b - a) for a, b in zip(bounds, bounds[1:])]
