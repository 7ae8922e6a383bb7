"""cpkv._cpkv.OffloadIndex (and SglangIndex, its synchronous ``store``/``locate`` for SGLang) refuses
what it cannot take exactly, by name, and a refused call changes nothing: key collections whose order is not the caller's, numpy text keys that lost their trailing
NUL bytes, keys too short to name their group (on every call), flags and results of the wrong type;
and one hypothesis test over every call, good and bad arguments mixed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cpkv
from cpkv._cpkv import OffloadIndex, SglangIndex
from cpkv.errors import ArgumentTypeError, CpkvError, InvalidArgumentError

MISS, HIT, PENDING = "miss", "hit", "pending"


def key(*chain: int) -> bytes:
    return bytes(chain) + bytes(4)


def chain(*ids: int) -> list[bytes]:
    return [key(*ids[: i + 1]) for i in range(len(ids))]


def ends(ks: list[bytes]) -> dict[bytes, int]:
    return {k: i + 1 for i, k in enumerate(ks)}


def loaded_index() -> OffloadIndex:
    """Two readable keys, one store in flight."""
    ix = OffloadIndex(8, "lru", [1], (MISS, HIT, PENDING))
    ks = chain(1, 2)
    ix.complete_store(ix.prepare_store(ks, "a", ends(ks))[0])
    ix.prepare_store([key(7)], "b")
    return ix


def loaded_sglang_index() -> SglangIndex:
    """Two readable keys, stored the synchronous way."""
    ix = SglangIndex(8, "lru")
    ix.store(chain(1, 2))
    return ix


def observed(ix: OffloadIndex | SglangIndex) -> tuple:
    """Everything a caller can see of an index."""
    if isinstance(ix, SglangIndex):
        return ix.digest(), len(ix), ix.stats(), ix.readable().tolist()
    return (ix.digest(), ix.resident_keys(), ix.pinned_keys(), ix.num_pins, len(ix), ix.stats(),
            [ix.row_of(k) for k in ix.resident_keys()])


def loaded(call) -> OffloadIndex | SglangIndex:
    """The loaded index a call is made on: SglangIndex for its own calls."""
    return loaded_sglang_index() if call in SGLANG_CALLS else loaded_index()


def refused(ix: OffloadIndex | SglangIndex, call, error: type, *words: str) -> None:
    before = observed(ix)
    with pytest.raises(error) as caught:
        call(ix)
    for word in words:
        assert word in str(caught.value), str(caught.value)
    assert observed(ix) == before


def sglang_store(ix, ks):
    return ix.store(ks)


def sglang_locate(ix, ks):
    return ix.locate(ks)


def sglang_store_prefix(ix, prefix):
    return ix.store(["x"], prefix)


SGLANG_CALLS = (sglang_store, sglang_locate, sglang_store_prefix)


# ---- order: what decides rows and paths must come in the caller's order ----------------------------

UNORDERED = [
    ("set", lambda ks: set(ks)),
    ("frozenset", lambda ks: frozenset(ks)),
    ("dict", lambda ks: dict.fromkeys(ks)),
    ("dict keys", lambda ks: dict.fromkeys(ks).keys()),
    ("dict values", lambda ks: dict(enumerate(ks)).values()),
    ("dict items", lambda ks: dict.fromkeys(ks).items()),
]


@pytest.mark.parametrize("make", [m for _, m in UNORDERED], ids=[n for n, _ in UNORDERED])
@pytest.mark.parametrize("call", [
    lambda ix, ks: ix.prepare_store(ks, "r"),
    lambda ix, ks: ix.prepare_load(ks, "r"),
    lambda ix, ks: ix.touch(ks, "r"),
    sglang_store,
    sglang_locate,
], ids=["prepare_store", "prepare_load", "touch", "store", "locate"])
def test_unordered_key_collections_are_refused(call, make):
    refused(loaded(call), lambda ix: call(ix, make(chain(1, 2, 3))), ArgumentTypeError, "ordered")


def test_a_set_of_keys_no_longer_makes_the_digest_depend_on_the_hash_seed():
    code = ("from cpkv._cpkv import OffloadIndex\n"
            "ix = OffloadIndex(8, 'lru', [1])\n"
            "keys = [bytes([i, j]) + bytes(4) for i in range(3) for j in range(3)]\n"
            "try:\n"
            "    ix.prepare_store(set(keys), 'r')\n"
            "except TypeError as err:\n"
            "    print('refused', type(err).__name__)\n"
            "ix.prepare_store(sorted(keys), 'r')\n"
            "print(ix.digest())\n")
    outputs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(seed)},
                              capture_output=True, text=True, check=True).stdout for seed in (1, 2, 3)}
    assert len(outputs) == 1 and outputs.pop().startswith("refused ArgumentTypeError")


@pytest.mark.parametrize("container", [set, frozenset, list, tuple])
def test_completions_take_any_collection_and_its_order_does_not_matter(container):
    """vLLM completes Python sets: a completion's effect does not depend on the order."""
    twins = [OffloadIndex(8, policy, [1]) for policy in ("lru", "lru")]
    ks = chain(1, 2, 3) + chain(5, 6)
    for ix in twins:
        ix.prepare_store(ks[:3], "a", ends(ks[:3]))
        ix.prepare_store(ks[3:], "b", ends(ks[3:]))
    twins[0].complete_store(container(ks))
    twins[1].complete_store(container(reversed(ks)))
    assert twins[0].digest() == twins[1].digest()
    assert [t.lookup(k) for t in twins for k in ks] == [True] * 10
    for ix in twins:
        ix.prepare_load(ks[:2], "l")
        ix.complete_load(container(reversed(ks[:2])), "l")
        assert ix.num_pins == 0


# ---- numpy text keys lose their trailing NUL bytes: refused, naming why ----------------------------

NUL_TAILED = b"abcdef" + bytes(4)  # an S10 array gives back b"abcdef": another key, of group "cdef"


@pytest.mark.parametrize("call", [
    lambda ix, ks: ix.prepare_store(ks, "r"),
    sglang_store,
    sglang_locate,
    lambda ix, ks: ix.complete_store(ks),
    lambda ix, ks: ix.complete_load(ks, "r"),
], ids=["prepare_store", "store", "locate", "complete_store", "complete_load"])
@pytest.mark.parametrize("make", [
    lambda: np.array([NUL_TAILED], dtype="S10"),
    lambda: list(np.array([NUL_TAILED], dtype="S10")),
    lambda: np.array(["abc\0"], dtype="U4"),
    lambda: [np.str_("abc")],
], ids=["S array", "S items", "U array", "U items"])
def test_numpy_text_keys_are_refused_naming_the_lost_nul_bytes(call, make):
    refused(loaded(call), lambda ix: call(ix, make()), ArgumentTypeError, "NUL")


@pytest.mark.parametrize("call", [
    lambda ix, k: ix.lookup(k), lambda ix, k: ix.row_of(k), lambda ix, k: ix.parent_of(k),
    lambda ix, k: ix.is_storing(k), sglang_store_prefix,
], ids=["lookup", "row_of", "parent_of", "is_storing", "store prefix"])
def test_a_numpy_bytes_key_is_refused_in_one_key_calls(call):
    refused(loaded(call), lambda ix: call(ix, np.array([NUL_TAILED], dtype="S10")[0]), ArgumentTypeError,
            "NUL")


def test_an_object_array_of_bytes_keeps_every_byte():
    ix = loaded_sglang_index()
    ix.store(np.array([NUL_TAILED], dtype=object))
    assert len(ix.locate([NUL_TAILED])) == 1


# ---- keys shorter than the four bytes that name their group: refused by every call ----------------

SHORT = b"ab"


@pytest.mark.parametrize("call", [
    lambda ix: ix.lookup(SHORT),
    lambda ix: ix.row_of(SHORT),
    lambda ix: ix.parent_of(SHORT),
    lambda ix: ix.is_storing(SHORT),
    lambda ix: ix.prepare_load([SHORT], "r"),
    lambda ix: ix.complete_load([SHORT], "r"),
    lambda ix: ix.touch([SHORT], "r"),
    lambda ix: ix.prepare_store([SHORT], "r"),
    lambda ix: ix.complete_store([SHORT]),
    lambda ix: ix.complete_store({SHORT}),
], ids=["lookup", "row_of", "parent_of", "is_storing", "prepare_load", "complete_load", "touch",
        "prepare_store", "complete_store", "complete_store set"])
def test_a_key_shorter_than_its_group_is_refused_by_every_call(call):
    refused(loaded_index(), call, InvalidArgumentError, "6162", "4 bytes")


@pytest.mark.parametrize("call, keys", [(sglang_store, [SHORT]), (sglang_store_prefix, SHORT),
                                        (sglang_locate, [SHORT])], ids=["store", "store prefix", "locate"])
def test_a_key_shorter_than_its_group_is_refused_by_every_sglang_call(call, keys):
    refused(loaded_sglang_index(), lambda ix: call(ix, keys), InvalidArgumentError, "6162", "4 bytes")


# ---- flags and results ------------------------------------------------------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda ix: ix.complete_store([key(7)], 1), "success must be a bool"),
    (lambda ix: ix.complete_store([key(7)], None), "success must be a bool"),
    (lambda ix: ix.complete_store([key(7)], "no"), "success must be a bool"),
    (lambda ix: ix.complete_store([key(7)], success=0.0), "success must be a bool"),
    (lambda ix: ix.complete_store([key(7)], True, 2), "report must be a bool"),
    (lambda ix: ix.complete_store([key(7)], report=None), "report must be a bool"),
    (lambda ix: ix.prepare_store([key(9)], "\ud800"), "request is a str that is not valid UTF-8"),
])
def test_bad_flags_are_typed_errors_that_name_them(call, words):
    refused(loaded_index(), call, ArgumentTypeError if "bool" in words else InvalidArgumentError, words)


def test_numpy_bools_are_flags():
    ix = loaded_index()
    assert ix.complete_store([key(7)], np.bool_(True), np.bool_(True)) == [key(7)]


@pytest.mark.parametrize("results, error, words", [
    ((1, 2), InvalidArgumentError, "3 objects"),
    ((1, 2, 3, 4), InvalidArgumentError, "3 objects"),
    (5, ArgumentTypeError, "results must be None or a tuple"),
    ([1, 2, 3], ArgumentTypeError, "results must be None or a tuple"),
    ("abc", ArgumentTypeError, "results must be None or a tuple"),
])
def test_bad_results_are_typed_errors(results, error, words):
    with pytest.raises(error, match=words):
        OffloadIndex(8, "lru", [1], results)


def test_results_none_is_the_default():
    assert OffloadIndex(8, "lru", [1], None).lookup(key(1)) is False


# ---- a refused call changes nothing: an index that saw every call ends where one that saw only the
# accepted ones ends --------------------------------------------------------------------------------

GOOD_KEY = st.lists(st.integers(0, 2), min_size=1, max_size=4).map(lambda c: key(*c))
GOOD_KEYS = st.lists(st.integers(0, 2), min_size=1, max_size=5).map(lambda c: chain(*c))
BAD_KEY = st.sampled_from([SHORT, "str", 7, None, 1.5, True, bytearray(b"abcdefgh"),
                           np.array([NUL_TAILED], dtype="S10")[0]])
BAD_KEYS = st.one_of(
    GOOD_KEYS.map(set), GOOD_KEYS.map(frozenset), GOOD_KEYS.map(lambda ks: dict.fromkeys(ks).keys()),
    GOOD_KEYS.map(lambda ks: np.array(ks, dtype="S")), GOOD_KEYS.map(lambda ks: ks + [SHORT]),
    st.sampled_from([b"abcdefgh", "abcdefgh", 5, None, [None], [1.5]]),
)
KEYS = st.one_of(GOOD_KEYS, GOOD_KEYS, BAD_KEYS)
KEY = st.one_of(GOOD_KEY, GOOD_KEY, BAD_KEY)
REQUEST = st.one_of(st.sampled_from(["r0", "r1", "r2"]), st.sampled_from([7, None, b"r0", "\ud800"]))
POSITIONS = st.one_of(st.none(), st.just("ends"), st.sampled_from([[1], {key(0): -1}, {key(0): 1.5}, 3]))
FLAG = st.one_of(st.booleans(), st.sampled_from([1, 0, None, "no", 2.0]))
NUM = st.one_of(st.integers(0, 4), st.sampled_from([-1, 1.5, True, "1", None, 2**64]))
PREFIX = st.one_of(st.none(), GOOD_KEY, BAD_KEY)

OPS = st.one_of(
    st.tuples(st.just("lookup"), KEY),
    st.tuples(st.just("prepare_load"), KEYS, REQUEST, POSITIONS),
    st.tuples(st.just("complete_load"), KEYS, REQUEST),
    st.tuples(st.just("touch"), KEYS, REQUEST, POSITIONS),
    st.tuples(st.just("prepare_store"), KEYS, REQUEST, POSITIONS),
    st.tuples(st.just("complete_store"), KEYS, FLAG, FLAG),
    st.tuples(st.just("request_finished"), REQUEST),
    st.tuples(st.just("evict"), NUM),
    st.tuples(st.just("row_of"), KEY),
    st.tuples(st.just("parent_of"), KEY),
    st.tuples(st.just("is_storing"), KEY),
    st.tuples(st.just("reset")),
)


SGLANG_OPS = st.one_of(
    st.tuples(st.just("store"), KEYS, PREFIX),
    st.tuples(st.just("locate"), KEYS),
    st.tuples(st.just("reset")),
)


def _apply(ix: OffloadIndex | SglangIndex, op: tuple):
    name, *args = op
    if name in ("prepare_load", "touch", "prepare_store") and args[2] == "ends":
        args[2] = ends(args[0]) if isinstance(args[0], list) else None
    return getattr(ix, name)(*args)


def _same_answer(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.tolist() == b.tolist()
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same_answer, a, b))
    return a == b


def replay_checking_refusals(seen_all, seen_accepted, ops) -> None:
    """Applies ``ops`` to ``seen_all``: a refused one (a CpkvError) must change nothing, an accepted one
    must answer and end as on ``seen_accepted``, which sees only the accepted ones. Anything else
    escaping (a builtin TypeError, say) fails the test."""
    for op in ops:
        before = observed(seen_all)
        try:
            answer = _apply(seen_all, op)
        except CpkvError:
            assert observed(seen_all) == before, op
            continue
        assert _same_answer(answer, _apply(seen_accepted, op)), op
        assert observed(seen_all) == observed(seen_accepted), op
    seen_all.check()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=40), st.sampled_from(sorted(cpkv.PrefixTree.POLICIES)))
def test_refused_calls_change_nothing(ops, policy):
    replay_checking_refusals(OffloadIndex(5, policy, [1], (MISS, HIT, PENDING)),
                             OffloadIndex(5, policy, [1], (MISS, HIT, PENDING)), ops)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SGLANG_OPS, max_size=30), st.sampled_from(sorted(cpkv.PrefixTree.POLICIES)))
def test_refused_sglang_calls_change_nothing(ops, policy):
    replay_checking_refusals(SglangIndex(5, policy), SglangIndex(5, policy), ops)
