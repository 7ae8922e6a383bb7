"""The periodic digest check covers the L3 indexes: one rank's L3 index given one extra placement
(its slab index unchanged) raises DivergenceError on every rank, at CP 2 on one node (the slab and L3
digests combined in one check) and at CP 4 as two simulated nodes (each node agrees on its own L3
index, then the group on the slab index and on whether every node did)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import launch


def _opts(directory: Path, **more) -> dict:
    return dict(kind="dsa", pages=64, model="digest-model", l3_dir=str(directory), l3_bytes=8 << 20, **more)


def _check(results: list[dict]) -> None:
    for res in results:
        assert res["error_seen"] is not None and res["error_seen"].startswith("DivergenceError"), res
        assert "L3" in res["error_seen"], res
    # One thing changed: every rank stored the same requests (the slab index agreed at the first
    # check, and the next store is the same on every rank); only the odd rank's L3 index differs. (After
    # the error each rank stops at its own point, so later digests are not compared.)
    assert len({r["slab_digest_after_first"] for r in results}) == 1


@pytest.mark.timeout(600)
def test_a_divergent_l3_index_raises_on_every_rank_of_one_node(tmp_path) -> None:
    _check(launch(2, "l3_diverged", **_opts(tmp_path)))


@pytest.mark.timeout(600)
def test_a_divergent_l3_index_on_one_node_raises_on_every_rank_of_two(tmp_path) -> None:
    results = launch(4, "l3_diverged", **_opts(tmp_path, ranks_per_node=2))
    _check(results)
    assert "this rank's: 0" in results[3]["error_seen"] and "this rank's: 1" in results[0]["error_seen"]
