"""cpkv._cpkv.OffloadIndex from Python (the vLLM manager's core; the manager itself is tested in
tests_vllm/): the flow of one request, and every bad argument refused with a typed error that names
it, changing nothing. SglangIndex's synchronous calls (``store``/``locate``/``readable``, the same
core) against the engine calls they are made of."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cpkv
from cpkv._cpkv import OffloadIndex, SglangIndex
from cpkv.errors import ArgumentTypeError, InvalidArgumentError, UnknownKeyError, UnknownPolicyError
from engine_store import store_as_engine_calls

MISS, HIT, PENDING = "miss", "hit", "pending"
CHUNK = 16


def keys(*chain: int) -> list[bytes]:
    return [bytes(chain[: i + 1]) + (0).to_bytes(4, "big") for i in range(len(chain))]


def index(capacity: int = 4, policy: str = cpkv.DEFAULT_POLICY) -> OffloadIndex:
    return OffloadIndex(capacity, policy, [CHUNK], (MISS, HIT, PENDING))


def positions(ks: list[bytes]) -> dict[bytes, int]:
    return {k: (i + 1) * CHUNK for i, k in enumerate(ks)}


def test_default_policy_is_one_of_the_policies():
    assert cpkv.DEFAULT_POLICY in cpkv.PrefixTree.POLICIES
    assert cpkv.PrefixTree(4).policy == cpkv.DEFAULT_POLICY


def test_one_request_stores_then_loads():
    ix = index()
    ks = keys(1, 2, 3)
    store, rows, evicted, evicted_rows = ix.prepare_store(ks, "a", positions(ks))
    assert store == ks and all(a is b for a, b in zip(store, ks)), "the offered objects come back"
    assert rows.dtype.name == "int32" and len(set(rows.tolist())) == 3 and evicted == []
    assert evicted_rows.dtype.name == "int32" and evicted_rows.tolist() == []
    assert [ix.lookup(k) for k in ks] == [PENDING] * 3 and ix.num_pins == 1
    ix.complete_store(ks)
    assert [ix.lookup(k, None) for k in ks] == [HIT] * 3 and ix.num_pins == 0
    assert ix.parent_of(ks[2]) == ks[1] and ix.parent_of(ks[0]) is None
    assert ix.prepare_load(ks[:2], "b", positions(ks)).tolist() == rows.tolist()[:2]
    assert set(ix.pinned_keys()) == set(ks[:2])
    ix.complete_load(ks[:2], "b")
    assert ix.num_pins == 0
    ix.check()
    more = keys(9, 9)
    _, _, evicted, _ = ix.prepare_store(more, "c", positions(more))
    assert evicted and set(evicted) <= set(ks)
    ix.check()


def test_lookup_answers_false_true_none_without_results():
    ix = OffloadIndex(3, "lru", [1])
    key = sglang_keys([1])[0].encode() + bytes(4)
    assert ix.lookup(key) is False
    ix.complete_store(ix.prepare_store([key], "r0")[0])
    assert ix.lookup(key) is True
    pending = b"pend" + bytes(4)
    assert ix.prepare_store([pending], "r") is not None
    assert ix.lookup(pending) is None


@pytest.mark.parametrize("call, error, words", [
    (lambda ix: ix.lookup("abcd"), ArgumentTypeError, "key must be bytes"),
    (lambda ix: ix.lookup(1234), ArgumentTypeError, "key must be bytes"),
    (lambda ix: ix.prepare_store([b"abcdefgh", "x"], "r"), ArgumentTypeError, "keys[1]"),
    (lambda ix: ix.prepare_store(b"abcdefgh", "r"), ArgumentTypeError, "keys"),
    (lambda ix: ix.prepare_store([b"ab"], "r"), InvalidArgumentError, "6162"),
    (lambda ix: ix.prepare_store([b"abcdefgh"], 7), ArgumentTypeError, "request"),
    (lambda ix: ix.prepare_store([b"abcdefgh"], "r", [1]), ArgumentTypeError, "positions"),
    (lambda ix: ix.prepare_store([b"abcdefgh"], "r", {b"abcdefgh": -1}), InvalidArgumentError,
     "positions[6162636465666768] = -1"),
    (lambda ix: ix.prepare_store([b"abcdefgh"], "r", {b"abcdefgh": 1.5}), ArgumentTypeError,
     "positions[6162636465666768] must be an int"),
    (lambda ix: ix.prepare_load([b"abcdefgh"], "r"), InvalidArgumentError, "6162636465666768"),
    (lambda ix: ix.row_of(b"abcdefgh"), UnknownKeyError, "6162636465666768"),
    (lambda ix: ix.evict(-1), InvalidArgumentError, "num"),
])
def test_bad_arguments_are_typed_errors_and_change_nothing(call, error, words):
    ix = index()
    ks = keys(1, 2)
    ix.prepare_store(ks, "a", positions(ks))
    before = (ix.digest(), ix.resident_keys(), ix.num_pins)
    with pytest.raises(error) as caught:
        call(ix)
    assert words in str(caught.value)
    assert (ix.digest(), ix.resident_keys(), ix.num_pins) == before


@pytest.mark.parametrize("args, error", [
    ((0, "lru", [16]), InvalidArgumentError),
    ((1 << 40, "lru", [16]), InvalidArgumentError),
    ((True, "lru", [16]), ArgumentTypeError),
    ((4, "mru", [16]), UnknownPolicyError),
    ((4, None, [16]), ArgumentTypeError),
    ((4, "lru", [0]), InvalidArgumentError),
    ((4, "lru", "16"), ArgumentTypeError),
])
def test_bad_construction_is_refused(args, error):
    with pytest.raises(error):
        OffloadIndex(*args, (MISS, HIT, PENDING))


def test_same_calls_same_digest():
    def drive(seed: int) -> int:
        ix = index(3)
        for n in range(30):
            ks = keys(seed, n % 4, n % 3)
            out = ix.prepare_store(ks, str(n), positions(ks))
            if out is not None:
                ix.complete_store(out[0], success=n % 5 != 0)
            ix.request_finished(str(n))
        ix.check()
        return ix.digest()

    assert drive(1) == drive(1) != drive(2)


# -- store / locate / readable: the synchronous calls (SGLang's HiCache backend) ----------------------

def sglang_keys(chain: list[int]) -> list[str]:
    return ["/".join(map(str, chain[: i + 1])) for i in range(len(chain))]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=8), st.integers(0, 7)),
                min_size=1, max_size=40),
       st.integers(1, 12), st.sampled_from(sorted(cpkv.PrefixTree.POLICIES)))
def test_store_is_the_engine_calls_it_is_made_of(stream, capacity, policy):
    """str keys through SglangIndex.store() against bytes keys (UTF-8 then group 0) through the engine
    calls on an OffloadIndex twin: the same rows, the same digest (serials included), after every
    call."""
    ix = SglangIndex(capacity, policy)
    twin = OffloadIndex(capacity, policy, [1], (MISS, HIT, PENDING))
    for chain, split in stream:
        strs = sglang_keys(chain)
        split %= len(strs)
        prefix = strs[split - 1] if split else None
        got = ix.store(strs[split:], prefix)
        as_bytes = [s.encode() + bytes(4) for s in strs]
        want = store_as_engine_calls(twin, as_bytes[split:], as_bytes[split - 1] if split else None)
        assert got.dtype.name == "int64" and got.shape == (len(strs) - split, 2)
        assert got[:, 0].tolist() == want and (got[:, 1] > 0).tolist() == [r >= 0 for r in want]
        assert ix.digest() == twin.digest() and twin.num_pins == 0
    ix.check()
    everything = ix.readable()
    assert sorted(everything[:, 0].tolist()) == sorted(twin.row_of(k) for k in twin.resident_keys())


def test_store_touches_places_evicts_and_refuses_from_the_end():
    ix = SglangIndex(4, "lru")
    a = sglang_keys([1, 2, 3])
    # One page per call, each continuing the one before: serials count from 1, paths chain.
    assert [ix.store([k], p)[0, 1] for k, p in zip(a, [None, *a])] == [1, 2, 3]
    assert ix.store(a[1:], a[0])[:, 1].tolist() == [2, 3], "a resident page is touched, not placed again"
    b = sglang_keys([5, 6, 7])
    # b continues nothing and needs two rows: leaves go first, so a's tail leaves and its head stays.
    placed = ix.store(b)
    assert placed[:, 1].tolist() == [4, 5, 6]
    assert ix.locate(a).tolist() == [[0, *ix.locate(a[:1])[0, 1:].tolist()]]
    # Continuing a[0] pins it; the call's own keys stay; what does not fit is refused from the end.
    c = [a[0] + "/9", a[0] + "/9/9", a[0] + "/9/9/9", a[0] + "/9/9/9/9"]
    placed = ix.store(c, a[0])
    assert placed[:, 0].tolist()[3] == -1 and (placed[:3, 0] >= 0).all()
    assert len(ix.locate([a[0]])) == 1 and len(ix) == 4
    ix.reset()
    assert ix.store(a[:1])[:, 1].tolist() == [10], "serials survive reset"


def test_reads_change_nothing():
    ix = SglangIndex(3, "lru")
    ix.store(sglang_keys([1, 2]))
    before = ix.digest()
    for _ in range(3):
        ix.locate(sglang_keys([1, 2, 3]))
        ix.readable()
    assert ix.digest() == before


@pytest.mark.parametrize("call, error, words", [
    (lambda ix: ix.store("abc"), ArgumentTypeError, "keys"),
    (lambda ix: ix.store(["abc", 7]), ArgumentTypeError, "keys[1]"),
    (lambda ix: ix.store(["abc"], 7), ArgumentTypeError, "prefix"),
    (lambda ix: ix.store([b"ab"]), InvalidArgumentError, "6162"),
    (lambda ix: ix.store(["abc"], b"ab"), InvalidArgumentError, "6162"),
    (lambda ix: ix.store(["\ud800"]), InvalidArgumentError, "keys[0]"),
    (lambda ix: ix.locate([None]), ArgumentTypeError, "keys[0]"),
    (lambda ix: ix.locate(b"abcd"), ArgumentTypeError, "keys"),
])
def test_bad_synchronous_calls_are_typed_errors_and_change_nothing(call, error, words):
    ix = SglangIndex(4, cpkv.DEFAULT_POLICY)
    ix.store(["x", "x/y"])
    before = (ix.digest(), len(ix), ix.readable().tolist())
    with pytest.raises(error) as caught:
        call(ix)
    assert words in str(caught.value)
    assert (ix.digest(), len(ix), ix.readable().tolist()) == before


@pytest.mark.parametrize("policy", sorted(cpkv.PrefixTree.POLICIES))
def test_a_call_needing_one_row_evicts_one_row_cut_from_a_tail(policy):
    """Capacity 8 holding a 6-key and a 2-key chain: a store needing one row took the whole 6-key
    chain under lru, lfu, fifo, slru, arc and s3fifo. Now one row leaves, the last of its chain, and
    the rest of that chain stays readable."""
    ix = OffloadIndex(8, policy, [CHUNK], (MISS, HIT, PENDING))
    six, two = keys(1, 2, 3, 4, 5, 6), keys(9, 8)
    for ks, request in ((six, "a"), (two, "b")):
        ix.complete_store(ix.prepare_store(ks, request, positions(ks))[0])
        ix.request_finished(request)
    ix.touch(two, "c", positions(two))
    _, _, evicted, _ = ix.prepare_store([b"new!" + bytes(4)], "d")
    assert len(evicted) == 1 and evicted[0] in (six[-1], two[-1]), evicted
    survivors = six if evicted[0] == six[-1] else two
    assert [ix.lookup(k) for k in survivors[:-1]] == [HIT] * (len(survivors) - 1)
    ix.check()


def _on_host(ix: OffloadIndex, key: bytes) -> bool:
    try:
        ix.row_of(key)
    except KeyError:
        return False
    return True


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(cpkv.PrefixTree.POLICIES)),
       st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4), st.booleans()), min_size=1, max_size=40))
def test_evicted_rows_are_the_rows_the_evicted_keys_held(policy, ops):
    """prepare_store's fourth result, checked against a reference taken before each call: the row
    each evicted key held, and every row the plan writes was free, held by an evicted key, or
    held by an offered key it rewrites."""
    capacity = 5
    ix = OffloadIndex(capacity, policy, [CHUNK], (MISS, HIT, PENDING))
    seen: set[bytes] = set()
    for n, (first, length, success) in enumerate(ops):
        ks = keys(*range(first, first + length))
        # Every chunk in a row, failed ones kept because later chunks continue them included.
        held = {k: ix.row_of(k) for k in seen if _on_host(ix, k)}
        free = set(range(capacity)) - set(held.values())
        seen.update(ks)
        out = ix.prepare_store(ks, str(n), positions(ks))
        if out is not None:
            store, rows, evicted, evicted_rows = out
            assert evicted_rows.dtype.name == "int32" and len(evicted_rows) == len(evicted)
            assert evicted_rows.tolist() == [held[k] for k in evicted]
            assert not set(evicted) & set(ix.resident_keys())
            rewritten = {held[k] for k in store if k in held}
            # A failed chunk evicted is not reported (its removal was, when it failed).
            dropped = {row for k, row in held.items() if not _on_host(ix, k) and k not in evicted}
            assert set(rows.tolist()) <= free | set(evicted_rows.tolist()) | rewritten | dropped
            ix.complete_store(store, success=success)
        ix.request_finished(str(n))
        ix.check()
