"""The L3 tier for DSA (DeepSeek-V3.2 / GLM-5: the MLA latent and the indexer's keys), through the
stack SGLang's server builds for it (``_DsaStrategy``: ``MLATokenToKVPoolHost`` +
``DSAIndexerPoolHost`` under a ``HybridCacheController``) in gloo processes at CP 2 and 4.

One fill per CP size (module fixture): a 16-row slab under a stream of far more distinct pages, rank
1's backup thread two requests behind the others'. SGLang stores each request's indexer transfer
(``batch_set_v2``) and then its KV (``batch_set_v1``), so the store that evicts a page overwrites
one pool's rows at once and the other's in the next call: both pools' bytes of the victim must be
copied out at the eviction. Each test then starts new processes on a copy of the directory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import launch
from l3_files import check_agreed_and_exact, copy_filled, damage, live_records

SLAB_PAGES = 16
L3_BYTES = 16 << 20  # room for every distinct page: the checks below are exact, nothing leaves L3
MODEL = "test-dsa-model"
POOLS = ("kv", "indexer")


def _opts(directory: Path) -> dict:
    return dict(kind="dsa", pages=SLAB_PAGES, model=MODEL, l3_dir=str(directory), l3_bytes=L3_BYTES)


@pytest.fixture(scope="module", params=[2, 4], ids=["cp2", "cp4"])
def filled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    directory = tmp_path_factory.mktemp(f"l3-dsa-fill-cp{request.param}")
    return directory, launch(request.param, "l3", args={"phase": "fill", "lag": 2}, **_opts(directory))


@pytest.mark.timeout(600)
def test_dsa_fill_spills_kv_and_indexer_once_per_node(filled) -> None:
    """Both pools' bytes of every victim leave the slab with it (none found overwritten, from skewed
    ranks), each pool's store holds each page once per node at the same slot as the other's, every
    record reads back whole under its own pool's namespace, and the fill's own loads are exact."""
    from cpkv import _cpkv

    directory, results = filled
    check_agreed_and_exact(results)
    a, world = results[0], len(results)
    assert a["distinct_pages"] > 4 * SLAB_PAGES
    assert all(r["stats"]["evicted"] == a["stats"]["evicted"] > 0 for r in results)
    assert set(a["closed"]["pools"]) == set(POOLS)
    for pool in POOLS:
        here = [r["closed"]["pools"][pool] for r in results]
        # Every victim spilled in both pools, and every victim of a rank's rows copied out of both.
        assert all(h["l3_pages_spilled"] == here[0]["l3_pages_spilled"] >= a["stats"]["evicted"] for h in here)
        assert all(h["l3_pages_not_copied"] == 0 for h in here), here
        assert all(h["l3_pages_written"] > 0 for h in here)
        # One copy per node: the ranks' writes are the store's pages, each once.
        assert sum(h["l3_pages_written"] for h in here) == here[0]["l3_pages"]
        assert all(h["l3_digest"] == here[0]["l3_digest"] for h in here)
    assert a["stats"]["l3_pools"]["indexer"]["l3_pages_read"] > 0  # the fill loads indexer bytes from L3
    kv, indexer = (a["closed"]["pools"][p] for p in POOLS)
    assert kv["l3_slots"] == indexer["l3_slots"]  # the cap split gives both stores the same slots
    assert kv["l3_pages"] == indexer["l3_pages"] == a["closed"]["l3_pages"] > 0
    assert a["closed"]["l3_disk_bytes"] <= a["closed"]["l3_cap_bytes"] == L3_BYTES
    # On disk (read only): the same placements in both pools, each record whole under its namespace.
    sub = Path(a["closed"]["l3_dir"])
    assert sub.parent == directory
    found = {pool: live_records(sub / pool, world) for pool in POOLS}
    assert found["kv"][1] == found["indexer"][1]
    assert len({key for key, _, _ in found["kv"][1]}) == len(found["kv"][1]) == kv["l3_pages"]
    assert found["kv"][0] != found["indexer"][0]  # the namespace names the pool
    for pool in POOLS:
        namespace, entries, slot_bytes = found[pool]
        page_bytes = a["pool_page_bytes"][pool]
        with open(sub / pool / "data-0.bin", "rb") as f:
            for key, slot, sequence in entries:
                f.seek(slot * slot_bytes)  # one data file: the stores are small
                record = np.frombuffer(f.read(slot_bytes), dtype=np.uint8)
                assert _cpkv.l3_check(record, namespace, key, sequence, page_bytes) is None
                other = found["indexer" if pool == "kv" else "kv"][0]
                assert _cpkv.l3_check(record, other, key, sequence, page_bytes) is not None
    print(f"DSA fill: victims {a['stats']['evicted']}, on disk per pool {kv['l3_pages']} pages, "
          f"written per rank {[r['closed']['pools']['indexer']['l3_pages_written'] for r in results]}, "
          f"{a['closed']['l3_disk_bytes']} of {a['closed']['l3_cap_bytes']} bytes; page bytes {a['pool_page_bytes']}")


@pytest.mark.timeout(600)
def test_dsa_restart_is_warm_with_kv_and_indexer_bytes(filled, tmp_path) -> None:
    """New processes on the directory: batch_exists_v2 finds every page through both pools' L3
    indexes, batch_get_v1 and batch_get_v2 read the KV and the indexer bytes; every rank agrees
    before the MIN, nothing is cut, every byte is exact, and every hit of the fill comes back."""
    directory = copy_filled(filled, tmp_path)
    before = filled[1]
    results = launch(len(before), "l3", args={"phase": "warm"}, **_opts(directory))
    check_agreed_and_exact(results)
    for res in results:
        s = res["stats"]
        assert s["resident"] == 0
        for pool in POOLS:
            p = s["l3_pools"][pool]
            assert p["l3_recovered_pages"] == before[0]["closed"]["pools"][pool]["l3_pages"] > 0
            assert p["l3_read_failures"] == 0 and p["l3_pages_read"] > 0
        for f in res["fetched"]:
            assert f["post"] == f["pre"] and f["loaded"] == f["post"], f
    warm, cold = (sum(f["post"] for f in r[0]["fetched"]) for r in (results, before))
    print(f"DSA hit tokens: fill run {cold}, after the restart {warm}; KV / indexer pages read from L3 "
          f"{[results[0]['stats']['l3_pools'][p]['l3_pages_read'] for p in POOLS]}")
    assert warm == cold > 0


@pytest.mark.timeout(600)
def test_dsa_damaged_indexer_record_is_a_miss_on_every_rank(filled, tmp_path) -> None:
    """Indexer records damaged (their KV records intact): each is a counted miss on every rank, never
    served, the load stops there on every rank alike (same pre-MIN counts), 0 wrong pages."""
    directory = copy_filled(filled, tmp_path)
    world = len(filled[1])
    damaged = damage(next(directory.glob("group-*")) / "indexer", 4, ranks=world)
    assert damaged == 4
    results = launch(world, "l3", args={"phase": "warm"}, **_opts(directory))
    check_agreed_and_exact(results)
    for res in results:
        pools = res["stats"]["l3_pools"]
        assert pools["indexer"]["l3_read_failures"] >= 1 and pools["kv"]["l3_read_failures"] == 0, pools
        assert pools["indexer"]["l3_rejects"], pools
    loads = [[f["loaded"] for f in r["fetched"]] for r in results]
    assert all(load == loads[0] for load in loads)
    full = sum(f["post"] for f in filled[1][0]["fetched"])
    assert 0 < sum(loads[0]) < full
    print(f"{damaged} indexer records damaged: read failures per rank "
          f"{[r['stats']['l3_pools']['indexer']['l3_read_failures'] for r in results]}, tokens loaded "
          f"{sum(loads[0])} of {full}")


@pytest.mark.timeout(600)
def test_a_pool_registered_after_l3_opened_is_refused(tmp_path) -> None:
    """L3 splits its cap between the pools SGLang registers before ``on_host_pools_registered``; a
    later one is a typed error naming cpkv_l3_dir, and the backend goes on with its pools."""
    res = launch(1, "l3_late_pool", **_opts(tmp_path))[0]
    assert res["refused"] is not None and res["refused"].startswith("InvalidArgumentError"), res
    assert "cpkv_l3_dir" in res["refused"] and "late-sidecar" in res["refused"]
    assert res["before"] == res["after"] == list(POOLS)
    assert res["fetched"]["loaded"] == res["fetched"]["post"] == res["pages"] * 64
    assert res["fetched"]["wrong"] == res["fetched"]["sidecar_wrong"] == 0


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 1 << 34), page_bytes=st.lists(st.integers(1, 1 << 22), min_size=1, max_size=3),
       ranks=st.integers(1, 8))
def test_split_cap_gives_every_pool_the_same_slots_within_the_cap(cap, page_bytes, ranks) -> None:
    """The most slots every pool's store can have together: equal slot counts, caps summing to at most
    the node's cap, and one more slot each would not fit."""
    from cpkv import _cpkv
    from cpkv.errors import InvalidArgumentError
    from cpkv.integrations.sglang.l3 import split_cap
    from cpkv.tier.l3.store import slots_for

    pools = {f"p{i}": b for i, b in enumerate(page_bytes)}
    slot_bytes = {n: int(_cpkv.l3_record_bytes(b)) for n, b in pools.items()}
    try:
        caps = split_cap(cap, pools, ranks)
    except InvalidArgumentError:
        caps = None
    if caps is None:  # then not even one slot each fits: the least caps of one slot (to 512 bytes) exceed it
        step = 512
        least = [min((c for c in range(0, cap + step, step) if slots_for(c, sb, ranks) >= 1), default=cap + step)
                 for sb in slot_bytes.values()]
        assert sum(least) > cap - step * len(least)
        return
    slots = {n: slots_for(caps[n], slot_bytes[n], ranks) for n in pools}
    assert len(set(slots.values())) == 1 and min(slots.values()) >= 1
    assert sum(caps.values()) <= cap
    n = next(iter(slots.values()))
    # Maximal: the least caps reaching n + 1 slots each do not fit together.
    bigger = 0
    for sb in slot_bytes.values():
        low, high = 0, 1
        while slots_for(high, sb, ranks) < n + 1:
            low, high = high, high * 2
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if slots_for(mid, sb, ranks) >= n + 1 else (mid + 1, high)
        bigger += high
    assert bigger > cap
