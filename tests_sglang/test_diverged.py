"""Ranks whose stores differ: the digest check raises DivergenceError on every rank, and before it
does, a rank whose index diverged reads misses, never another key's bytes."""

from __future__ import annotations

import pytest

from harness import launch


@pytest.mark.timeout(600)
def test_divergent_store_raises_on_every_rank() -> None:
    results = launch(2, "diverged")
    for res in results:
        assert res["error_seen"] is not None and res["error_seen"].startswith("DivergenceError"), res
        assert res["stats"]["broken"].startswith("DivergenceError")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["gqa", "dsa"])
def test_a_rank_that_missed_a_store_never_loads_another_keys_bytes(kind: str) -> None:
    """Rank 1 never stores request 2; its later pages get other rows or handles than rank 0's, and
    rows written by one rank for one key are found by the other under another key. Each row's key
    tag makes every such read a miss."""
    zero, one = launch(2, "missed_store", kind=kind)
    assert zero["digest"] != one["digest"]  # the divergence the digest check would raise
    for res in (zero, one):
        for got in res["fetched"]:
            assert got["wrong"] == 0 and got["sidecar_wrong"] == 0, res["fetched"]
    # Not vacuous: both ranks load pages, and the diverged rank's mismatched rows are refused (SGLang's
    # MIN then cuts every rank to what both could read).
    assert sum(g["loaded"] for g in zero["fetched"]) > 0
    pre = [(a["pre"], b["pre"]) for a, b in zip(zero["fetched"], one["fetched"])]
    assert any(a != b for a, b in pre), pre
