"""A tree that runs for weeks: bounded memory, typed errors for every extreme
argument, safe sharing between threads, and ranks rebuilt from a peer's snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch.distributed as dist

import cpkv
from cpkv.errors import CpkvError, InvalidArgumentError, SnapshotError, UnknownNodeError
from cpkv.runtime.launch import run_ranks


def test_rss_stays_flat_over_a_million_insert_evict_operations(tmp_path) -> None:
    out = tmp_path / "memory.json"
    subprocess.run([sys.executable, "-m", "cpkv", "bench", "tree-memory", "--ops", "1000000", "--json", str(out)],
                   capture_output=True, text=True, timeout=600, check=True)
    r = json.loads(out.read_text())
    assert r["nodes"] < 2100 and r["node_slots"] < 2200, r
    assert r["rss_end_mib"] - r["rss_warm_mib"] < 10, r


def test_one_off_namespaces_and_undrained_events_stay_bounded() -> None:
    tree = cpkv.PrefixTree(1, event_limit=100)
    for ns in range(20_000):
        m = tree.match([1, 2, 3], namespace=f"tenant-{ns}")
        tree.lock(m.node)  # the miss's root is usable right after the match
        tree.unlock(m.node)
    assert tree.namespaces <= 1025 and tree.node_slots <= 1026
    for i in range(500):
        tree.insert([i], [i])
    assert len(tree.take_events()) == 100 and tree.dropped_events == 400
    tree.check_invariants()


def _seeded_tree() -> cpkv.PrefixTree:
    tree = cpkv.PrefixTree(2, policy="ghost")
    for i in range(60):
        tokens = [i % 7, 1, i % 5, 2, i, 3]
        if tree.device_pages + 3 > 40:
            tree.evict(3)
        m = tree.match(tokens)
        pages = list(m.device_pages) + [1000 + 3 * i + k for k in range(3 - len(m.device_pages))]
        tree.insert(tokens, pages)
    return tree


EXTREMES = [
    ("lock", (2**63,), UnknownNodeError),
    ("lock", (2**64 - 1,), UnknownNodeError),
    ("lock", (2**64,), InvalidArgumentError),
    ("lock", (-1,), UnknownNodeError),
    ("lock", (1.5,), InvalidArgumentError),
    ("lock", (True,), InvalidArgumentError),
    ("lock", ("3",), InvalidArgumentError),
    ("lock", (np.bool_(True),), InvalidArgumentError),
    ("unlock", (10**30,), InvalidArgumentError),
    ("evict", (-1,), InvalidArgumentError),
    ("evict", (2**64,), InvalidArgumentError),
    ("evict", (0.5,), InvalidArgumentError),
    ("evict_host", (None,), InvalidArgumentError),
    ("set_host", (1, 2**64), InvalidArgumentError),
    ("set_host", (1, -5), InvalidArgumentError),
    ("set_host", (1, True), InvalidArgumentError),
    ("set_host", (2**63, 2**64 - 1), UnknownNodeError),
    ("insert", ([1, 2], [2**64]), InvalidArgumentError),
    ("insert", ([1, 2], [True]), InvalidArgumentError),
    ("insert", ([1.0, 2], [7]), InvalidArgumentError),
    ("insert", (np.array([1, -2]), [7]), InvalidArgumentError),
    ("insert", (np.array([[1, 2]]), [7]), InvalidArgumentError),
    ("insert", (np.array([1.0, 2.0]), [7]), InvalidArgumentError),
    ("match", ([1, 2**64],), InvalidArgumentError),
    ("match", ("12",), InvalidArgumentError),
    ("attach_device", (2**63, [1]), UnknownNodeError),
]


@pytest.mark.parametrize(("method", "args", "error"), EXTREMES,
                         ids=[f"{m}{a!r}"[:40] for m, a, _ in EXTREMES])
def test_extreme_arguments_are_typed_errors_and_change_nothing(method, args, error) -> None:
    tree = _seeded_tree()
    before = (tree.digest(), tree.canonical_digest(), tree.clock)
    with pytest.raises(error) as info:
        getattr(tree, method)(*args)
    assert isinstance(info.value, CpkvError)
    assert (tree.digest(), tree.canonical_digest(), tree.clock) == before


def test_keys_up_to_2_64_are_accepted() -> None:
    tree = cpkv.PrefixTree(1)
    node = tree.insert([5], [1]).node
    tree.set_host(node, 2**64 - 1)
    assert tree.evict(2**63)[0].node == node  # a count beyond what is there evicts all
    (victim,) = tree.evict_host(1)
    assert victim.object_key == 2**64 - 1
    numpy_node = tree.insert(np.array([6], dtype=np.uint64), np.array([2], dtype=np.int32)).node
    tree.lock(np.uint64(numpy_node))
    tree.unlock(numpy_node)


@pytest.mark.parametrize("kwargs", [{"page_size": 0}, {"page_size": 2**40}, {"page_size": -1},
                                    {"page_size": 1.0}, {"page_size": True}])
def test_bad_construction_is_refused(kwargs) -> None:
    with pytest.raises(InvalidArgumentError):
        cpkv.PrefixTree(**kwargs)


@pytest.mark.parametrize("pools", [{"kv": 2**40}, {"kv": 2**62}, {"kv": 2**64}, {"kv": 0}])
def test_allocator_capacities_beyond_the_maximum_are_refused(pools) -> None:
    with pytest.raises(InvalidArgumentError):
        cpkv.PageAllocator(pools)


def test_the_largest_pool_reserves_and_releases_without_an_abort() -> None:
    alloc = cpkv.PageAllocator({"kv": 2**32})
    placement = alloc.reserve(1, 2**32)
    assert placement is not None and placement.num_pages == 2**32
    assert alloc.reserve(2, 1) is None
    alloc.release(1)


def test_eight_threads_share_one_tree_and_one_allocator() -> None:
    tree = cpkv.PrefixTree(2, policy="slru")
    alloc = cpkv.PageAllocator({"kv": 4096})
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        try:
            for i in range(1500):
                tokens = rng.integers(0, 6, size=2 * int(rng.integers(1, 5)))
                m = tree.match(tokens, namespace=t % 3)
                try:
                    tree.lock(m.node)
                    tree.unlock(m.node)
                except CpkvError:
                    pass  # another thread may have evicted the node in between
                pages = np.arange(len(tokens) // 2) + (t * 1_000_000 + i * 8)
                try:
                    tree.insert(tokens, pages, namespace=t % 3)
                except CpkvError:
                    pass
                if i % 5 == 0:
                    tree.evict(4)
                key = t * 10_000 + i
                if alloc.reserve(key, int(rng.integers(1, 8))) is not None:
                    alloc.release(key)
        except BaseException as err:  # noqa: BLE001 -- any error fails the test below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors[:3]
    tree.check_invariants()
    alloc.verify()
    assert len(alloc) == 0


def test_snapshots_round_trip_and_garbage_is_a_snapshot_error() -> None:
    tree = _seeded_tree()
    copy = cpkv.PrefixTree.restore(tree.snapshot())
    assert (copy.digest(), copy.canonical_digest(), len(copy)) == (tree.digest(), tree.canonical_digest(), len(tree))
    assert len(tree.canonical_digest()) == 32
    for bad in (b"", b"CPKVTREE" + bytes(60), tree.snapshot()[:-1], "text"):
        with pytest.raises(SnapshotError):
            cpkv.PrefixTree.restore(bad)


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "ghost"])
def test_policy_memory_is_reported_and_survives_a_snapshot(policy) -> None:
    tree = cpkv.PrefixTree(2, policy=policy)
    for i in range(300):
        tokens = [i % 37, 1, i % 11, 2]
        if tree.device_pages + 2 > 24:
            tree.evict(2)
        m = tree.match(tokens)
        tree.insert(tokens, list(m.device_pages) + [1000 + 2 * i + k for k in range(2 - len(m.device_pages))])
    memory = tree.policy_memory()
    assert set(memory) == {"remembered_pages", "shadow_nodes", "shadow_pages"}
    assert (memory["remembered_pages"] > 0) == (policy != "lru"), memory
    assert (memory["shadow_nodes"] > 0) == (policy == "ghost"), memory
    assert memory["shadow_pages"] <= 3 * 5 * 24, memory  # three shadows, each <= capacity + 4x history
    assert cpkv.PrefixTree.restore(tree.snapshot()).policy_memory() == memory


def _rejoin(rank: int, world: int, policy: str = "ghost") -> dict:
    """Every rank replays one stream; at step 200 the last rank loses its tree
    and is rebuilt from rank 0's snapshot; at step 300 rank 1 makes one extra
    access (a single divergent operation)."""
    rng = np.random.default_rng(11)  # the same stream on every rank
    tree = cpkv.PrefixTree(2, policy=policy)
    next_page, digests = 0, {}
    for step in range(400):
        tokens = rng.integers(0, 5, size=2 * int(rng.integers(1, 6)))
        if tree.device_pages + 6 > 64:
            tree.evict(6)
        m = tree.match(tokens)
        fresh = len(tokens) // 2 - len(m.device_pages)
        tree.insert(tokens, list(m.device_pages) + list(range(next_page, next_page + fresh)))
        next_page += fresh
        if step == 200:
            box = [tree.snapshot() if rank == 0 else None]
            dist.broadcast_object_list(box, src=0)  # every rank takes part
            if rank == world - 1:
                tree = cpkv.PrefixTree.restore(box[0])
        if step == 300 and rank == 1:
            tree.match(tokens[:2])
        if step in (250, 399):
            gathered = [None] * world
            dist.all_gather_object(gathered, (tree.digest(), tree.canonical_digest().hex()))
            digests[step] = gathered
    return digests


@pytest.mark.parametrize("policy", ["ghost", "arc", "s3fifo"])
def test_a_rank_rebuilt_from_a_peers_snapshot_rejoins_and_divergence_is_still_seen(policy) -> None:
    results = run_ranks(_rejoin, 3, policy, timeout_s=120)
    assert results[0] == results[1] == results[2]
    after_rejoin, at_end = results[0][250], results[0][399]
    assert len(set(after_rejoin)) == 1, after_rejoin
    assert at_end[0] == at_end[2] and at_end[1] != at_end[0], at_end


@pytest.mark.parametrize("call", [
    lambda a: a.reserve(True, 1), lambda a: a.reserve(1, True), lambda a: a.reserve(1.0, 1),
    lambda a: a.reserve(2**64, 1), lambda a: a.release_many([True]), lambda a: a.reserve_batch([1, False], [1, 1]),
])
def test_allocator_keys_follow_the_same_rules_as_the_tree(call) -> None:
    alloc = cpkv.PageAllocator({"kv": 64})
    alloc.reserve(1, 2)
    before = alloc.digest()
    with pytest.raises(InvalidArgumentError):
        call(alloc)
    assert alloc.digest() == before and True not in alloc and 1 in alloc
