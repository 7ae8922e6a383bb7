"""The binding's one argument rule, its size limits and its poison rule, the same for every class.

Ints: ``int``, numpy integers and objects with ``__index__``; sequences: 1-D numpy integer arrays
and ordered iterables, read by iteration. Bools, floats, str, bytes, mappings, sets and ``None``
are refused with ``ArgumentTypeError`` naming the value; a refused call changes nothing."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cpkv
from cpkv.errors import (
    ArgumentTypeError,
    CpkvError,
    InternalError,
    InvalidArgumentError,
    UnknownPolicyError,
)


class Index:
    """An int-like object that is not an int (what ``operator.index`` accepts)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:  # test ids must not hold an address (xdist collects in each worker)
        return f"Index({self.value})"


class LyingLength:
    """A sequence whose ``__len__`` claims far more items than iteration yields."""

    def __init__(self, items: list[int], claimed: int) -> None:
        self.items, self.claimed = items, claimed

    def __len__(self) -> int:
        return self.claimed

    def __getitem__(self, i: int) -> int:  # the old sequence protocol: iter() sizes by len()
        if i >= len(self.items):
            raise IndexError(i)
        return self.items[i]


def tier_cache(**kw) -> cpkv.TierCache:
    args = dict(page_size=4, cp_size=1, device_pages=16, host_pages=16)
    return cpkv.TierCache(**(args | kw))


def refused(call, error=ArgumentTypeError, *, named: str | None = None):
    with pytest.raises(error) as caught:
        call()
    assert isinstance(caught.value, CpkvError)
    if named is not None:
        assert named in str(caught.value), str(caught.value)
    return caught.value


# ---- the conversion rule -------------------------------------------------------------------

WRONG_SEQUENCES = [b"\x00\x01\x02\x03", bytearray(b"\x00\x01\x02\x03"), "abcd", {1: 2, 3: 4, 5: 6, 7: 8},
                   {1, 2, 3, 4}, frozenset({1, 2, 3, 4}), memoryview(b"abcd"), None, 7, 1.5,
                   np.zeros(4, dtype=np.float64), np.ones(4, dtype=bool)]


@pytest.mark.parametrize("tokens", WRONG_SEQUENCES, ids=lambda v: type(v).__name__)
def test_token_lists_of_the_wrong_type_are_refused_naming_them_and_change_nothing(tokens) -> None:
    cache, tree = tier_cache(), cpkv.PrefixTree(4)
    before = (cache.digest(), tree.digest())
    for call in (lambda: cache.lookup(tokens), lambda: cache.insert(tokens, [0]), lambda: tree.match(tokens),
                 lambda: tree.insert(tokens, [0])):
        err = refused(call, named="tokens")
        assert isinstance(err, TypeError) and isinstance(err, InvalidArgumentError)
    assert (cache.digest(), tree.digest()) == before


@pytest.mark.parametrize("item", [True, np.bool_(False), 1.0, np.float32(2), "1", b"1", None, [1], {1}],
                         ids=repr)
def test_items_of_the_wrong_type_are_refused_naming_the_position(item) -> None:
    cache = tier_cache()
    before = cache.digest()
    refused(lambda: cache.lookup([1, 2, item, 4]), named="tokens[2]")
    refused(lambda: cache.free([item]), named="pages[0]")
    refused(lambda: cache.unlock(item), named="node")
    refused(lambda: cache.allocate(item), named="n")
    alloc = cpkv.PageAllocator({"kv": 8})
    refused(lambda: alloc.reserve(item, 1), named="key")
    refused(lambda: alloc.reserve_batch([1, item], [1, 1]), named="keys[1]")
    assert cache.digest() == before and alloc.digest() == cpkv.PageAllocator({"kv": 8}).digest()


@pytest.mark.parametrize("value", [-1, 2**64, -(2**70), Index(-3)], ids=repr)
def test_ints_out_of_range_are_value_errors_naming_the_value(value) -> None:
    cache = tier_cache()
    err = refused(lambda: cache.lookup([1, 2, 3, value]), InvalidArgumentError, named="tokens[3]")
    assert not isinstance(err, TypeError)


def test_int_likes_are_accepted_everywhere_and_mean_their_value() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    forms = [tokens, tuple(tokens), range(5, 13), np.array(tokens, dtype=np.int32), np.array(tokens, dtype=np.uint64),
             np.array(tokens, dtype=object), [np.int64(t) for t in tokens], [Index(t) for t in tokens],
             (t for t in tokens), LyingLength(tokens, 2**40), LyingLength(tokens, sys.maxsize)]
    digests = set()
    for form in forms:
        cache = tier_cache()
        pages = cache.allocate(Index(2))
        out = cache.insert(form, pages, namespace=np.uint8(3))
        cache.commit(cache.issued)
        hit = cache.lookup(tokens, namespace=Index(3))
        assert hit.device_tokens == 8 and out.cached_pages == 0
        digests.add(cache.digest())
    assert len(digests) == 1


@pytest.mark.parametrize("claimed", [2**40, sys.maxsize])
def test_a_lying_len_neither_aborts_nor_panics(claimed) -> None:
    cache, tree = tier_cache(), cpkv.PrefixTree(4)
    assert cache.lookup(LyingLength([1, 2, 3, 4], claimed)).device_tokens == 0
    assert tree.match(LyingLength([1, 2, 3, 4], claimed)).length == 0
    alloc = cpkv.PageAllocator({"kv": 8})
    alloc.release_many(LyingLength([], claimed))
    assert alloc.reserve_batch(LyingLength([7], claimed), [2]).hits.tolist() == [True]


@pytest.mark.parametrize("policy", [None, 3, b"lru", ["lru"]], ids=repr)
def test_a_policy_that_is_not_a_str_is_a_typed_error(policy) -> None:
    refused(lambda: tier_cache(policy=policy), named="policy")
    refused(lambda: cpkv.PrefixTree(4, policy=policy), named="policy")


def test_an_unknown_policy_name_is_an_unknown_policy_error() -> None:
    refused(lambda: tier_cache(policy="nope"), UnknownPolicyError, named="nope")


@pytest.mark.parametrize("namespace", [True, 1.0, b"a", {"a": 1}, -1], ids=repr)
def test_bad_namespaces_are_refused(namespace) -> None:
    error = InvalidArgumentError if namespace == -1 and not isinstance(namespace, bool) else ArgumentTypeError
    refused(lambda: tier_cache().lookup([1, 2, 3, 4], namespace=namespace), error, named="namespace")


def test_sizes_and_limits_take_the_same_rule() -> None:
    refused(lambda: cpkv.PrefixTree(4, event_limit=True), named="event_limit")
    refused(lambda: cpkv.PrefixTree(4, event_limit=-1), InvalidArgumentError, named="event_limit")
    assert cpkv.PrefixTree(Index(4), event_limit=np.int16(3)).event_limit == 3
    refused(lambda: tier_cache(page_size=4.0), named="page_size")
    refused(lambda: tier_cache(device_pages=True), named="device_pages")
    refused(lambda: cpkv.PageAllocator({"kv": 8.0}), named="capacity")
    refused(lambda: cpkv.PageAllocator({"kv": 8}).reserve_many({(1, 2)}), named="requests")
    placed = cpkv.PageAllocator({"kv": 8}).reserve_many((k, 2) for k in (Index(4), np.uint32(5)))
    assert [p.key for p in placed] == [4, 5]
    runs = cpkv._cpkv.row_runs(np.array([0, 1]), np.array([0, 1]), Index(2))
    assert runs[0, 3] == 2
    refused(lambda: cpkv._cpkv.row_runs(np.array([0]), np.array([0]), True), named="source")


def test_a_batch_is_indexed_by_the_same_rule() -> None:
    batch = cpkv.PageAllocator({"kv": 8}).reserve_batch([1, 2, 3], [2, 2, 8])
    assert [p.key if p else None for p in batch] == [1, 2, None]
    assert batch[np.int64(-2)].key == batch[Index(1)].key == 2
    for bad in (True, 1.0, "0", None):
        refused(lambda b=bad: batch[b], named="batch index")
    for beyond in (3, -4, 2**70, -(2**70)):
        with pytest.raises(IndexError, match="out of range"):
            batch[beyond]


# A value Python may pass for a token: the rule accepts exactly the non-negative int-likes below 2**64.
VALUES = st.one_of(
    st.integers(min_value=-(2**65), max_value=2**65),
    st.integers(0, 2**63 - 1).map(np.int64),
    st.integers(0, 2**64 - 1).map(np.uint64),
    st.integers(-5, 2**64 + 5).map(Index),
    st.booleans(), st.floats(allow_nan=False), st.binary(max_size=2), st.text(max_size=2), st.none(),
)


def _accepted(v) -> int | None:
    if isinstance(v, (bool, float, bytes, str, type(None))):
        return None
    value = v.value if isinstance(v, Index) else int(v)
    return value if 0 <= value < 2**64 else None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(VALUES, max_size=9))
def test_every_value_is_accepted_as_its_int_or_refused_with_nothing_changed(values) -> None:
    tree = cpkv.PrefixTree(1)
    tree.insert([1, 2, 3], [0, 1, 2])
    before = tree.digest()
    want = [_accepted(v) for v in values]
    if all(w is not None for w in want):
        got = tree.match(values)
        assert got.length == tree.match(want).length
    else:
        with pytest.raises(InvalidArgumentError) as caught:
            tree.match(values)
        first_bad = want.index(None)
        assert f"tokens[{first_bad}]" in str(caught.value)
        wrong_type = isinstance(values[first_bad], (bool, float, bytes, str, type(None)))
        assert isinstance(caught.value, TypeError) == wrong_type
        assert tree.digest() == before


# ---- size limits: one number each, checked before anything is built -------------------------

def test_the_limits_are_exported_once() -> None:
    assert cpkv.MAX_PAGES == cpkv._cpkv.MAX_PAGES == 2**32
    assert cpkv.MAX_PAGE_SIZE == 2**20 and cpkv.MAX_CP_SIZE == 2**16


def test_a_cache_at_the_limits_is_built_at_once_and_one_past_them_is_refused_naming_the_key() -> None:
    started = time.perf_counter()
    cache = tier_cache(device_pages=cpkv.MAX_PAGES, host_pages=cpkv.MAX_PAGES, page_size=cpkv.MAX_PAGE_SIZE)
    alloc = cpkv.PageAllocator({"kv": cpkv.MAX_PAGES})
    assert time.perf_counter() - started < 1.0
    assert cache.allocate(3).tolist() == [0, 1, 2] and cache.stats()["free_device_pages"] == cpkv.MAX_PAGES - 3
    assert alloc.reserve(1, 5) is not None
    for key, value in [("device_pages", cpkv.MAX_PAGES + 1), ("device_pages", 2**40), ("host_pages", 2**40),
                       ("page_size", cpkv.MAX_PAGE_SIZE + 1), ("cp_size", cpkv.MAX_CP_SIZE + 1)]:
        refused(lambda k=key, v=value: tier_cache(**{k: v}), InvalidArgumentError, named=key)
    refused(lambda: cpkv.PageAllocator({"kv": cpkv.MAX_PAGES + 1}), InvalidArgumentError, named=str(cpkv.MAX_PAGES))
    refused(lambda: cpkv.PrefixTree(cpkv.MAX_PAGE_SIZE + 1), InvalidArgumentError, named="page_size")


# ---- the poison rule: a panic is an InternalError, and the object refuses from then on -------

@pytest.mark.parametrize("make", [lambda: tier_cache(), lambda: cpkv.PrefixTree(4),
                                  lambda: cpkv.PageAllocator({"kv": 8})], ids=["TierCache", "PrefixTree",
                                                                               "PageAllocator"])
def test_a_panic_is_an_internal_error_and_poisons_only_its_object(make) -> None:
    obj, other = make(), make()
    with pytest.raises(InternalError, match="inside cpkv"):
        obj._panic_for_tests()
    with pytest.raises(InternalError, match="unusable"):
        obj.digest()
    assert isinstance(other.digest(), int)


# ---- a refused call changes nothing: a cache that saw every call ends where one that saw only the
# accepted calls ends ---------------------------------------------------------------------------

BAD = st.sampled_from([-1, 2**64, 2**70, True, 1.5, "1", b"\x01", None, {1: 1}, {1}, [1.0], [-1], [True]])
TOKENS = st.lists(st.integers(0, 5), min_size=0, max_size=12)
OPS = st.one_of(
    st.tuples(st.just("lookup"), st.one_of(TOKENS, BAD)),
    st.tuples(st.just("insert"), st.one_of(TOKENS, BAD), st.integers(0, 3), st.one_of(st.none(), BAD)),
    st.tuples(st.just("unlock"), st.one_of(st.integers(0, 40), BAD)),
    st.tuples(st.just("free"), st.one_of(st.lists(st.integers(0, 20), max_size=3), BAD)),
    st.tuples(st.just("commit"), st.one_of(st.integers(0, 6), BAD)),
    st.tuples(st.just("evict"), st.one_of(st.integers(0, 8), BAD)),
)


def _call(cache: cpkv.TierCache, op: tuple) -> None:
    kind = op[0]
    if kind == "lookup":
        cache.lookup(op[1])
    elif kind == "insert":
        _, tokens, n, bad_pages = op
        pages = cache.allocate(n)
        if pages is not None:
            cache.insert(tokens, pages if bad_pages is None else bad_pages)
    elif kind == "unlock":
        cache.unlock(op[1])
    elif kind == "free":
        cache.free(op[1])
    elif kind == "commit":
        cache.commit(op[1])
    else:
        cache.evict_device(op[1])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=30))
def test_refused_calls_change_nothing(ops) -> None:
    seen_all, seen_accepted = tier_cache(device_pages=12, host_pages=6), tier_cache(device_pages=12, host_pages=6)
    for op in ops:
        before = seen_all.digest()
        if op[0] == "insert":  # the allocation is a call of its own, accepted or not
            try:
                _call(seen_all, op)
            except CpkvError:
                seen_accepted.allocate(op[2])  # what seen_all allocated before the refusal
                assert seen_all.digest() == seen_accepted.digest()
                continue
        else:
            try:
                _call(seen_all, op)
            except CpkvError:
                assert seen_all.digest() == before, op
                continue
        _call(seen_accepted, op)
        assert seen_all.digest() == seen_accepted.digest()
    assert seen_all.digest() == seen_all.digest_from_scratch()
    seen_all.check_invariants()


# ---- one error mapping: the binding raises the cpkv.errors classes it imported once ------------

@pytest.mark.parametrize("name, call", [
    ("InvalidArgumentError", lambda: tier_cache().lookup([1, 2, 3, 4], namespace=-1)),  # the argument rule
    ("ArgumentTypeError", lambda: cpkv.PrefixTree(4, policy=3)),
    ("UnknownPolicyError", lambda: tier_cache(policy="nope")),  # an evict core error
    ("UnknownNodeError", lambda: cpkv.PrefixTree(4).unlock(-1)),
    ("UnknownKeyError", lambda: cpkv.PageAllocator({"kv": 8}).release(7)),  # an allocator core error
    ("InternalError", lambda: tier_cache()._panic_for_tests()),  # the poison rule
    ("CopyTableError", lambda: cpkv._cpkv.copy_rows(np.zeros((2, 4), np.uint8), [np.zeros((2, 8), np.uint8)],
                                                    np.zeros((1, 3), np.int64))),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_binding_raises_the_classes_it_imported_once_not_names_looked_up_later(monkeypatch, name, call):
    import cpkv.errors as errors

    original = getattr(errors, name)

    class Impostor(Exception):
        pass

    # A later rebinding of the name must not change what the binding raises (it holds the class).
    monkeypatch.setattr(errors, name, Impostor)
    with pytest.raises(original) as caught:
        call()
    assert type(caught.value) is original
