"""cpkv.PrefixTree from Python: the surface, bad input, and replicas in real processes."""

from __future__ import annotations

import numpy as np
import pytest

import cpkv
from cpkv import PrefixTree
from cpkv.runtime.launch import run_ranks


def test_surface_round_trip():
    assert PrefixTree.POLICIES == ("lru", "lfu", "fifo", "slru", "ghost", "arc", "s3fifo")
    tree = PrefixTree(2, policy="slru", event_limit=64)  # events are off unless asked for
    r = tree.insert(np.array([1, 1, 2, 2, 3]), [10, 11])  # the partial last page is not cached
    assert (r.cached, tree.device_pages, len(tree)) == (0, 2, 2)
    m = tree.match([1, 1, 2, 2, 9, 9])
    assert (m.length, m.host_length, m.node) == (4, 4, r.node)
    assert m.device_pages.dtype == np.int64 and m.device_pages.tolist() == [10, 11]
    assert tree.insert([1, 1, 7, 7], np.array([50, 51], dtype=np.uint32)).cached == 1
    tree.lock(r.node)
    victims = tree.evict(10)
    assert [v.pages.tolist() for v in victims] == [[51]]
    tree.unlock(r.node)
    # The second insert split [1 1 | 2 2]: the suffix keeps r.node, the new
    # parent [1 1] gets a fresh id. Backups go top-down.
    parent = tree.match([1, 1]).node
    assert parent != r.node
    tree.set_host(parent, 4)
    tree.set_host(r.node, 5)
    victims = tree.evict(10)
    assert sorted(p for v in victims for p in v.pages.tolist()) == [10, 11]
    m = tree.match([1, 1, 2, 2])
    assert (m.length, m.host_length, m.host_node) == (0, 4, r.node)
    host = tree.evict_host(1)
    assert [(v.node, v.object_key, v.released) for v in host] == [(r.node, 5, True)]
    kinds = [(e.tier, e.kind) for e in tree.take_events()]
    assert kinds[0] == ("device", "stored") and ("host", "removed") in kinds
    assert tree.take_events() == []
    tree.check_invariants()


def test_load_back_reattaches_device_pages():
    tree = PrefixTree(1)
    node = tree.insert([1, 2, 3], [0, 1, 2]).node
    tree.set_host(node, 9)
    tree.evict(3)
    assert tree.match([1, 2, 3]).host_node == node
    tree.attach_device(node, [7, 8, 9])
    assert tree.match([1, 2, 3]).device_pages.tolist() == [7, 8, 9]
    tree.check_invariants()


def test_namespaces_are_separate():
    tree = PrefixTree(1)
    tree.insert([1, 2], [0, 1], namespace="lora-a")
    assert tree.match([1, 2]).length == 0
    assert tree.match([1, 2], namespace=3).length == 0
    assert tree.match([1, 2], namespace="lora-a").length == 2


def _tree_with_state() -> tuple[PrefixTree, int]:
    tree = PrefixTree(2, "ghost")
    node = tree.insert([1, 1, 2, 2], [0, 1]).node
    tree.insert([1, 1, 3, 3], [2, 3])
    tree.lock(node)
    return tree, node


BAD_CALLS = [
    ("tokens float array", lambda t, n: t.match(np.array([1.0, 2.0])), cpkv.InvalidArgumentError),
    ("tokens 2-D", lambda t, n: t.match(np.zeros((2, 2), dtype=np.int64)), cpkv.InvalidArgumentError),
    ("tokens bool array", lambda t, n: t.match(np.array([True, False])), cpkv.InvalidArgumentError),
    ("tokens list of floats", lambda t, n: t.insert([1.0, 2.0], [5]), cpkv.InvalidArgumentError),
    ("tokens list with a bool", lambda t, n: t.insert([1, True], [5]), cpkv.InvalidArgumentError),
    ("tokens nested", lambda t, n: t.insert([[1, 2]], [5]), cpkv.InvalidArgumentError),
    ("tokens str", lambda t, n: t.match("abcd"), cpkv.InvalidArgumentError),
    ("tokens scalar", lambda t, n: t.match(7), cpkv.InvalidArgumentError),
    ("tokens negative", lambda t, n: t.insert([1, -1], [5]), cpkv.InvalidArgumentError),
    ("page count mismatch", lambda t, n: t.insert([4, 4, 5, 5], [8]), cpkv.InvalidArgumentError),
    ("page already held", lambda t, n: t.insert([6, 6], [0]), cpkv.InvalidArgumentError),
    ("pages float", lambda t, n: t.insert([6, 6], [8.0]), cpkv.InvalidArgumentError),
    ("unknown node", lambda t, n: t.lock(12345), cpkv.UnknownNodeError),
    ("negative node", lambda t, n: t.unlock(-1), cpkv.UnknownNodeError),
    ("unlock below zero", lambda t, n: t.unlock(0), cpkv.LockError),
    ("negative evict", lambda t, n: t.evict(-1), cpkv.InvalidArgumentError),
    ("negative evict_pages", lambda t, n: t.evict_pages(-1), cpkv.InvalidArgumentError),
    ("negative evict_host", lambda t, n: t.evict_host(-2), cpkv.InvalidArgumentError),
    ("negative object key", lambda t, n: t.set_host(n, -5), cpkv.InvalidArgumentError),
    ("backup below a parent without one", lambda t, n: t.set_host(n, 5), cpkv.InvalidArgumentError),
    ("attach to a device node", lambda t, n: t.attach_device(n, [9]), cpkv.InvalidArgumentError),
    ("bad namespace", lambda t, n: t.match([1, 1], namespace=1.5), cpkv.InvalidArgumentError),
]


@pytest.mark.parametrize("name,call,error", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_typed_error_and_changes_nothing(name, call, error):
    tree, node = _tree_with_state()
    before = (tree.digest(), tree.clock, len(tree), tree.device_pages)
    with pytest.raises(error):
        call(tree, node)
    assert (tree.digest(), tree.clock, len(tree), tree.device_pages) == before
    tree.check_invariants()


def test_unknown_policy_and_page_size():
    with pytest.raises(cpkv.UnknownPolicyError, match="mru"):
        PrefixTree(1, "mru")
    with pytest.raises(cpkv.InvalidArgumentError):
        PrefixTree(0)
    with pytest.raises(cpkv.InvalidArgumentError):
        PrefixTree(-4)


def test_evict_pages_frees_what_evict_frees_as_one_array():
    flat, victims = PrefixTree(1, "lru"), PrefixTree(1, "lru")
    for tree in (flat, victims):
        for i in range(20):  # leaves under three shared one-page prefixes
            tokens = [i % 3, 100 + i, 200 + i]
            m = tree.match(tokens)
            tree.insert(tokens, [*m.device_pages.tolist(), *range(10 * i, 10 * i + 3 - m.length)])
        tree.match([1, 104, 204])
    for n in (1, 4, 7, 100, 1):
        pages = flat.evict_pages(n)
        assert pages.dtype == np.int64
        assert pages.tolist() == [p for v in victims.evict(n) for p in v.pages.tolist()]
        assert flat.digest() == victims.digest()
    assert flat.device_pages == 0 and flat.evict_pages(3).tolist() == []
    flat.check_invariants()


def test_evicted_node_is_unknown():
    tree = PrefixTree(1)
    node = tree.insert([1, 2], [0, 1]).node
    tree.evict(2)
    with pytest.raises(cpkv.UnknownNodeError, match=str(node)):
        tree.lock(node)


# ---- replicas in real processes ----------------------------------------------

EVENTS = 600
CAPACITY = 48


def _replica(rank: int, world: int, extra_on_rank: int, policy: str) -> tuple[list, list]:
    """Replays the shared event stream; rank `extra_on_rank` makes one extra access."""
    from cpkv import PrefixTree

    tree = PrefixTree(4, policy)
    victims = []
    digests = []
    next_page = 0
    for i in range(EVENTS):
        conv = (i * 37) % 23
        tokens = [conv] * 4 + [t for k in range(i % 9) for t in [conv * 100 + k] * 4]
        m = tree.match(tokens)
        tree.lock(m.node)
        new = len(tokens) // 4 - m.length // 4
        if new > CAPACITY - tree.device_pages:
            victims += [(v.node, v.pages.tolist()) for v in tree.evict(new - (CAPACITY - tree.device_pages))]
        pages = m.device_pages.tolist() + list(range(next_page, next_page + new))
        next_page += new
        tree.insert(tokens, pages)
        tree.unlock(m.node)
        if rank == extra_on_rank and i == EVENTS // 2:
            tree.match([0, 0, 0, 0])
        digests.append(tree.digest())
    return victims, digests


def _run_replicas(extra_on_rank: int, policy: str = "ghost", ranks: int = 8) -> list[tuple[list, list]]:
    return run_ranks(_replica, ranks, extra_on_rank, policy, timeout_s=120)


def test_eight_processes_agree_and_one_extra_access_is_detected():
    same = _run_replicas(extra_on_rank=-1)
    victims0, digests0 = same[0]
    assert victims0, "the stream must evict"
    assert all(same[r] == (victims0, digests0) for r in range(8))

    diverged = _run_replicas(extra_on_rank=5)
    for r in range(8):
        if r == 5:
            first_bad = next(i for i, (a, b) in enumerate(zip(diverged[r][1], digests0)) if a != b)
            assert first_bad == EVENTS // 2, "detected at the very event that diverged"
        else:
            assert diverged[r] == (victims0, digests0)


@pytest.mark.parametrize("policy", ["arc", "s3fifo"])
def test_queue_policies_agree_across_processes_and_one_extra_access_is_detected(policy):
    same = _run_replicas(-1, policy, ranks=4)
    victims0, digests0 = same[0]
    assert victims0, "the stream must evict"
    assert all(same[r] == (victims0, digests0) for r in range(4))
    diverged = _run_replicas(2, policy, ranks=4)
    first_bad = next(i for i, (a, b) in enumerate(zip(diverged[2][1], digests0)) if a != b)
    assert first_bad == EVENTS // 2
    assert all(diverged[r] == (victims0, digests0) for r in (0, 1, 3))


def test_the_ghost_history_is_replicated_state():
    """Two ghost trees that end alike but dropped different content differ in
    digest (the history decides later keys); lru keeps no history."""

    def digest(policy: str, tokens: list[int]) -> int:
        tree = PrefixTree(1, policy)
        tree.insert(tokens, [10, 11])
        tree.evict(2)
        return tree.digest()

    assert digest("lru", [1, 2]) == digest("lru", [3, 4])
    assert digest("ghost", [1, 2]) != digest("ghost", [3, 4])
    assert digest("arc", [1, 2]) != digest("arc", [3, 4])
    assert digest("s3fifo", [1, 2]) != digest("s3fifo", [3, 4])
