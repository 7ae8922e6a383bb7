"""The synthetic workload: deterministic, in the Mooncake format, and structured as documented."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from cpkv.errors import InvalidArgumentError
from cpkv.hitrate import replay
from cpkv.traces import BLOCK_TOKENS, TraceRequest, load_trace
from cpkv.workload import CHAT_SYSTEM_TOKENS, MIXES, generate, generate_tagged, write_jsonl


def test_same_seed_same_output_different_seed_different():
    a = generate(200, 7)
    assert a == generate(200, 7)
    assert a != generate(200, 8)
    assert generate(200, 7, "chat") != a
    # A longer run extends a shorter one (requests do not depend on num_requests).
    assert generate(80, 7) == a[:80]


def test_no_global_rng_is_read_or_moved():
    state = random.getstate()
    random.seed(1)
    a = generate(100, 3)
    random.seed(2)
    assert generate(100, 3) == a
    random.setstate(state)
    before = random.getstate()
    generate(50, 4)
    assert random.getstate() == before


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_format_invariants(mix, seed):
    reqs = generate(300, seed, mix)
    assert len(reqs) == 300
    assert reqs[0].timestamp_ms == 0
    parent: dict[int, int] = {}
    next_id = 0
    for prev, r in zip([reqs[0], *reqs], reqs):
        assert isinstance(r, TraceRequest)
        assert all(type(v) is int for v in (r.timestamp_ms, r.input_length, r.output_length, *r.hash_ids))
        assert r.timestamp_ms >= prev.timestamp_ms
        assert r.input_length >= 1 and r.output_length >= 1
        assert len(r.hash_ids) == -(-r.input_length // BLOCK_TOKENS)
        assert len(set(r.hash_ids)) == len(r.hash_ids)
        before = -1
        for h in r.hash_ids:  # chained: an id always follows the same id
            assert parent.setdefault(h, before) == before
            before = h
            if h >= next_id:  # numbered from 0 in order of first use
                assert h == next_id
                next_id += 1


def test_default_mix_sizes_and_families():
    tagged = generate_tagged(200, 0)
    families = Counter(f for f, _ in tagged)
    assert set(families) == {"chat", "document", "agent"}, families
    blocks = [len(r.hash_ids) for _, r in tagged]
    assert 2 <= sum(blocks) / len(blocks) <= 12
    assert max(blocks) <= 12


def test_documents_are_never_reused():
    tagged = generate_tagged(400, 5)
    uses = Counter(h for _, r in tagged for h in r.hash_ids)
    docs = [r for f, r in tagged if f == "document"]
    assert len(docs) >= 20
    for r in docs:
        assert all(uses[h] == 1 for h in r.hash_ids)
    # ... so a cache gains nothing from them: an all-document trace never hits.
    only_docs = [r.hash_ids for r in generate(100, 5, "document")]
    assert replay(only_docs, 10**6, "lru")[0] == 0


def test_conversations_share_prefixes_across_turns():
    tagged = generate_tagged(300, 11, "chat")
    reqs = [r.hash_ids for _, r in tagged]
    hits, total = replay(reqs, 10**6, "lru")
    assert hits / total > 0.3
    # Beyond the shared system prompts (at most CHAT_SYSTEM_TOKENS[1] tokens) a hit can
    # only come from an earlier turn of the same conversation: later turns extend earlier ones.
    system_blocks = CHAT_SYSTEM_TOKENS[1] // BLOCK_TOKENS
    seen: set[int] = set()
    deep_hits = 0
    for blocks in reqs:
        matched = 0
        while matched < len(blocks) and blocks[matched] in seen:
            matched += 1
        deep_hits += matched > system_blocks
        seen.update(blocks)
    assert deep_hits >= 20
    # The system prompts are shared across conversations: few distinct first blocks.
    assert len({blocks[0] for blocks in reqs}) <= 3


def test_default_mix_hits_through_replay_at_a_small_cache():
    reqs = [r.hash_ids for r in generate(200, 0)]
    distinct = len({h for blocks in reqs for h in blocks})
    hits, total = replay(reqs, max(1, distinct // 10), "lru")
    assert 0 < hits < total


def test_agent_fanout_bursts_share_a_timestamp_and_a_prefix():
    reqs = generate(300, 2, "agent")
    by_time = Counter(r.timestamp_ms for r in reqs)
    bursts = [t for t, n in by_time.items() if n > 1]
    assert bursts
    for t in bursts:
        group = [r.hash_ids for r in reqs if r.timestamp_ms == t]
        assert len({g[0] for g in group}) == 1  # one agent prompt, parallel calls


def test_jsonl_round_trip(tmp_path):
    reqs = generate(150, 9)
    path = tmp_path / "w.jsonl"
    write_jsonl(reqs, path)
    assert load_trace(path) == reqs
    first = path.read_text().splitlines()[0]
    assert list(json.loads(first)) == ["timestamp", "input_length", "output_length", "hash_ids"]


@pytest.mark.parametrize("kwargs", [
    {"num_requests": -1, "seed": 0},
    {"num_requests": 1.5, "seed": 0},
    {"num_requests": 10, "seed": -3},
    {"num_requests": 10, "seed": "7"},
    {"num_requests": 10, "seed": 0, "mix": "nope"},
])
def test_bad_arguments(kwargs):
    with pytest.raises(InvalidArgumentError):
        generate(**kwargs)


def test_zero_requests():
    assert generate(0, 0) == []
