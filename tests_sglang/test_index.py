"""ReplicatedIndex, the backend's key -> (row, handle) map, in one process: it is cpkv's OffloadIndex
fed one store per SGLang store call, reads change nothing from any thread, handles are never reused."""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from cpkv import DEFAULT_POLICY
from cpkv._cpkv import OffloadIndex
from cpkv.integrations.sglang import ReplicatedIndex
from cpkv.integrations.sglang.index import Entry
from engine_store import RESULTS, store_as_engine_calls


def chain(*hashes: int) -> list[str]:
    """SGLang-shaped keys: chained SHA-256 hex page hashes."""
    keys, prior = [], ""
    for h in hashes:
        prior = hashlib.sha256(f"{prior}/{h}".encode()).hexdigest()
        keys.append(prior)
    return keys


def stream(n: int = 300) -> list[tuple[list[str], list[str] | None]]:
    """(keys, prefix_keys) of store calls: requests sharing prefixes, stored in batches of 3 pages."""
    rng = np.random.default_rng(7)
    calls = []
    for _ in range(n):
        keys = chain(*rng.integers(0, 4, size=int(rng.integers(1, 9))).tolist())
        for s in range(0, len(keys), 3):
            calls.append((keys[s:s + 3], keys[:s] or None))
    return calls


def test_it_is_the_offload_index_fed_the_same_stores():
    """Byte-exact: the same rows and digest (handles included) as an OffloadIndex fed the engine calls
    a store is documented to be (prepare_load of a readable prefix, prepare_store_fitting,
    complete_store, complete_load, request_finished), each key its documented bytes (UTF-8, then
    group 0's four bytes) and prefix_keys[-1] as the prefix."""
    ix = ReplicatedIndex(40)
    core = OffloadIndex(40, DEFAULT_POLICY, [1], RESULTS)
    for keys, prefix in stream():
        got = ix.store(keys, prefix)
        want = store_as_engine_calls(core, [k.encode() + bytes(4) for k in keys],
                                     prefix[-1].encode() + bytes(4) if prefix else None)
        assert got[:, 0].tolist() == want
        assert ix.digest() == core.digest()
    assert ix.evicted > 0 and len(ix) == len(core) <= 40
    ix.check()


def test_reads_on_other_threads_change_nothing():
    calls = stream()

    def digests(readers: int) -> list[int]:
        ix = ReplicatedIndex(40)
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                for keys, _ in calls[:50]:
                    ix.locate(keys)
                    _ = keys[0] in ix, ix.get(keys[-1]), len(ix), ix.readable()

        threads = [threading.Thread(target=read) for _ in range(readers)]
        for t in threads:
            t.start()
        try:
            out = []
            for keys, prefix in calls:
                ix.store(keys, prefix)
                out.append(ix.digest())
            return out
        finally:
            stop.set()
            for t in threads:
                t.join()

    assert digests(0) == digests(2)


def test_a_store_keeps_its_path_refuses_from_the_end_and_never_reuses_a_handle():
    ix = ReplicatedIndex(4, "lru")
    a = chain(1, 2)
    first = ix.store(a, None)
    assert first.tolist() == [[first[0, 0], 1], [first[1, 0], 2]]
    assert ix.get(a[1]) == Entry(int(first[1, 0]), 2) and a[0] in ix and "nope" not in ix
    # Continues a[1]: a's path is pinned, three new pages fit in the two free rows: the last is refused.
    b = chain(1, 2, 3, 4, 5)[2:]
    placed = ix.store(b, a)
    assert placed[:, 0].tolist()[2] == -1 and placed[:2, 1].tolist() == [3, 4]
    assert all(k in ix for k in a + b[:2]) and b[2] not in ix and ix.stores == 2
    # Reads changed nothing; a store of what is resident only touches it.
    before = ix.digest()
    ix.locate(a + b)
    assert ix.digest() == before
    assert ix.store(a, None).tolist() == first.tolist()
    ix.clear()
    assert len(ix) == 0 and ix.get(a[0]) is None
    assert ix.store(a, None)[:, 1].tolist() == [5, 6], "handles keep counting after clear"


def test_one_different_key_gives_another_digest():
    def digest(last: int) -> int:
        ix = ReplicatedIndex(16)
        for keys, prefix in stream(40):
            ix.store(keys, prefix)
        ix.store(chain(9, 9, last), None)
        return ix.digest()

    assert digest(1) == digest(1) != digest(2)
