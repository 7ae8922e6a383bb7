"""Binding classes shared between threads: one lock per object, never waited on while holding the
GIL, so concurrent calls serialize instead of failing ("Already borrowed") or losing updates.

Token iterables here run Python code and make garbage while the binding reads them, so the
interpreter switches threads in the middle of calls, the case that used to fail."""

from __future__ import annotations

import gc
import random
import sys
import threading
import time
from collections import Counter

import pytest

import cpkv

THREADS = 8


class Churn:
    """Cyclic garbage whose finalizer releases the GIL (as one doing I/O would): collecting it in
    the middle of a binding call lets another thread run."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


class Tokens:
    """An ordered iterable of ints that runs Python code for every item."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def __iter__(self):
        for t in self.tokens:
            Churn()
            yield t


@pytest.fixture(autouse=True)
def _switch_often():
    interval, threshold = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50)
    yield
    sys.setswitchinterval(interval)
    gc.set_threshold(*threshold)


def hammer(work, threads: int = THREADS) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(k: int) -> None:
        start.wait()
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001  (collected and asserted on below)
            errors.append(e)

    pool = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors


def commuting_ops(k: int, n: int) -> list[tuple]:
    """Calls whose combined effect does not depend on their order: misses (each moves the logical
    clock by one), allocations given straight back, and reads."""
    rng = random.Random(k)
    ops: list[tuple] = []
    for i in range(n):
        kind = rng.choice(["miss", "miss", "alloc", "read"])
        if kind == "miss":
            ops.append(("miss", [10_000 + k, i, rng.randrange(9), 4]))
        elif kind == "alloc":
            ops.append(("alloc", rng.randrange(1, 5)))
        else:
            ops.append(("read",))
    return ops


def apply(cache: cpkv.TierCache, op: tuple, iterable=list) -> None:
    if op[0] == "miss":
        hit = cache.lookup(iterable(op[1]))
        assert hit.device_tokens == 0 and not hit.locked
    elif op[0] == "alloc":
        pages = cache.allocate(op[1])
        assert pages is not None and len(pages) == op[1]
        cache.free(pages)
    else:
        cache.digest()
        cache.stats()
        cache.pending_tickets()


def test_threads_hammering_one_cache_end_where_a_serial_replay_ends() -> None:
    per_thread = [commuting_ops(k, 400) for k in range(THREADS)]
    shared = cpkv.TierCache(page_size=4, cp_size=2, device_pages=64, host_pages=64)
    shared.insert([1, 2, 3, 4], shared.allocate(1))

    def work(k: int) -> None:
        for op in per_thread[k]:
            apply(shared, op, Tokens)

    assert hammer(work) == []
    serial = cpkv.TierCache(page_size=4, cp_size=2, device_pages=64, host_pages=64)
    serial.insert([1, 2, 3, 4], serial.allocate(1))
    for ops in per_thread:
        for op in ops:
            apply(serial, op)
    assert shared.digest() == serial.digest() == shared.digest_from_scratch()
    assert shared.stats() == serial.stats()
    shared.check_invariants()


def mixed_work(cache: cpkv.TierCache, k: int, calls: Counter, lock: threading.Lock) -> None:
    rng = random.Random(100 + k)
    mine: Counter = Counter()
    for i in range(300):
        tokens = [k, rng.randrange(6), rng.randrange(3), i % 4] * 2
        hit = cache.lookup(Tokens(tokens))
        mine["lookups"] += 1
        if hit.locked:
            cache.plan_load(hit.node)  # may be empty; the node stays locked by the lookup
            cache.unlock(hit.node)
        pages = cache.allocate(2)
        if pages is not None:
            cache.insert(Tokens(tokens), pages)
        if i % 7 == 0:
            cache.commit(cache.issued)
        if i % 11 == 0:
            cache.evict_device(rng.randrange(1, 4))
            cache.evict_host(1)
        cache.digest()
    with lock:
        calls.update(mine)


def test_threads_mixing_every_call_on_one_cache_keep_it_consistent() -> None:
    cache = cpkv.TierCache(page_size=4, cp_size=2, device_pages=48, host_pages=40)
    calls: Counter = Counter()
    lock = threading.Lock()
    assert hammer(lambda k: mixed_work(cache, k, calls, lock)) == []
    stats = cache.stats()
    assert stats["lookups"] == calls["lookups"] == THREADS * 300, "no call lost"
    assert cache.digest() == cache.digest_from_scratch()
    cache.check_invariants()


def test_threads_sharing_an_allocator_and_a_tree_serialize_too() -> None:
    alloc = cpkv.PageAllocator({"kv": 4096})
    tree = cpkv.PrefixTree(4)

    def work(k: int) -> None:
        for i in range(300):
            key = k * 1_000_000 + i
            assert alloc.reserve(key, 1 + i % 3) is not None
            alloc.release(key)
            tree.match(Tokens([k, i, 1, 2]))

    assert hammer(work) == []
    fresh = cpkv.PageAllocator({"kv": 4096})
    assert len(alloc) == 0 and alloc.free_pages("kv") == fresh.free_pages("kv")
    assert alloc.stats()["reserves"] == alloc.stats()["releases"] == THREADS * 300
    alloc.verify()
    assert tree.clock >= THREADS * 300
    tree.check_invariants()
