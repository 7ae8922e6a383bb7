"""``cpkv hitrate`` on a prefix of the real conversation trace."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest

from cpkv import PrefixTree
from cpkv.belady import belady_hits
from cpkv.hitrate import replay
from cpkv.traces import load_trace

REQUESTS = 2000


def block_lru_hits(requests, capacity: int) -> tuple[int, int]:
    """An independent LRU over single blocks (no tree): hit = leading cached
    blocks; then every block of the request is touched, deepest first, so a
    prefix is always more recent than its extensions."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for blocks in requests:
        matched = 0
        while matched < len(blocks) and blocks[matched] in cache:
            matched += 1
        hits += matched
        total += len(blocks)
        for block in reversed(blocks):
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits, total


@pytest.fixture(scope="module")
def requests(traces):
    return [r.hash_ids for r in load_trace(traces / "conversation_trace.jsonl", limit=REQUESTS)]


@pytest.mark.parametrize("capacity", [300, 2000])
def test_tree_lru_matches_an_independent_block_lru(requests, capacity):
    tree_hits, total = replay(requests, capacity, "lru")
    ref_hits, ref_total = block_lru_hits(requests, capacity)
    assert total == ref_total
    # The tree evicts whole leaves (all pages of a node share one stamp), so
    # it may free a few more pages than a block LRU; the ratios stay close.
    assert abs(tree_hits - ref_hits) / total < 0.01, (tree_hits, ref_hits, total)
    assert tree_hits > 0


@pytest.mark.parametrize("capacity", [1000, 3000])
def test_ghost_beats_lru_and_slru_on_the_conversation_prefix(requests, capacity):
    # Multi-turn chat: most blocks are one-shot and turns come back farther
    # apart than the cache reaches, which is what `ghost` is built for.
    ratio = {p: replay(requests, capacity, p)[0] for p in ("lru", "slru", "ghost")}
    assert ratio["ghost"] > max(ratio["lru"], ratio["slru"]), ratio


def test_belady_is_a_ceiling_for_every_policy(requests):
    capacity = 1000
    best, total = belady_hits(requests, capacity)
    for policy in PrefixTree.POLICIES:
        hits, _ = replay(requests, capacity, policy)
        assert hits <= best, policy
    unlimited, _ = belady_hits(requests, 10**9)
    seen: set[int] = set()
    cold = 0
    for blocks in requests:  # with no capacity limit only first sightings miss
        matched = 0
        while matched < len(blocks) and blocks[matched] in seen:
            matched += 1
        cold += matched
        seen.update(blocks)
    assert unlimited == cold


def test_hitrate_command_writes_json(traces, tmp_path, capsys):
    from cpkv.cli import main

    out = tmp_path / "hitrate.json"
    code = main([
        "hitrate", str(traces / "synthetic_trace.jsonl"), "--capacity", "500,3000",
        "--policy", "lru,ghost", "--limit", "600", "--json", str(out),
    ])
    assert code == 0
    table = json.loads(out.read_text())["tables"][0]
    rows = table["rows"]
    assert [r["capacity"] for r in rows] == [500, 3000]
    for r in rows:
        assert 0 <= r["lru"] <= r["belady"] and r["ghost"] <= r["belady"]
    assert "belady" in capsys.readouterr().out


def test_the_one_shot_oracle_drops_what_never_returns_first():
    from cpkv.belady import one_shot_oracle_hits

    # Blocks 2 and 3 never return: told so, the oracle drops them and keeps 1 for its return,
    # where LRU (at 2 blocks) has dropped it for 3.
    tiny = [(1,), (2,), (3,), (1,)]
    assert block_lru_hits(tiny, 2) == (0, 4)
    assert one_shot_oracle_hits(tiny, 2) == (1, 4) == belady_hits(tiny, 2)


def test_the_one_shot_oracle_stays_between_lru_and_belady(requests):
    from cpkv.belady import one_shot_oracle_hits

    for capacity in (300, 2000):
        oracle, total = one_shot_oracle_hits(requests, capacity)
        assert block_lru_hits(requests, capacity)[0] <= oracle <= belady_hits(requests, capacity)[0]
    assert one_shot_oracle_hits(requests, 10**9) == belady_hits(requests, 10**9)
