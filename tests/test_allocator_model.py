"""Differential test: cpkv.PageAllocator against the pure-Python model, step by step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import cpkv
from alloc_model import ModelAllocator
from cpkv.errors import CpkvError

POOLS = {"kv": 40, "index": 24}
keys = st.integers(min_value=0, max_value=14)
page_counts = st.integers(min_value=-1, max_value=18)
payload_choices = st.sampled_from(
    [None, None, ["kv"], ["index"], ["index", "kv"], [], ["kv", "kv"], ["nope"], [""], "kv"]
)


def observe(alloc: cpkv.PageAllocator):
    return alloc.digest(), alloc.canonical_digest(), len(alloc), alloc.stats()


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = cpkv.PageAllocator(POOLS)
        self.model = ModelAllocator(POOLS)
        self.misses = 0

    def both(self, name: str, *args):
        """Runs `name` on the model; the allocator must agree, or raise the same
        class and change nothing."""
        try:
            expected = getattr(self.model, name)(*args)
        except CpkvError as err:
            before = observe(self.alloc)
            with pytest.raises(type(err)):
                getattr(self.alloc, name)(*args)
            assert observe(self.alloc) == before
            return None, False
        return getattr(self.alloc, name)(*args), expected

    def check_placement(self, key: int, placement, expected) -> None:
        if expected is None:
            assert placement is None
            self.misses += 1
            return
        assert placement.key == key
        assert placement.payloads == list(expected)
        for name, pages in expected.items():
            assert placement.num_pages == len(pages)
            np.testing.assert_array_equal(placement.pages(name), np.array(pages, dtype=np.int64))
            assert placement.pages(name).dtype == np.int64
            assert placement.extents(name) == self.model.extents(key, name)

    @rule(key=keys, num_pages=page_counts, payloads=payload_choices)
    def reserve(self, key, num_pages, payloads):
        placement, expected = self.both("reserve", key, num_pages, payloads)
        if expected is not False:
            self.check_placement(key, placement, expected)

    @rule(requests=st.lists(st.tuples(keys, page_counts), max_size=5), payloads=payload_choices)
    def reserve_many(self, requests, payloads):
        placements, expected = self.both("reserve_many", requests, payloads)
        if expected is not False:
            assert len(placements) == len(requests)
            for (key, _), placement, exp in zip(requests, placements, expected):
                self.check_placement(key, placement, exp)

    @rule(requests=st.lists(st.tuples(keys, page_counts), max_size=5), payloads=payload_choices)
    def reserve_batch(self, requests, payloads):
        # The lean form: int64 arrays in (negatives must be refused), reserve_many's semantics.
        keys_in = np.array([k for k, _ in requests], dtype=np.int64)
        pages_in = np.array([n for _, n in requests], dtype=np.int64)
        try:
            expected = self.model.reserve_many(requests, payloads)
        except CpkvError as err:
            before = observe(self.alloc)
            with pytest.raises(type(err)):
                self.alloc.reserve_batch(keys_in, pages_in, payloads)
            assert observe(self.alloc) == before
            return
        batch = self.alloc.reserve_batch(keys_in, pages_in, payloads)
        assert len(batch) == len(requests)
        assert batch.keys.tolist() == [k for k, _ in requests]
        assert batch.hits.tolist() == [e is not None for e in expected]
        for i, ((key, _), exp) in enumerate(zip(requests, expected)):
            self.check_placement(key, batch[i], exp)

    @rule(keys=st.lists(keys, max_size=4))
    def release_many_array(self, keys):
        try:
            self.model.release_many(keys)
        except CpkvError as err:
            before = observe(self.alloc)
            with pytest.raises(type(err)):
                self.alloc.release_many(np.array(keys, dtype=np.uint64))
            assert observe(self.alloc) == before
            return
        self.alloc.release_many(np.array(keys, dtype=np.uint64))

    @rule(key=keys)
    def release(self, key):
        self.both("release", key)

    @rule(keys=st.lists(keys, max_size=4))
    def release_many(self, keys):
        self.both("release_many", keys)

    @rule(key=keys)
    def mark_committed(self, key):
        self.both("mark_committed", key)

    @rule(key=keys, at=st.integers(min_value=-1, max_value=18), left=keys, right=keys)
    def split(self, key, at, left, right):
        self.both("split", key, at, left, right)

    @rule()
    def snapshot_restore(self):
        restored = cpkv.PageAllocator.restore(self.alloc.snapshot())
        assert observe(restored) == observe(self.alloc)
        self.alloc = restored

    @rule(key=keys, num_pages=st.integers(min_value=1, max_value=30))
    def reserve_then_release_restores(self, key, num_pages):
        if key in self.alloc:
            return
        before = observe(self.alloc)
        if self.alloc.reserve(key, num_pages) is not None:
            assert self.alloc.digest() != before[0]
            self.alloc.release(key)
            after = observe(self.alloc)
            assert after[:3] == before[:3]
        else:
            self.misses += 1
            self.model.reserve(key, num_pages)  # the model must miss too
            assert key not in self.model.pages

    @invariant()
    def matches_model(self):
        alloc, model = self.alloc, self.model
        alloc.verify()
        assert sorted(model.pages) == alloc.keys()
        assert len(alloc) == len(model.pages)
        stats = alloc.stats()
        for name, capacity in POOLS.items():
            runs = model.free_runs(name)
            assert alloc.free_extents(name) == runs
            assert alloc.free_pages(name) == model.free_pages(name)
            assert alloc.largest_free_extent(name) == max((n for _, n in runs), default=0)
            used = sum(len(p[name]) for p in model.pages.values() if name in p)
            assert stats["payloads"][name]["used"] == used
            assert stats["payloads"][name]["free"] + used == capacity
            assert stats["payloads"][name]["free_extents"] == len(runs)
        for key, placed in model.pages.items():
            assert alloc.is_committed(key) == (key in model.committed)
            placement = alloc.placement(key)
            for name, pages in placed.items():
                assert placement.pages(name).tolist() == pages


AllocatorMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAllocatorModel = AllocatorMachine.TestCase
