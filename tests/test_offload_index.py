"""cpkv._cpkv.OffloadIndex from Python (the vLLM manager's core; the manager itself is tested in
tests_vllm/): the flow of one request, and every bad argument refused with a typed error that names
it, changing nothing."""

import pytest

import cpkv
from cpkv._cpkv import OffloadIndex
from cpkv.errors import ArgumentTypeError, InvalidArgumentError, UnknownKeyError, UnknownPolicyError

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
    store, rows, evicted = ix.prepare_store(ks, "a", positions(ks))
    assert store == ks and all(a is b for a, b in zip(store, ks)), "the offered objects come back"
    assert rows.dtype.name == "int32" and len(set(rows.tolist())) == 3 and evicted == []
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
    _, _, evicted = ix.prepare_store(more, "c", positions(more))
    assert evicted and set(evicted) <= set(ks)
    ix.check()


@pytest.mark.parametrize("call, error, words", [
    (lambda ix: ix.lookup("abcd"), ArgumentTypeError, "key must be bytes"),
    (lambda ix: ix.lookup(1234), ArgumentTypeError, "key must be bytes"),
    (lambda ix: ix.prepare_store([b"abcdefgh", "x"], "r"), ArgumentTypeError, "keys[1]"),
    (lambda ix: ix.prepare_store(b"abcdefgh", "r"), ArgumentTypeError, "keys"),
    (lambda ix: ix.prepare_store([b"ab"], "r"), InvalidArgumentError, "6162"),
    (lambda ix: ix.prepare_store([b"abcdefgh"], 7), ArgumentTypeError, "request"),
    (lambda ix: ix.prepare_store([b"abcdefgh"], "r", [1]), ArgumentTypeError, "positions"),
    (lambda ix: ix.prepare_store([b"abcdefgh"], "r", {b"abcdefgh": -1}), InvalidArgumentError, "positions"),
    (lambda ix: ix.prepare_store([b"abcdefgh"], "r", {b"abcdefgh": 1.5}), ArgumentTypeError, "positions"),
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
