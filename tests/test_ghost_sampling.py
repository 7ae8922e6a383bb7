"""``ghost``'s candidates as miniature caches on a hashed sample of requests (issue 47): above the floor
(16,384 pages) they hold the sampled share of the cache, replicas in real processes sample the same requests
and agree at every request, and bad sampling parameters of the test-only exact hook are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from cpkv import PrefixTree
from cpkv.errors import InvalidArgumentError
from cpkv.runtime.launch import run_ranks
from cpkv.workload import generate

# 23,534 distinct blocks: the cache fills to 20,480 pages, 1.25x the floor, so the candidates sample four
# fifths of the requests at 16,384 pages each.
REQUESTS = 3000
CAPACITY = 20480


def _serve(
    tree: PrefixTree, requests: list[tuple[int, ...]], next_page: int = 0
) -> tuple[list[int], list[str | None], int]:
    """Serves ``requests`` as an engine would (match, make room, insert what fits, fresh page ids from
    ``next_page`` on); the digest and what the tree follows after each, and the next free page id."""
    digests, followed = [], []
    for blocks in requests:
        m = tree.match(list(blocks))
        tree.lock(m.node)
        new = len(blocks) - m.length
        if new > CAPACITY - tree.device_pages:
            tree.evict(new - (CAPACITY - tree.device_pages))
        keep = m.length + min(new, CAPACITY - tree.device_pages)
        fresh = np.arange(next_page, next_page + keep - m.length, dtype=np.int64)
        next_page += len(fresh)
        tree.insert(list(blocks[:keep]), np.concatenate([m.device_pages, fresh]))
        tree.unlock(m.node)
        digests.append(tree.digest())
        followed.append(tree.following)
    return digests, followed, next_page


def _stream() -> list[tuple[int, ...]]:
    return [r.hash_ids for r in generate(REQUESTS * 2, 3, "docqa")]


def _replica(rank: int, world: int) -> tuple[list[int], list[str | None], int, int]:
    tree = PrefixTree(1, "ghost")
    digests, followed, _ = _serve(tree, _stream())
    tree.check_invariants()
    return digests, followed, tree.device_pages, tree.policy_memory()["shadow_pages"]


def test_sampling_replicas_agree_in_real_processes_and_hold_a_miniature():
    results = run_ranks(_replica, 3, timeout_s=300)
    digests0, followed0, held, shadow_pages = results[0]
    assert held == CAPACITY, "the cache filled past the floor"
    assert all(r[0] == digests0 and r[1] == followed0 for r in results), "every rank samples the same requests"
    exact = PrefixTree._ghost_sampled(1, 0, 0)
    _serve(exact, _stream())
    exact_pages = exact.policy_memory()["shadow_pages"]
    assert 0 < shadow_pages < exact_pages, (shadow_pages, exact_pages)


def test_a_restored_sampling_tree_goes_on_identically():
    stream = _stream()
    tree = PrefixTree(1, "ghost")
    *_, next_page = _serve(tree, stream[:REQUESTS])
    copy = PrefixTree.restore(tree.snapshot())
    assert copy.canonical_digest() == tree.canonical_digest()
    assert _serve(copy, stream[REQUESTS:], next_page) == _serve(tree, stream[REQUESTS:], next_page)
    assert copy.canonical_digest() == tree.canonical_digest()


@pytest.mark.parametrize(
    ("rate_shift", "floor", "named"),
    [(33, 0, "rate_shift must be in \\[0, 32\\], got 33"), (0, 5, "floor must be 0 when rate_shift is 0, got 5")],
)
def test_bad_sampling_is_refused_by_name(rate_shift, floor, named):
    with pytest.raises(InvalidArgumentError, match=named):
        PrefixTree._ghost_sampled(1, rate_shift, floor)
