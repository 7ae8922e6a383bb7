"""vLLM 0.33's own manager scenarios (its ``tests/v1/kv_offload/cpu/`` manager tests), run against
vLLM's ``CPUOffloadingManager`` and cpkv's manager alike, through the ``OffloadingManager`` interface.

The scenarios and their expectations are vLLM's; the structure is ours. What is relaxed, and why:

- which resident chunks an eviction takes, and in what order, is each manager's own policy (cpkv
  evicts leaves of its prefix tree in its policy's order, vLLM its LRU/ARC lists). Where a scenario
  leaves exactly one candidate set, the victims are asserted exactly; elsewhere, the count and that
  every victim was an unpinned resident chunk not in the offer. Policy internals (ARC's T1/T2/B1
  lists, the reuse tracker's counts) are vLLM's own and not part of the interface: left out;
- block ids: vLLM hands out fresh ids then reuses freed ones, cpkv takes rows from a stack; asserted
  instead: one distinct row per stored chunk, within capacity, a load reading the rows its store
  wrote, and a full host reusing exactly the rows its victims held.

Everything else is asserted as vLLM asserts it, for both: an offer placed whole or refused with
``None`` changing nothing, and a failed store removing its chunks (their rows free at once) with a
metadata-only removal event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pytest
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from cpkv.integrations.vllm import CpkvOffloadingManager

MISS, HIT, PENDING = LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING

Factory = Callable[[int], OffloadingManager]

MANAGERS: dict[str, Factory] = {
    "vllm-lru": lambda n: CPUOffloadingManager(num_chunks=n, cache_policy="lru", enable_events=True),
    "vllm-arc": lambda n: CPUOffloadingManager(num_chunks=n, cache_policy="arc", enable_events=True),
    "cpkv-lru": lambda n: CpkvOffloadingManager(n, "lru", enable_events=True),
    "cpkv-ghost": lambda n: CpkvOffloadingManager(n, "ghost", enable_events=True),
}


@pytest.fixture(params=sorted(MANAGERS))
def make(request: pytest.FixtureRequest) -> Factory:
    return MANAGERS[request.param]


CTX = ReqContext(req_id="")


def key(i: int) -> OffloadKey:
    return make_offload_key(str(i).encode(), 0)


def keys(*ids: int) -> list[OffloadKey]:
    return [key(i) for i in ids]


def rows(spec: object) -> list[int]:
    return [int(r) for r in np.asarray(spec.block_ids)]  # type: ignore[attr-defined]


def lookups(m: OffloadingManager, ids: Iterable[int]) -> list[LookupResult]:
    return [m.lookup(key(i), CTX) for i in ids]


def stored(out: PrepareStoreOutput | None, ids: list[int], capacity: int) -> dict[OffloadKey, int]:
    """Checks a placement of exactly ``ids`` (one distinct row each, within capacity); their rows."""
    assert out is not None, f"{ids} must be placed"
    assert out.keys_to_store == keys(*ids)
    placed = rows(out.store_spec)
    assert len(set(placed)) == len(placed) == len(ids) and all(0 <= r < capacity for r in placed)
    return dict(zip(out.keys_to_store, placed))


def refused(m: OffloadingManager, ids: list[int], probe: range) -> list[OffloadingEvent]:
    """``prepare_store`` of ``ids`` returns None and changes nothing a caller can see; returns the
    events that were waiting before it (taken to see that it adds none)."""
    waiting = list(m.take_events())
    before = lookups(m, probe)
    digest = m.digest() if isinstance(m, CpkvOffloadingManager) else None
    assert m.prepare_store(keys(*ids), CTX) is None, f"{ids} do not all fit: the offer is refused whole"
    assert lookups(m, probe) == before, "a refused offer evicts nothing and places nothing"
    assert list(m.take_events()) == [], "a refused offer reports nothing"
    if digest is not None:
        assert m.digest() == digest
    return waiting


def events(m: OffloadingManager, earlier: Iterable[OffloadingEvent] = ()
           ) -> tuple[list[set[OffloadKey]], list[set[OffloadKey]], list[set[OffloadKey]]]:
    """(stored, evicted, dropped) key sets, one per event in order (``earlier`` ones first, then the
    manager's): dropped are the metadata-only removals of failed stores."""
    out: tuple[list[set[OffloadKey]], list[set[OffloadKey]], list[set[OffloadKey]]] = ([], [], [])
    for event in [*earlier, *m.take_events()]:
        assert isinstance(event, OffloadingEvent) and event.medium == m.medium
        kind = 2 if event.metadata_only else 1 if event.removed else 0
        assert not event.metadata_only or event.removed
        out[kind].append(set(event.keys))
    return out


def test_store_load_evict_and_fail_in_sequence(make: Factory) -> None:
    m = make(4)
    row = stored(m.prepare_store(keys(1, 2), CTX), [1, 2], 4)
    assert lookups(m, [1, 2]) == [PENDING, PENDING], "written chunks are pending until complete_store"
    assert list(m.take_events()) == []
    m.complete_store(keys(1, 2), CTX)
    assert events(m) == ([set(keys(1, 2))], [], [])
    assert lookups(m, [1, 2, 3]) == [HIT, HIT, MISS]

    # 2 is offered again, so only 1 can make room for 3, 4 and 5.
    out = m.prepare_store(keys(2, 3, 4, 5), CTX)
    row |= stored(out, [3, 4, 5], 4)
    assert out is not None and out.evicted_keys == keys(1)
    assert events(m) == ([], [set(keys(1))], [])

    # Two new chunks, one evictable (2; 3-5 are being written): refused whole.
    refused(m, [1, 6], range(10))
    m.complete_store(keys(2, 3, 4, 5), CTX)
    assert lookups(m, [1, 2, 3, 4, 5, 0]) == [MISS, HIT, HIT, HIT, HIT, MISS]

    assert rows(m.prepare_load(keys(2, 3), CTX)) == [row[key(2)], row[key(3)]]
    # Three new chunks, two evictable (2 and 3 are being read): refused whole.
    log = refused(m, [6, 7, 8], range(10))
    m.complete_load(keys(2, 3), CTX)

    held = {k: row[k] for k in keys(2, 3, 4, 5)}
    out = m.prepare_store(keys(6, 7, 8), CTX)
    row |= stored(out, [6, 7, 8], 4)
    assert out is not None and len(out.evicted_keys) == 3 and set(out.evicted_keys) < set(held)
    first_victims = set(out.evicted_keys)
    assert sorted(rows(out.store_spec)) == sorted(held[k] for k in first_victims), "freed rows reused"
    m.complete_store(keys(6, 7, 8), CTX)

    m.touch(keys(5, 6, 7), CTX)
    resident = [k for k in keys(*range(10)) if m.lookup(k, CTX) is HIT]
    out = m.prepare_store(keys(9), CTX)
    stored(out, [9], 4)
    assert out is not None and len(out.evicted_keys) == 1 and out.evicted_keys[0] in resident
    second_victim = out.evicted_keys[0]

    # 7 (if still held) was stored long ago and is untouched by the failure; 9 is removed.
    still = [k for k in keys(7) if k in resident and k != second_victim]
    m.complete_store(keys(7, 9), CTX, success=False)
    assert m.lookup(key(9), CTX) is MISS
    assert all(m.lookup(k, CTX) is HIT for k in still)
    assert events(m, log) == ([set(keys(3, 4, 5)), set(keys(6, 7, 8))], [first_victims, {second_victim}],
                         [set(keys(9))])
    # 9's row is free again: a new chunk needs no eviction.
    out = m.prepare_store(keys(10), CTX)
    stored(out, [10], 4)
    assert out is not None and out.evicted_keys == []


def test_an_offered_chunk_already_stored_is_never_its_own_victim(make: Factory) -> None:
    m = make(4)
    m.prepare_store(keys(1, 2), CTX)
    m.complete_store(keys(1, 2), CTX)
    m.touch(keys(1), CTX)  # 2 is now the least recently used
    out = m.prepare_store(keys(2, 3, 4, 5), CTX)
    stored(out, [3, 4, 5], 4)
    assert out is not None and out.evicted_keys == keys(1)
    m.complete_store(keys(2, 3, 4, 5), CTX)
    assert lookups(m, [2, 3, 4, 5]) == [HIT] * 4


def test_a_load_reads_rows_in_the_order_of_its_keys(make: Factory) -> None:
    m = make(4)
    row = stored(m.prepare_store(keys(0, 1, 2), CTX), [0, 1, 2], 4)
    m.complete_store(keys(0, 1, 2), CTX)
    for order in ([0, 1, 2], [1, 2, 0]):
        assert rows(m.prepare_load(keys(*order), CTX)) == [row[key(i)] for i in order]
        m.complete_load(keys(0, 1, 2), CTX)


def test_chunks_being_read_are_spared_and_the_offer_waits(make: Factory) -> None:
    m = make(4)
    row = stored(m.prepare_store(keys(1, 2, 3, 4), CTX), [1, 2, 3, 4], 4)
    m.complete_store(keys(1, 2, 3, 4), CTX)
    assert rows(m.prepare_load(keys(2, 3), CTX)) == [row[key(2)], row[key(3)]]
    refused(m, [5, 6, 7], range(10))
    m.complete_load(keys(2, 3), CTX)
    out = m.prepare_store(keys(5, 6, 7), CTX)
    stored(out, [5, 6, 7], 4)
    assert out is not None and len(out.evicted_keys) == 3


def test_a_failed_store_leaves_nothing_behind(make: Factory) -> None:
    m = make(4)
    m.prepare_store(keys(1, 2, 3, 4), CTX)
    m.complete_store(keys(1, 2, 3, 4), CTX)
    out = m.prepare_store(keys(5), CTX)
    assert out is not None and len(out.evicted_keys) == 1
    victim = out.evicted_keys[0]
    m.complete_store(keys(5), CTX, success=False)
    assert m.lookup(key(5), CTX) is MISS and m.lookup(victim, CTX) is MISS
    stored_sets, evicted, dropped = events(m)
    assert (stored_sets, evicted, dropped) == ([set(keys(1, 2, 3, 4))], [{victim}], [set(keys(5))])
    # The failed chunk is no resident: filling the host evicts only stored chunks, and reports them.
    out = m.prepare_store(keys(6, 7), CTX)
    stored(out, [6, 7], 4)
    assert out is not None and len(out.evicted_keys) == 1 and key(5) not in out.evicted_keys


def test_pins_count_per_reader_and_failed_rows_are_free_at_once(make: Factory) -> None:
    m = make(4)
    m.prepare_store(keys(1, 2, 3), CTX)
    m.complete_store(keys(1, 2, 3), CTX)
    m.prepare_load(keys(1), CTX)
    m.prepare_load(keys(1), CTX)  # a second reader of the same chunk
    m.complete_load(keys(1), CTX)  # one reader left: 1 stays pinned
    out = m.prepare_store(keys(4, 5, 6), CTX)  # one free row, two evictions from {2, 3}
    stored(out, [4, 5, 6], 4)
    assert out is not None and sorted(out.evicted_keys) == sorted(keys(2, 3))
    m.complete_load(keys(1), CTX)
    m.complete_store(keys(4, 5, 6), CTX, success=False)
    assert lookups(m, [1, 4, 5, 6]) == [HIT, MISS, MISS, MISS]
    assert events(m) == ([set(keys(1, 2, 3))], [set(keys(2, 3))], [set(keys(4, 5, 6))])
    # The three failed rows are free: three new chunks fit without evicting 1.
    out = m.prepare_store(keys(7, 8, 9), CTX)
    stored(out, [7, 8, 9], 4)
    assert out is not None and out.evicted_keys == []
    m.complete_store(keys(7, 8, 9), CTX)

    m.reset_cache()
    assert lookups(m, range(10)) == [MISS] * 10
    list(m.take_events())  # vLLM's is a generator: drained only when read
    m.prepare_store(keys(10, 11, 12), CTX)
    m.complete_store(keys(10, 11, 12), CTX)
    m.prepare_load(keys(10, 11, 12), CTX)
    # One free row for two new chunks, and nothing evictable.
    assert events(m, refused(m, [14, 15], range(10, 16))) == ([set(keys(10, 11, 12))], [], [])
    m.complete_load(keys(10, 11, 12), CTX)
    out = m.prepare_store(keys(14, 15), CTX)
    stored(out, [14, 15], 4)
    assert out is not None and len(out.evicted_keys) == 1 and out.evicted_keys[0] in keys(10, 11, 12)


def test_a_failed_chunk_stored_again_before_the_drain_is_not_reported_removed(make: Factory) -> None:
    m = make(4)
    m.prepare_store(keys(1, 2), CTX)
    m.complete_store(keys(1, 2), CTX, success=False)
    retry = m.prepare_store(keys(1), CTX)  # the scheduler offers 1 again before events are taken
    stored(retry, [1], 4)
    assert events(m) == ([], [], [set(keys(2))])
    m.complete_store(keys(1), CTX)
    assert events(m) == ([set(keys(1))], [], [])
