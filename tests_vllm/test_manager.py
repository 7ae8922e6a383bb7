"""CpkvOffloadingManager through vLLM's OffloadingManager interface alone (no scheduler): seeded
random call sequences checked against the manager's contract after every call, and the paths a
scheduler run rarely takes (a failed store, a reset with transfers in flight, the version check).
"""

from __future__ import annotations

import random

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

from cpkv.errors import EngineVersionError, InvalidArgumentError, UnknownPolicyError
from cpkv.integrations.vllm import REQUIRED_VLLM, CpkvOffloadConfig, CpkvOffloadingManager
from cpkv.integrations.vllm._version import check_vllm_version

CHUNK = 16


def request(req_id: str, chain: list[int]) -> tuple[ReqContext, list[bytes]]:
    """A request over a chain of chunk ids (prefix ``chain[:i]`` is chunk i's identity)."""
    ctx = ReqContext(req_id=req_id)
    keys = [make_offload_key(bytes(repr(tuple(chain[: i + 1])), "ascii"), 0) for i in range(len(chain))]
    for i, key in enumerate(keys):
        ctx.set_offload_key_position(key, (i + 1) * CHUNK)
    return ctx, keys


def manager(capacity: int, policy: str = "lru") -> CpkvOffloadingManager:
    return CpkvOffloadingManager(capacity, policy, tokens_per_chunk=(CHUNK,))


def drive(m: CpkvOffloadingManager, seed: int, steps: int = 300) -> list[int]:
    """Random requests over a small shared vocabulary of chains, transfers completing (or a store
    failing) in random order; checks the contract after every call. Returns the digests."""
    rng = random.Random(seed)
    inflight: list[tuple[str, ReqContext, list[bytes]]] = []
    digests = []
    stored_ok: set[bytes] = set()
    failed_stores = 0
    for step in range(steps):
        if inflight and rng.random() < 0.5:
            kind, ctx, keys = inflight.pop(rng.randrange(len(inflight)))
            if kind == "load":
                m.complete_load(keys, ctx)
            else:
                ok = rng.random() > 0.2
                m.complete_store(keys, ctx, success=ok)
                if ok:
                    stored_ok |= set(keys)
                else:
                    failed_stores += 1
                    for key in keys:
                        assert m.lookup(key, ctx) is LookupResult.MISS
        else:
            chain = [rng.randrange(3)] + [rng.randrange(4) for _ in range(rng.randrange(1, 7))]
            ctx, keys = request(f"r{step}", chain)
            m.on_new_request(ctx)
            hits = 0
            for key in keys[:-1]:
                if m.lookup(key, ctx) is not LookupResult.HIT:
                    break
                hits += 1
            if hits:
                spec = m.prepare_load(keys[:hits], ctx)
                assert len(spec.rows) == hits
                inflight.append(("load", ctx, keys[:hits]))
            pinned_before = set(m.pinned_keys())
            held = {k: m.row_of(k) for k in m.resident_keys()}
            missing = [k for k in keys[hits:] if m.lookup(k, ctx) is LookupResult.MISS]
            digest = m.digest()
            out = m.prepare_store(keys[hits:], ctx)
            if out is None:
                assert missing and m.digest() == digest, "a refused offer changes nothing"
            else:
                assert sorted(out.keys_to_store) == sorted(set(missing)), "an offer is placed whole"
                assert not set(out.evicted_keys) & pinned_before, "a pinned chunk was evicted"
                assert out.store_spec.evicted_rows.tolist() == [held[k] for k in out.evicted_keys]
                assert set(out.keys_to_store) <= set(keys[hits:])
                assert len({m.row_of(k) for k in out.keys_to_store}) == len(out.keys_to_store)
                if out.keys_to_store:
                    inflight.append(("store", ctx, list(out.keys_to_store)))
            m.on_request_finished(ctx)
        m.check()
        resident = set(m.resident_keys())
        assert len(resident) <= m.host_blocks
        assert set(m.pinned_keys()) <= resident
        for key in resident:
            state = m.lookup(key, None)
            assert (state is LookupResult.HIT_PENDING) == m.is_storing(key), "pending exactly while storing"
            parent = m.parent_of(key)
            if parent is not None:  # or a failed store that it continues, until rewritten or evicted
                assert parent in resident or m.lookup(parent, None) is LookupResult.MISS, \
                    "a resident chunk's prefix is on the host"
        for key in stored_ok & resident:
            assert m.lookup(key, None) is not LookupResult.HIT_PENDING or m.is_storing(key)
        digests.append(m.digest())
    stats = m.stats()
    assert stats["evicted"] > 20 and failed_stores > 0, f"the sequence must exercise eviction and failure: {stats}"
    for kind, ctx, keys in inflight:
        (m.complete_load if kind == "load" else m.complete_store)(keys, ctx)
    assert m.num_pins == 0 and m.pinned_keys() == []
    resident_now = m.resident_keys()
    assert sorted(m.evict(m.host_blocks)) == sorted(resident_now), "nothing is left pinned"
    assert m.resident_keys() == []
    m.check()
    return digests


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "slru", "ghost"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_calls_keep_the_contract_and_replay_identically(policy: str, seed: int) -> None:
    first = drive(manager(12, policy), seed)
    assert first == drive(manager(12, policy), seed), "same calls, same digests, step by step"
    assert first != drive(manager(12, policy), seed + 100)


def test_a_failed_store_frees_its_rows_and_is_stored_again() -> None:
    m = manager(8)
    ctx, keys = request("a", [1, 2, 3])
    m.prepare_store(keys, ctx)
    m.complete_store(keys, ctx, success=False)
    assert [m.lookup(k, ctx) for k in keys] == [LookupResult.MISS] * 3 and m.num_pins == 0
    assert m.resident_keys() == [] and m.stats()["resident"] == 0, "the rows are free at once"
    ctx2, keys2 = request("b", [1, 2, 3])
    again = m.prepare_store(keys2, ctx2)
    assert again is not None and again.keys_to_store == keys and again.evicted_keys == []
    assert [m.lookup(k, ctx2) for k in keys] == [LookupResult.HIT_PENDING] * 3
    m.complete_store(keys, ctx2)
    assert [m.lookup(k, ctx2) for k in keys] == [LookupResult.HIT] * 3 and m.num_pins == 0
    m.check()


def test_a_failed_chunk_stays_while_a_later_store_continues_it() -> None:
    """A request's next chunks are placed (continuing the pending ones) before the first store
    fails: the failed chunks stay, unreadable and reported removed, until the continuation fails too
    (then all leave) or they are offered again (rewritten in their rows)."""
    m = CpkvOffloadingManager(8, "lru", tokens_per_chunk=(CHUNK,), enable_events=True)
    ctx, keys = request("a", [1, 2, 3, 4])
    m.prepare_store(keys[:2], ctx)
    m.prepare_store(keys[2:], ctx)  # continues the pending chunks
    assert m.parent_of(keys[2]) == keys[1]
    m.complete_store(keys[:2], ctx, success=False)
    [removed] = m.take_events()
    assert removed.removed and removed.metadata_only and set(removed.keys) == set(keys[:2])
    assert [m.lookup(k, ctx) for k in keys[:2]] == [LookupResult.MISS] * 2
    assert m.resident_keys() == keys[2:] and m.stats()["resident"] == 4, "kept: something continues them"
    m.complete_store(keys[2:], ctx, success=False)
    assert m.stats()["resident"] == 0 and m.resident_keys() == [], "the whole failed chain left"
    m.check()

    ctx2, keys2 = request("b", [1, 2, 3, 4])
    m.prepare_store(keys2[:2], ctx2)
    m.prepare_store(keys2[2:], ctx2)
    m.complete_store(keys2[:2], ctx2, success=False)
    m.complete_store(keys2[2:], ctx2)
    rows = [m.row_of(k) for k in keys2[:2]]
    again = m.prepare_store(keys2[:2], ctx2)  # offered again: rewritten where they are
    assert again is not None and again.keys_to_store == keys2[:2] and list(again.store_spec.rows) == rows
    m.complete_store(keys2[:2], ctx2)
    assert [m.lookup(k, ctx2) for k in keys2] == [LookupResult.HIT] * 4
    assert sorted(m.evict(8)) == sorted(keys2) and m.stats()["resident"] == 0
    m.check()


def test_full_host_with_everything_pinned_refuses_the_store() -> None:
    m = manager(3)
    ctx, keys = request("a", [1, 2, 3])
    m.prepare_store(keys, ctx)  # pending: pinned
    other, more = request("b", [7, 8])
    assert m.prepare_store(more, other) is None
    m.complete_store(keys, ctx)
    held = [m.row_of(k) for k in keys[1:]]
    out = m.prepare_store(more, other)
    # Two rows needed: the unpinned chain loses exactly two, from its tail; its head stays readable.
    assert out is not None and out.evicted_keys == keys[1:]
    # The spec names the rows the evicted keys held (for a lower tier to copy out first): here the
    # very rows the new chunks take.
    assert out.store_spec.evicted_rows.tolist() == held
    assert sorted(out.store_spec.rows.tolist()) == sorted(held)
    assert m.lookup(keys[0], ctx) is LookupResult.HIT
    m.check()


def test_reset_drops_everything_and_ignores_late_completions() -> None:
    m = manager(6)
    ctx, keys = request("a", [1, 2, 3])
    m.prepare_store(keys, ctx)
    m.complete_store(keys, ctx)
    m.prepare_load(keys[:2], ctx)
    m.reset_cache()
    m.complete_load(keys[:2], ctx)
    m.complete_store(keys, ctx)
    assert m.resident_keys() == [] and m.num_pins == 0
    assert m.lookup(keys[0], ctx) is LookupResult.MISS
    m.check()


def test_prepare_load_of_a_missing_key_is_a_typed_error_and_changes_nothing() -> None:
    m = manager(4)
    ctx, keys = request("a", [1, 2])
    before = m.digest()
    with pytest.raises(InvalidArgumentError, match=keys[0].hex()):
        m.prepare_load(keys, ctx)
    assert m.digest() == before and m.num_pins == 0


def test_version_check_names_both_versions() -> None:
    assert check_vllm_version() == REQUIRED_VLLM
    with pytest.raises(EngineVersionError, match="0.34.0") as caught:
        check_vllm_version("0.34.0")
    assert REQUIRED_VLLM in str(caught.value) and isinstance(caught.value, ImportError)


@pytest.mark.parametrize("extra, error", [
    (None, InvalidArgumentError),
    ({}, InvalidArgumentError),
    ({"cpkv_host_blocks": float("nan")}, InvalidArgumentError),
    ({"cpkv_host_blocks": float("inf")}, InvalidArgumentError),
    ({"cpkv_host_blocks": 1 << 50}, InvalidArgumentError),
    ({"cpkv_host_blocks": [4]}, InvalidArgumentError),
    ({"cpkv_host_blocks": 4, "cpkv_policy": 3}, UnknownPolicyError),
    ({"cpkv_host_blocks": 4, "cpkv_slab": ["shared"]}, InvalidArgumentError),
    # The L3 cap by the rule both engines share (cpkv.integrations._adapter): what the disk APIs take.
    ({"cpkv_host_blocks": 4, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": 1 << 63}, InvalidArgumentError),
])
def test_config_rejects_bad_values(extra, error) -> None:
    with pytest.raises(error):
        CpkvOffloadConfig.from_extra_config(extra)


def test_host_blocks_share_the_core_index_one_limit() -> None:
    """The limit lives once, in the core (OffloadIndex.MAX_ROWS: rows are int32): the top value builds
    a manager (rows are placed lazily), one past it is refused by the config, naming key and limit."""
    from cpkv._cpkv import OffloadIndex

    top = CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": OffloadIndex.MAX_ROWS})
    assert top.host_blocks == OffloadIndex.MAX_ROWS == 2**31 - 1
    assert CpkvOffloadingManager(top.host_blocks, tokens_per_chunk=(CHUNK,)).stats()["host_blocks"] == 2**31 - 1
    for beyond in (OffloadIndex.MAX_ROWS + 1, 2**32 - 1, 2**32, 1 << 33):
        with pytest.raises(InvalidArgumentError, match="cpkv_host_blocks") as caught:
            CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": beyond})
        assert str(OffloadIndex.MAX_ROWS) in str(caught.value)


@pytest.mark.parametrize("key", ["cpkv_polcy", "cpkv_host_block", "cpkv_", "cpkv_timeout"])
def test_an_unknown_cpkv_key_is_refused_naming_it_and_the_known_ones(key) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": 8, key: "lfu"})
    text = str(caught.value)
    assert repr(key) in text and all(known in text for known in
                                     ("cpkv_host_blocks", "cpkv_policy", "cpkv_slab", "cpkv_timeout_s"))
    # vLLM's own keys are vLLM's business.
    assert CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": 8, "spec_name": "x"}).host_blocks == 8


def test_the_cluster_keys_are_read_for_cpkvs_own_connector() -> None:
    master, metadata = "127.0.0.1:50051", "http://127.0.0.1:8080/metadata"
    config = CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": 8, "cpkv_cluster_master": master,
                                                  "cpkv_cluster_metadata": metadata, "cpkv_cluster_bytes": 1 << 20})
    assert (config.cluster_master, config.cluster_metadata, config.cluster_bytes) == (master, metadata, 1 << 20)
    assert CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": 8}).cluster_master is None


@pytest.mark.parametrize(("extra", "named"), [
    ({"cpkv_cluster_master": "127.0.0.1:1"}, "cpkv_cluster_metadata"),
    ({"cpkv_cluster_metadata": "http://127.0.0.1:1/metadata"}, "cpkv_cluster_master"),
    ({"cpkv_cluster_bytes": 5}, "cpkv_cluster_bytes"),
    ({"cpkv_cluster_master": "host", "cpkv_cluster_metadata": "http://h:1/m"}, "cpkv_cluster_master"),
])
def test_bad_cluster_keys_are_refused_naming_the_key(extra, named) -> None:
    with pytest.raises(InvalidArgumentError, match=f"kv_connector_extra_config\\['{named}'\\]"):
        CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": 8, **extra})


@pytest.mark.parametrize("value", [1e15, 1e300, 1e-9, 0, -1, float("nan"), float("inf"), True, "30", None])
def test_a_bad_timeout_is_refused_naming_the_key(value) -> None:
    with pytest.raises(InvalidArgumentError, match="cpkv_timeout_s"):
        CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": 8, "cpkv_timeout_s": value})


def test_config_accepts_good_values() -> None:
    got = CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": "128", "cpkv_policy": "ghost", "cpkv_slab": "private",
                                               "cpkv_timeout_s": 5})
    assert got == CpkvOffloadConfig(128, "ghost", "private", 5.0)
    assert CpkvOffloadConfig.from_extra_config({"cpkv_host_blocks": 8.0}).host_blocks == 8


def test_hits_are_reported_as_host_hits() -> None:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    m = manager(4)
    ctx, keys = request("a", [1])
    m.prepare_store(keys, ctx)
    m.complete_store(keys, ctx)
    assert m.lookup(keys[0], ctx) is LookupResult.HIT
    assert m.get_load_source(keys[0], ctx) is CacheHitSource.HOST
