"""cpkv.PageAllocator: semantics, the bad-input catalogue, snapshots and threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cpkv
from cpkv.errors import (
    CpkvKeyError,
    CpkvValueError,
    DuplicateKeyError,
    InvalidArgumentError,
    NotCommittedError,
    SnapshotError,
    UnknownKeyError,
    UnknownPayloadError,
)


def state(alloc: cpkv.PageAllocator):
    return alloc.digest(), alloc.canonical_digest(), len(alloc), alloc.stats(), alloc.keys()


@pytest.fixture
def alloc() -> cpkv.PageAllocator:
    a = cpkv.PageAllocator({"kv": 64, "index": 32})
    a.reserve(1, 8)
    a.mark_committed(1)
    a.reserve(2, 4, ["kv"])
    a.reserve(3, 6)
    a.release(2)
    return a


def test_first_fit_placement_and_pages():
    a = cpkv.PageAllocator({"kv": 20, "index": 20})
    for key in range(5):
        a.reserve(key, 4)
    a.release_many([1, 3])  # holes [4, 8) and [12, 16)
    p = a.reserve(10, 3)
    assert p.extents("kv") == [(4, 3)] and p.extents("index") == [(4, 3)]
    p = a.reserve(11, 5, ["kv"])  # no hole holds 5: lowest extents in order
    assert p.payloads == ["kv"]
    assert p.extents("kv") == [(7, 1), (12, 4)]
    pages = p.pages("kv")
    assert pages.dtype == np.int64 and pages.tolist() == [7, 12, 13, 14, 15]
    assert repr(p) == "Placement(key=11, num_pages=5, kv=[(7, 1), (12, 4)])"
    assert a.placement(11) == p
    with pytest.raises(UnknownPayloadError, match="index"):
        p.extents("index")
    assert a.reserve(12, 1, ["kv"]) is None  # kv is full: a counted miss
    assert a.stats()["misses"] == 1
    assert a.free_pages("kv") == 0 and a.free_pages("index") == 5


def test_payload_names_need_not_be_literals():
    """Names built at run time (not interned), str subclasses and literals resolve alike."""

    class Name(str):
        pass

    built = "".join(["in", "dex"])
    a = cpkv.PageAllocator({"kv": 16, "index": 16})
    b = cpkv.PageAllocator({"kv": 16, "index": 16})
    for key, names in enumerate([[built], [Name("kv"), built], ("index", "kv"), [Name("index")]]):
        literal = sorted(str(n) for n in names)
        assert a.reserve(key, 2, names) == b.reserve(key, 2, literal)
    assert a.digest() == b.digest()
    before = state(a)
    for names in ([built, "index"], ["kv", Name("kv")], ["".join(["k", "w"])]):
        with pytest.raises(UnknownPayloadError):
            a.reserve(99, 1, names)
    assert state(a) == before


def test_all_or_nothing_across_payloads():
    a = cpkv.PageAllocator({"kv": 10, "index": 4})
    before = state(a)
    assert a.reserve(1, 5) is None
    after = state(a)
    assert after[:3] == before[:3] and after[3]["payloads"] == before[3]["payloads"]
    assert a.reserve(1, 5, ["kv"]) is not None


def test_split_and_queries(alloc):
    alloc.split(1, 3, 10, 11)
    assert 1 not in alloc and 10 in alloc and 11 in alloc
    assert alloc.placement(10).pages("kv").tolist() == [0, 1, 2]
    assert alloc.placement(11).pages("kv").tolist() == [3, 4, 5, 6, 7]
    assert alloc.is_committed(10) and alloc.is_committed(11)
    assert alloc.stats()["splits"] == 1
    assert alloc.largest_free_extent("kv") == 46 and alloc.largest_free_extent("index") == 18


def test_reserve_many_and_release_many(alloc):
    before = state(alloc)
    placed = alloc.reserve_many([(20, 4), (21, 100), (22, 2)])
    assert placed[0].key == 20 and placed[1] is None and placed[2].key == 22
    alloc.release_many([20, 22])
    assert state(alloc)[:3] == before[:3]


def test_reserve_batch_matches_reserve_many(alloc):
    twin = cpkv.PageAllocator.restore(alloc.snapshot())
    requests = [(20, 4), (21, 100), (22, 2), (23, 30)]
    expected = twin.reserve_many(requests, ["kv"])
    batch = alloc.reserve_batch(np.array([k for k, _ in requests], dtype=np.uint64), [n for _, n in requests], ["kv"])
    assert state(alloc) == state(twin)
    assert len(batch) == 4 and list(batch) == expected and batch[-1] == expected[-1]
    assert batch.keys.dtype == np.uint64 and batch.keys.tolist() == [20, 21, 22, 23]
    assert batch.hits.tolist() == [p is not None for p in expected]
    first = batch.first_pages("kv")
    assert first.dtype == np.int64
    assert first.tolist() == [p.extents("kv")[0][0] if p else -1 for p in expected]
    assert batch.first_pages("index").tolist() == [-1] * 4  # kv only
    with pytest.raises(IndexError):
        batch[4]
    with pytest.raises(UnknownPayloadError):
        batch.first_pages("values")
    # The batch holds its placements: releasing the objects does not change it.
    alloc.release_many(np.array([20, 22], dtype=np.int64))
    assert batch[0] == expected[0] and batch[0].pages("kv").tolist() == expected[0].pages("kv").tolist()
    assert repr(batch) == "PlacementBatch(items=4, hits=3)"
    assert len(alloc.reserve_batch([], [])) == 0


def test_reserve_release_restores_digest_exactly(alloc):
    before = state(alloc)
    alloc.reserve(99, 5)
    assert alloc.digest() != before[0]
    alloc.release(99)
    assert state(alloc)[:3] == before[:3]
    assert alloc.free_extents("kv") == [(8, 4), (18, 46)]


def test_same_objects_at_other_pages_have_other_digests():
    a = cpkv.PageAllocator({"kv": 16})
    b = cpkv.PageAllocator({"kv": 16})
    a.reserve(1, 2)
    a.reserve(2, 2)
    b.reserve(2, 2)
    b.reserve(1, 2)
    assert a.digest() != b.digest() and a.canonical_digest() != b.canonical_digest()
    b.release_many([1, 2])
    b.reserve(1, 2)
    b.reserve(2, 2)
    assert a.digest() == b.digest() and a.canonical_digest() == b.canonical_digest()


# (description, call, exception class): every bad input must raise and change nothing.
BAD_INPUTS = [
    ("zero pages", lambda a: a.reserve(50, 0), InvalidArgumentError),
    ("negative pages", lambda a: a.reserve(50, -3), InvalidArgumentError),
    ("pages not an int", lambda a: a.reserve(50, 2.5), InvalidArgumentError),
    ("pages beyond u64", lambda a: a.reserve(50, 2**64), InvalidArgumentError),
    ("negative key", lambda a: a.reserve(-1, 2), InvalidArgumentError),
    ("key beyond u64", lambda a: a.reserve(2**64, 2), InvalidArgumentError),
    ("key not an int", lambda a: a.reserve("7", 2), InvalidArgumentError),
    ("duplicate key", lambda a: a.reserve(1, 2), DuplicateKeyError),
    ("unknown payload", lambda a: a.reserve(50, 2, ["kv", "values"]), UnknownPayloadError),
    ("empty payload name", lambda a: a.reserve(50, 2, [""]), UnknownPayloadError),
    ("repeated payload", lambda a: a.reserve(50, 2, ["kv", "kv"]), UnknownPayloadError),
    ("payload not a str", lambda a: a.reserve(50, 2, [3]), UnknownPayloadError),
    ("empty payload list", lambda a: a.reserve(50, 2, []), InvalidArgumentError),
    ("payloads as a bare str", lambda a: a.reserve(50, 2, "kv"), InvalidArgumentError),
    ("batch with a zero count", lambda a: a.reserve_many([(50, 1), (51, 0)]), InvalidArgumentError),
    ("batch with a live key", lambda a: a.reserve_many([(50, 1), (3, 1)]), DuplicateKeyError),
    ("batch with a repeated key", lambda a: a.reserve_many([(50, 1), (50, 1)]), DuplicateKeyError),
    ("batch with a bad item", lambda a: a.reserve_many([(50, 1), (51,)]), InvalidArgumentError),
    ("batch with a bad payload", lambda a: a.reserve_many([(50, 1)], ["x"]), UnknownPayloadError),
    ("batch arrays of unequal length", lambda a: a.reserve_batch([50, 51], [1]), InvalidArgumentError),
    ("batch array with a zero count", lambda a: a.reserve_batch(np.array([50, 51]), np.array([1, 0])),
     InvalidArgumentError),
    ("batch array with a negative key", lambda a: a.reserve_batch(np.array([50, -1]), np.array([1, 1])),
     InvalidArgumentError),
    ("batch array with a negative count", lambda a: a.reserve_batch([50], np.array([-2], dtype=np.int8)),
     InvalidArgumentError),
    ("batch array of floats", lambda a: a.reserve_batch(np.array([50.0]), [1]), InvalidArgumentError),
    ("batch array 2-D", lambda a: a.reserve_batch(np.zeros((1, 1), dtype=np.uint64), [1]), InvalidArgumentError),
    ("batch keys a str", lambda a: a.reserve_batch("50", [1]), InvalidArgumentError),
    ("batch keys not iterable", lambda a: a.reserve_batch(50, 1), InvalidArgumentError),
    ("batch array with a live key", lambda a: a.reserve_batch(np.array([50, 3], dtype=np.uint64), [1, 1]),
     DuplicateKeyError),
    ("batch array with a repeated key", lambda a: a.reserve_batch(np.array([50, 50]), [1, 1]), DuplicateKeyError),
    ("batch array with a bad payload", lambda a: a.reserve_batch([50], [1], ["x"]), UnknownPayloadError),
    ("release_many array with unknown", lambda a: a.release_many(np.array([3, 50], dtype=np.uint64)),
     UnknownKeyError),
    ("release_many array negative", lambda a: a.release_many(np.array([3, -1])), InvalidArgumentError),
    ("release_many array of floats", lambda a: a.release_many(np.array([3.0])), InvalidArgumentError),
    ("release unknown", lambda a: a.release(50), UnknownKeyError),
    ("release key beyond u64", lambda a: a.release(2**70), InvalidArgumentError),
    ("release_many with unknown", lambda a: a.release_many([3, 50]), UnknownKeyError),
    ("release_many repeated", lambda a: a.release_many([3, 3]), DuplicateKeyError),
    ("commit unknown", lambda a: a.mark_committed(50), UnknownKeyError),
    ("split unknown", lambda a: a.split(50, 1, 60, 61), UnknownKeyError),
    ("split uncommitted", lambda a: a.split(3, 2, 60, 61), NotCommittedError),
    ("split at 0", lambda a: a.split(1, 0, 60, 61), InvalidArgumentError),
    ("split at len", lambda a: a.split(1, 8, 60, 61), InvalidArgumentError),
    ("split beyond len", lambda a: a.split(1, 9, 60, 61), InvalidArgumentError),
    ("split at negative", lambda a: a.split(1, -1, 60, 61), InvalidArgumentError),
    ("split onto same keys", lambda a: a.split(1, 4, 60, 60), InvalidArgumentError),
    ("split onto live key", lambda a: a.split(1, 4, 3, 61), DuplicateKeyError),
    ("split onto itself", lambda a: a.split(1, 4, 60, 1), DuplicateKeyError),
    ("split key beyond u64", lambda a: a.split(1, 4, 60, -5), InvalidArgumentError),
    ("placement unknown", lambda a: a.placement(50), UnknownKeyError),
    ("is_committed unknown", lambda a: a.is_committed(50), UnknownKeyError),
    ("free_pages unknown payload", lambda a: a.free_pages("values"), UnknownPayloadError),
    ("largest_free_extent empty name", lambda a: a.largest_free_extent(""), UnknownPayloadError),
]


@pytest.mark.parametrize("call,error", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_and_changes_nothing(alloc, call, error):
    before = state(alloc)
    with pytest.raises(error) as info:
        call(alloc)
    assert state(alloc) == before
    assert str(info.value)  # a message, naming the value
    # Lookup failures are KeyErrors, bad arguments ValueErrors.
    assert isinstance(info.value, CpkvKeyError if issubclass(error, KeyError) else CpkvValueError)


def test_error_messages_name_the_culprit(alloc):
    with pytest.raises(DuplicateKeyError, match="key 1 "):
        alloc.reserve(1, 2)
    with pytest.raises(UnknownPayloadError, match="values"):
        alloc.reserve(50, 2, ["values"])
    with pytest.raises(InvalidArgumentError, match="-3"):
        alloc.reserve(50, -3)
    with pytest.raises(InvalidArgumentError, match=str(2**64)):
        alloc.release(2**64)
    with pytest.raises(InvalidArgumentError, match="split position 8"):
        alloc.split(1, 8, 60, 61)


@pytest.mark.parametrize(
    "pools,error",
    [
        ({}, InvalidArgumentError),
        ({"kv": 0}, InvalidArgumentError),
        ({"kv": -4}, InvalidArgumentError),
        ({"kv": 2**63}, InvalidArgumentError),
        ({"": 4}, UnknownPayloadError),
        ({7: 4}, UnknownPayloadError),
        ([("kv", 4)], InvalidArgumentError),
    ],
)
def test_bad_construction(pools, error):
    with pytest.raises(error):
        cpkv.PageAllocator(pools)


def test_pool_order_is_construction_order():
    a = cpkv.PageAllocator({"index": 8, "kv": 8})
    p = a.reserve(1, 2, ["kv", "index"])
    assert p.payloads == ["index", "kv"] == a.payloads
    assert cpkv.PageAllocator({"index": 8, "kv": 8}).digest() != cpkv.PageAllocator({"kv": 8, "index": 8}).digest()


# -- snapshots ----------------------------------------------------------------


def test_snapshot_round_trip_behaves_identically(alloc):
    restored = cpkv.PageAllocator.restore(alloc.snapshot())
    assert state(restored) == state(alloc)
    for a in (alloc, restored):
        a.reserve(40, 7)
        a.split(1, 5, 41, 42)
        a.release(3)
        a.reserve(43, 9, ["index"])
    assert state(restored) == state(alloc)
    assert restored.placement(43) == alloc.placement(43)
    assert cpkv.PageAllocator.restore(bytearray(alloc.snapshot())).digest() == alloc.digest()


def test_every_truncation_is_a_snapshot_error(alloc):
    data = alloc.snapshot()
    for cut in range(len(data)):
        with pytest.raises(SnapshotError):
            cpkv.PageAllocator.restore(data[:cut])
    with pytest.raises(SnapshotError):
        cpkv.PageAllocator.restore(data + b"\0")


def test_every_flipped_byte_is_a_snapshot_error(alloc):
    data = alloc.snapshot()
    for i in range(len(data)):
        for mask in (0x01, 0xFF):
            bad = bytearray(data)
            bad[i] ^= mask
            with pytest.raises(SnapshotError):
                cpkv.PageAllocator.restore(bytes(bad))


@pytest.mark.parametrize("data", [None, "text", 17, [1, 2]])
def test_restore_rejects_non_bytes(data):
    with pytest.raises(SnapshotError):
        cpkv.PageAllocator.restore(data)


# -- threads ------------------------------------------------------------------


def test_threads_hammering_one_allocator():
    pools = {"kv": 4096, "index": 2048}
    a = cpkv.PageAllocator(pools)
    start = (a.digest(), a.canonical_digest())
    n_threads, rounds = 8, 300
    errors: list[BaseException] = []
    placed_pages = [0] * n_threads

    def work(t: int) -> None:
        try:
            base = t * 1_000_000
            live = []
            for i in range(rounds):
                key = base + i
                p = a.reserve(key, 1 + (i * 7 + t) % 9, None if i % 3 else ["kv"])
                if p is not None:
                    live.append(key)
                    placed_pages[t] += p.num_pages
                    assert p.key == key
                if i % 5 == 4 and live:
                    a.mark_committed(live[-1])
                    if a.placement(live[-1]).num_pages > 1:
                        a.split(live[-1], 1, key + 500_000, key + 700_000)
                        live[-1:] = [key + 500_000, key + 700_000]
                if i % 4 == 3:
                    a.release_many(live[: len(live) // 2])
                    del live[: len(live) // 2]
            a.release_many(live)
        except BaseException as err:  # surfaced in the main thread
            errors.append(err)

    done = threading.Event()
    audits = [0]

    def audit() -> None:
        # snapshot/canonical_digest/verify release the GIL while they hold the
        # allocator's lock: every snapshot taken mid-flight must be consistent.
        try:
            while not done.is_set():
                restored = cpkv.PageAllocator.restore(a.snapshot())
                restored.verify()
                a.canonical_digest()
                audits[0] += 1
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    auditor = threading.Thread(target=audit)
    auditor.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
        assert not th.is_alive()
    done.set()
    auditor.join(timeout=120)
    assert not auditor.is_alive()
    assert not errors, errors
    assert audits[0] > 0
    a.verify()
    assert len(a) == 0
    assert (a.digest(), a.canonical_digest()) == start
    assert all(a.free_extents(name) == [(0, cap)] for name, cap in pools.items())
    stats = a.stats()
    assert stats["reserves"] + stats["misses"] == n_threads * rounds
    assert stats["releases"] == stats["reserves"] + stats["splits"]
    assert sum(placed_pages) > 0
