"""The SGLang backend's L3 directory on a small tmpfs: a cap beyond the free space is refused by
name with nothing left behind, a disk that fills mid-run stops L3 writes on every rank with no
false divergence, and an earlier model's store groups are reclaimed so the directory stays within
the cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cpkv.tier.l3.directory import LOCK_FILE, tree_bytes
from harness import launch

SLAB_PAGES = 32


def _opts(directory: Path, kind: str, cap: int) -> dict:
    return dict(kind=kind, pages=SLAB_PAGES, model=f"disk-{kind}", l3_dir=str(directory), l3_bytes=cap)


@pytest.mark.timeout(600)
def test_a_cap_beyond_the_free_space_is_refused_by_name_and_leaves_nothing(small_disk: Path) -> None:
    with pytest.raises(AssertionError) as failed:
        launch(2, "l3", args={"phase": "fill"}, **_opts(small_disk, "gqa", 64 << 20))
    message = str(failed.value)
    assert message.count("InvalidArgumentError: extra config key 'cpkv_l3_bytes' 67108864 is more than") == 2, message
    files = [os.path.join(root, f) for root, _, names in os.walk(small_disk) for f in names if f != LOCK_FILE]
    assert files == [] and tree_bytes(small_disk) == 0


@pytest.mark.timeout(600)
def test_a_disk_full_mid_run_stops_l3_writes_on_every_rank_with_no_divergence(small_disk: Path) -> None:
    results = launch(2, "l3_full_disk", **_opts(small_disk, "gqa", 8 << 20))
    assert [r["error_seen"] for r in results] == [None, None], results
    assert len({r["digest"] for r in results}) == 1 and len({r["l3_digest"] for r in results}) == 1
    assert len({r["spilled"] for r in results}) == 1 and results[0]["spilled"] > 0
    for r in results:
        assert all(r["stopped"].values()), r["stopped"]
    assert any("ENOSPC" in s for r in results for s in r["stopped"].values())
    assert results[0]["checks"] == results[1]["checks"] > 3


@pytest.mark.timeout(900)
def test_an_earlier_models_store_groups_are_reclaimed_within_the_cap(small_disk: Path) -> None:
    cap = 4 << 20
    launch(2, "l3", args={"phase": "fill", "requests": 12}, **_opts(small_disk, "dsa", cap))
    dsa_groups = sorted(p.name for p in small_disk.iterdir() if p.is_dir())
    launch(2, "l3", args={"phase": "fill", "requests": 12}, **_opts(small_disk, "gqa", cap))
    groups = sorted(p.name for p in small_disk.iterdir() if p.is_dir())
    assert not set(dsa_groups) & set(groups), (dsa_groups, groups)
    assert tree_bytes(small_disk) <= cap


@pytest.mark.timeout(600)
def test_a_second_server_on_the_directory_is_refused_by_name_on_every_rank(tmp_path: Path) -> None:
    results = launch(2, "l3_second_server", **_opts(tmp_path, "gqa", 8 << 20))
    for r in results:
        same, other = r["refusals"]["same"], r["refusals"]["other"]
        assert same is not None and same.startswith("InvalidArgumentError: extra config key 'cpkv_l3_dir'"), same
        assert "is in use by another process" in same or "another rank" in same, same
        assert other is not None and other.startswith("InvalidArgumentError: extra config key 'cpkv_l3_dir'"), other
        assert "group-0-0-0-node0 is in use by another process" in other, other
        assert r["digest_kept"]
        assert r["dirs"] == ["group-0-0-0-node0"], "the refused server left nothing behind"
