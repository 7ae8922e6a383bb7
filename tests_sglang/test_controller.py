"""The controller stack SGLang's server builds (HybridCacheController over a HostPoolGroup, from
SGLang's own strategy for the device pool) in 2 and 4 gloo processes over cpkv's backend: the
scheduler's write_storage on every rank, then its prefetch on every rank. GQA (_PlainKvStrategy) and
DSA (_DsaStrategy: MLA latent + the indexer sidecar, GLM-5/DeepSeek-V3.2's pools)."""

from __future__ import annotations

import pytest

from harness import launch


def _check_roundtrip(results: list[dict], kind: str, groups: list[list[int]], nodes: int = 1) -> None:
    """``groups``: the store groups' ranks (one index, one slab per node each)."""
    pools = ["kv", "indexer"] if kind == "dsa" else ["kv"]
    group_size = len(groups[0])
    for res in results:
        assert res["controller"] == "HybridCacheController"
        assert res["strategy"] == ("_DsaStrategy" if kind == "dsa" else "_PlainKvStrategy")
        assert res["writer"] is True  # SGLang's own election, as the backend set it up
        page = res["pages"]
        for got, n in zip(res["fetched"], page):
            # Every page stored is found on every rank, before and after SGLang's MIN, and loaded intact
            # (KV and, for DSA, the indexer).
            assert got["pre"] == got["post"] == got["loaded"] == n * (64 if kind == "dsa" else 4), got
            assert got["wrong"] == 0 and got["sidecar_wrong"] == 0, got
        stats = res["stats"]
        assert stats["torn_reads_refused"] == 0 and stats["broken"] is None
        assert stats["digest_checks"] == stats["stores"] // 4 > 0
        assert stats["rank_replicated"] is (kind != "gqa")
        assert stats["group_size"] == group_size and stats["nodes"] == nodes
        assert all(stats["copy"][p] == "layout" for p in pools)  # addresses computed natively, no per-page meta
        # One copy per node: the slab holds each distinct page once (per pool), whatever the group size.
        for p in pools:
            assert res["slab_bytes_in_use"][p] == res["distinct_pages"] * res["page_bytes"][p]
    for ranks in groups:
        members = [results[r] for r in ranks]
        assert len({r["digest"] for r in members}) == 1  # digests equal within a store group
        # Written once per node: the ranks of a node share the writes.
        written = sum(r["stats"]["pages_written"] for r in members)
        assert written == members[0]["distinct_pages"] * nodes * len(pools)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["gqa", "dsa"])
@pytest.mark.parametrize("cp", [2, 4])
def test_roundtrip_through_the_servers_controller(kind: str, cp: int) -> None:
    results = launch(cp, "roundtrip", kind=kind, v1=True)
    _check_roundtrip(results, kind, [list(range(cp))])


@pytest.mark.timeout(600)
def test_tensor_calls_without_interface_v1() -> None:
    """Without "interface_v1" SGLang's controller uses the older batch_set/batch_get with flat page tensors."""
    results = launch(2, "roundtrip", kind="gqa", v1=False)
    _check_roundtrip(results, "gqa", [[0, 1]])


@pytest.mark.timeout(600)
def test_dsa_two_nodes_of_two() -> None:
    """DSA at CP 4 as 2 simulated nodes of 2 (plain MLA CP may span nodes): one slab per node, each
    page once per node, every rank finds every page."""
    results = launch(4, "roundtrip", kind="dsa", ranks_per_node=2)
    _check_roundtrip(results, "dsa", [[0, 1, 2, 3]], nodes=2)
    assert sorted(r["stats"]["node"] for r in results) == [0, 0, 1, 1]


@pytest.mark.timeout(600)
def test_gqa_tp_times_cp_groups_keep_their_own_slab() -> None:
    """GQA at TP 4 as 2 attention-TP ranks x CP 2: two store groups ({0, 2} and {1, 3}) whose pages
    differ (other heads); each shares its own slab."""
    results = launch(4, "roundtrip", kind="gqa", cp=2)
    _check_roundtrip(results, "gqa", [[0, 2], [1, 3]])


@pytest.mark.timeout(600)
def test_dsa_attention_tp_ranks_share_one_copy() -> None:
    """DSA at TP 4 as CP 2 x attention TP 2 (interleave DSA CP): the latent and the indexer are the
    same on every TP rank, so all four ranks are one store group with one copy of each page."""
    results = launch(4, "roundtrip", kind="dsa", cp=2)
    _check_roundtrip(results, "dsa", [[0, 1, 2, 3]])


@pytest.mark.timeout(600)
def test_dsa_attention_dp_groups_keep_their_own_index() -> None:
    """--attn-dp-size 2 with CP 2: each attention-DP group is a scheduler with its own requests, so
    each is a store group of its own, with its own index and slab."""
    results = launch(4, "roundtrip", kind="dsa", dp=2, cp=2)
    _check_roundtrip(results, "dsa", [[0, 1], [2, 3]])
    assert results[0]["digest"] != results[2]["digest"]  # other requests, another index


@pytest.mark.timeout(600)
def test_plain_mla_cp_across_two_nodes() -> None:
    """Plain MLA prefill CP (DeepSeek-V3: the latent, no indexer; _PlainKvStrategy with an MLA host
    pool, SGLang's single-writer election) at CP 4 as 2 simulated nodes of 2."""
    results = launch(4, "roundtrip", kind="mla", ranks_per_node=2)
    _check_roundtrip(results, "mla", [[0, 1, 2, 3]], nodes=2)
