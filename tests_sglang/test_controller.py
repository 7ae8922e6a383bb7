"""Real HiCacheControllers in 2 and 4 gloo processes (one attention-CP group) over cpkv's backend:
write_storage on every rank, then prefetch on every rank."""

from __future__ import annotations

import pytest

from harness import launch


def _check_roundtrip(results: list[dict], cp: int, nodes: int = 1, sliced: bool = False, pools: int = 1) -> None:
    first = results[0]
    pages = first["pages"]
    for res in results:
        assert res["digest"] == first["digest"]
        for got, n in zip(res["fetched"], pages):
            # Every page stored is found on every rank, before and after SGLang's MIN, and loaded intact.
            assert got["pre"] == n * 4 and got["post"] == n * 4 and got["loaded"] == n * 4, got
            assert got["wrong"] == 0 and got["sidecar_wrong"] == 0, got
        assert res["stats"]["torn_reads_refused"] == 0 and res["stats"]["broken"] is None
        assert res["stats"]["digest_checks"] == res["stats"]["stores"] // 4 > 0
        assert res["stats"]["copy"]["kv"] == "native"
        # One copy per node: the slab holds each distinct page once, whatever the CP size.
        assert res["slab_bytes_in_use"] == first["distinct_pages"] * res["row_bytes"]
        assert res["stats"]["nodes"] == nodes
    node_size = cp // nodes
    assert first["row_bytes"] == first["part_bytes"] * (node_size if sliced else 1)
    # Written once per node: the ranks of a node share the writes of the replicated layout.
    written = sum(r["stats"]["pages_written"] for r in results)
    assert written == first["distinct_pages"] * (cp if sliced else nodes) * pools


@pytest.mark.timeout(400)
@pytest.mark.parametrize("cp", [2, 4])
def test_v1_roundtrip(cp: int) -> None:
    results = launch(cp, "roundtrip", v1=True)
    _check_roundtrip(results, cp)


@pytest.mark.timeout(400)
def test_tensor_calls_without_interface_v1() -> None:
    """Without "interface_v1" SGLang's controller uses the older batch_set/batch_get with flat page tensors."""
    results = launch(2, "roundtrip", v1=False)
    _check_roundtrip(results, 2)


@pytest.mark.timeout(400)
def test_v2_sidecar_sliced() -> None:
    """v2 with a sidecar pool (the NSA indexer's name), each rank holding its own slice of every page."""
    results = launch(2, "roundtrip", v1=True, layout="sliced", args={"sidecar": True})
    _check_roundtrip(results, 2, sliced=True, pools=2)
    for res in results:
        n0 = res["pages"][0]
        assert res["exists_v2"] == [n0, {"kv": n0, "indexer": n0}]
        assert res["get_v2"] == {"kv": n0, "indexer": n0} and res["get_v2_wrong"] == 0
        assert res["side_slab_bytes_in_use"] > 0


@pytest.mark.timeout(400)
def test_two_nodes_of_two() -> None:
    """CP 4 as 2 simulated nodes of 2: one slab per node, each page once per node."""
    results = launch(4, "roundtrip", v1=True, ranks_per_node=2)
    _check_roundtrip(results, 4, nodes=2)
    assert sorted(r["stats"]["node"] for r in results) == [0, 0, 1, 1]


@pytest.mark.timeout(400)
def test_tp_times_cp_groups_keep_their_own_slab() -> None:
    """TP 4 as 2 attention-TP ranks x CP 2: two CP groups ({0, 2} and {1, 3}) whose pages differ
    (other heads); each group shares its own slab, and nothing crosses between them."""
    results = launch(4, "roundtrip", v1=True, cp=2)
    for group in ((0, 2), (1, 3)):
        a, b = (results[r] for r in group)
        assert a["digest"] == b["digest"]
        assert a["stats"]["cp_size"] == 2 and a["stats"]["node_size"] == 2
        for res in (a, b):
            for got, n in zip(res["fetched"], res["pages"]):
                assert got["pre"] == got["post"] == got["loaded"] == n * 4 and got["wrong"] == 0, got
            assert res["slab_bytes_in_use"] == res["distinct_pages"] * res["row_bytes"]
        assert a["stats"]["pages_written"] + b["stats"]["pages_written"] == a["distinct_pages"]
