"""Seeded allocator operation streams, shared by ``bench allocator`` and the tests.

A stream is a list of steps; each step reserves a batch of new keys (one
payload choice per batch, so it maps onto one ``reserve_many`` call) and then
releases a batch of live keys (one ``release_many`` call). Releases are chosen
by replaying the stream through the reference allocator while generating it,
so every release names a key that was actually placed: the same stream is
valid for any allocator with the same semantics.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from cpkv.bench._reference_allocator import ReferenceAllocator

DEFAULT_POOLS = {"kv": 16384, "index": 16384}


@dataclass(frozen=True)
class Step:
    payloads: tuple[str, ...] | None
    reserves: tuple[tuple[int, int], ...]
    releases: tuple[int, ...]


def make_stream(
    seed: int,
    steps: int,
    pools: dict[str, int] | None = None,
    batch: int = 32,
    occupancy: float = 0.85,
    max_pages: int = 64,
) -> list[Step]:
    """`steps` steps of `batch` reserves each (1..`max_pages` pages), releasing
    random live objects back to `occupancy`."""
    pools = dict(pools or DEFAULT_POOLS)
    rng = random.Random(seed)
    reference = ReferenceAllocator(pools)
    first = reference.names[0]
    live: list[int] = []
    next_key = rng.randrange(1 << 40)
    out = []
    for _ in range(steps):
        payloads = (first,) if rng.random() < 0.1 else None
        reserves = []
        for _ in range(batch):
            pages = rng.randint(1, max_pages)
            reserves.append((next_key, pages))
            if reference.reserve(next_key, pages, payloads) is not None:
                live.append(next_key)
            next_key += rng.randint(1, 1000)
        releases = []
        capacity = pools[first]
        while live and capacity - reference.free_pages(first) > occupancy * capacity:
            key = live.pop(rng.randrange(len(live)))
            reference.release(key)
            releases.append(key)
        out.append(Step(payloads, tuple(reserves), tuple(releases)))
    return out


def placement_record(key: int, placement: Any, names: Sequence[str]) -> tuple:
    """A comparable record of a cpkv ``Placement`` (or None)."""
    if placement is None:
        return (key, None)
    return (key, tuple((n, tuple(placement.extents(n))) for n in names if n in placement.payloads))


def reference_record(key: int, placement: dict | None) -> tuple:
    """The same record for a ``ReferenceAllocator`` placement (or None)."""
    if placement is None:
        return (key, None)
    return (key, tuple((n, tuple(e)) for n, e in placement.items()))


def checksum(records: Iterable[tuple]) -> str:
    h = hashlib.sha256()
    for record in records:
        h.update(repr(record).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class ArrayStep:
    """A `Step` as the numpy arrays a batching caller (a scheduler) holds."""

    payloads: tuple[str, ...] | None
    keys: Any  # uint64[n]
    num_pages: Any  # uint64[n]
    releases: Any  # uint64[m]


def as_arrays(stream: Sequence[Step]) -> list[ArrayStep]:
    import numpy as np

    return [
        ArrayStep(
            step.payloads,
            np.array([k for k, _ in step.reserves], dtype=np.uint64),
            np.array([n for _, n in step.reserves], dtype=np.uint64),
            np.array(step.releases, dtype=np.uint64),
        )
        for step in stream
    ]


def replay_arrays(alloc: Any, steps: Sequence[ArrayStep]) -> list:
    """Runs array steps through ``reserve_batch``/``release_many``; returns
    one ``PlacementBatch`` per step (see `placements`)."""
    batches: list = []
    reserve_batch, release_many = alloc.reserve_batch, alloc.release_many
    for step in steps:
        batches.append(reserve_batch(step.keys, step.num_pages, step.payloads))
        release_many(step.releases)
    return batches


def placements(batches: Iterable) -> list:
    """Every placement (or None) of `replay_arrays`' batches, in request order."""
    return [placement for batch in batches for placement in batch]


def replay(alloc: Any, stream: Sequence[Step], batched: bool = False) -> list:
    """Runs `stream` through an allocator, cpkv's ``PageAllocator`` or the
    `ReferenceAllocator`; returns the placements.

    Single calls run one loop for both (bound methods looked up once), so the
    harness costs both sides the same."""
    results: list = []
    if batched:
        reserve_many, release_many = alloc.reserve_many, alloc.release_many
        for step in stream:
            results += reserve_many(step.reserves, step.payloads)
            release_many(step.releases)
        return results
    reserve, release, append = alloc.reserve, alloc.release, results.append
    for step in stream:
        payloads = step.payloads
        for key, pages in step.reserves:
            append(reserve(key, pages, payloads))
        for key in step.releases:
            release(key)
    return results

