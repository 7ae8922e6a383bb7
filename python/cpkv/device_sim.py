"""One request through a ``PrefixTree`` on a device tier of bounded pages, as an engine does it
(``cpkv hitrate``'s replay step, and each instance's device tier in :mod:`cpkv.cluster_sim`)."""

from __future__ import annotations

from typing import Any, NamedTuple


class Placed(NamedTuple):
    """One request on a device tier (:func:`place`)."""

    hit: int  # leading blocks the device already held
    kept: int  # leading blocks of the request on the device after it (all, unless the rest is locked)
    victims: list  # the ``DeviceVictim``s evicted to make room
    next_page: int  # the next fresh device page id


def place(tree: Any, blocks: tuple[int, ...], capacity: int, next_page: int) -> Placed:
    """One request through ``tree`` holding at most ``capacity`` device pages, as an engine does it:
    match, lock, evict what the new blocks need, insert (truncated only where the rest is locked),
    unlock. New blocks get device pages ``next_page``, ``next_page + 1``, ..."""
    import numpy as np

    m = tree.match(blocks)
    tree.lock(m.node)
    new = len(blocks) - m.length
    victims = []
    if new > capacity - tree.device_pages:
        victims = tree.evict(new - (capacity - tree.device_pages))
    keep = m.length + min(new, capacity - tree.device_pages)
    fresh = np.arange(next_page, next_page + keep - m.length, dtype=np.int64)
    tree.insert(blocks[:keep], np.concatenate([m.device_pages, fresh]))
    tree.unlock(m.node)
    return Placed(m.length, keep, victims, next_page + len(fresh))


def drive(tree: Any, requests: list[tuple[int, ...]], capacity: int) -> tuple[int, int]:
    """Replays ``requests`` through ``tree`` holding at most ``capacity`` device pages (:func:`place`
    per request); (hit blocks, total blocks)."""
    hits = total = 0
    next_page = 0
    for blocks in requests:
        placed = place(tree, blocks, capacity, next_page)
        next_page = placed.next_page
        hits += placed.hit
        total += len(blocks)
    return hits, total
