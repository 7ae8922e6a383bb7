"""The cluster tier under cpkv's SGLang backend, against a real ``cpkv cluster serve``, through the
stack SGLang's server builds (:mod:`harness`) in gloo processes at CP 2: a second instance starts
warm from the first's pages, every byte checked; a flipped byte in the store is a counted miss;
another dtype misses; DSA KV without its indexer is never a hit; a master down at start is refused
by name; a master killed mid-run: no hang, misses only, every rank marks the tier unavailable; a
master killed and started again on the same ports: every rank marks the tier unavailable and then
re-attaches it at one digest check, cold, and its new pages serve a second instance (2 ranks and 1)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cluster_serve import Served, restart_serve, start_serve
from harness import launch
from waiting import wait_for

SLAB_PAGES = 16  # far fewer than the requests' distinct pages: most leave the slab by eviction


def _run(served: Served, phase: str, kind: str = "gqa", seed: int = 7, world: int = 2, **args) -> list[dict]:
    return launch(world, "cluster", kind=kind, pages=SLAB_PAGES, model=f"cluster-test-{kind}", timeout_s=10,
                  cluster_master=served.master, cluster_metadata=served.metadata,
                  kv_dtype=args.pop("kv_dtype", None), args=dict(phase=phase, seed=seed, **args))


def _loaded_pages(results: list[dict]) -> list[list[int]]:
    return [[f["loaded"] for f in r["fetched"]] for r in results]


@pytest.fixture(scope="module")
def filled(served: Served) -> list[dict]:
    """One GQA instance's pages in the cluster (the tests below read them with new instances)."""
    return _run(served, "fill", seed=7)


@pytest.mark.timeout(600)
def test_a_second_instance_starts_warm_from_the_first_and_every_byte_is_exact(served: Served, filled) -> None:
    put = sum(r["closed"]["cluster_pages_put"] for r in filled)
    # One copy per cluster: the ranks' puts are each distinct page once.
    assert put == filled[0]["distinct_pages"], (put, filled[0]["distinct_pages"])
    warm = _run(served, "warm", seed=7)
    for r in warm:
        assert all(f["wrong"] == 0 for f in r["fetched"])
        # Every page of every request is a hit: the slab is empty, so each comes from the cluster.
        assert [f["loaded"] for f in r["fetched"]] == [p * 4 for p in r["pages"]]
        assert r["stats"]["cluster_pages_read"] > 0 and r["stats"]["cluster_corrupt_dropped"] == 0
    assert _loaded_pages(warm)[0] == _loaded_pages(warm)[1]


@pytest.mark.timeout(600)
def test_another_kv_dtype_misses(served: Served, filled) -> None:
    other = _run(served, "warm", seed=7, kv_dtype="bfloat16")  # same bytes per page as float16
    for r in other:
        assert all(f["loaded"] == 0 for f in r["fetched"])
        assert r["stats"]["cluster_pages_read"] == 0


@pytest.mark.timeout(600)
def test_a_flipped_byte_in_the_store_is_a_counted_miss_never_served(served: Served, filled) -> None:
    warm = _run(served, "warm", seed=7, flip=True, store_pid=served.children()["store"])
    for r in warm:
        assert all(f["wrong"] == 0 for f in r["fetched"])
        assert r["fetched"][0]["loaded"] == 0, "the request's first page failed its check: nothing is loaded"
        assert r["stats"]["cluster_corrupt_dropped"] >= 1
    assert any(f["loaded"] > 0 for f in warm[0]["fetched"][1:])


@pytest.mark.timeout(600)
def test_dsa_kv_without_its_indexer_is_never_a_hit(served: Served) -> None:
    filled = _run(served, "fill", kind="dsa", seed=17)
    assert all(r["closed"]["cluster_pools"]["indexer"]["cluster_pages_put"] > 0 for r in filled)
    # One instance: every request hits whole (KV and indexer), then rank 0 removes every indexer record.
    for r in _run(served, "warm", kind="dsa", seed=17, drop_pool="indexer"):
        whole, dropped = r["fetched"][:len(r["pages"])], r["fetched"][len(r["pages"]):]
        assert [f["loaded"] for f in whole] == [p * 64 for p in r["pages"]]
        assert all(f["wrong"] == 0 and f["sidecar_wrong"] == 0 for f in whole)
        assert all(f["loaded"] == 0 and f["pre"] == 0 for f in dropped), "KV records alone are no hit"


def test_a_master_down_at_start_is_refused_naming_the_key() -> None:
    from cpkv.tier.cluster.local import free_port

    master = f"127.0.0.1:{free_port()}"
    with pytest.raises(AssertionError) as failed:
        launch(1, "cluster", pages=SLAB_PAGES, model="cluster-test-gqa", timeout_s=2, cluster_master=master,
               cluster_metadata=f"http://127.0.0.1:{free_port()}/metadata", args=dict(phase="fill"))
    text = str(failed.value)
    assert "InvalidArgumentError" in text and f"extra config key 'cpkv_cluster_master' '{master}'" in text, text


@pytest.mark.timeout(600)
def test_a_master_killed_mid_run_gives_misses_only_and_every_rank_marks_the_tier_unavailable() -> None:
    own = start_serve()
    try:
        _run(own, "fill", seed=19)
        results = _run(own, "kill", seed=19, master_pid=own.children()["master"])
    finally:
        own.stop()
    for r in results:
        assert all(f["wrong"] == 0 for f in r["fetched"])
        assert r["stats"]["cluster_available"] == 0, r["stats"].get("cluster_unavailable")
    assert _loaded_pages(results)[0] == _loaded_pages(results)[1]
    assert any(f["loaded"] > 0 for f in results[0]["fetched"][:3]), "hits from the cluster before the kill"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 1])
def test_a_restarted_master_is_reattached_on_every_rank_at_one_check_cold_and_serves_again(
        world: int, tmp_path: Path) -> None:
    own = start_serve()
    marked, restarted = tmp_path / "marked", tmp_path / "restarted"
    over = threading.Event()
    box: dict = {}

    def restart() -> None:  # once the ranks marked the tier unavailable: a new master on the same ports
        try:
            wait_for(lambda: marked.exists() or over.is_set(), 300, "the ranks to mark the tier unavailable")
            if not over.is_set():
                box["served"] = restart_serve(own)
                restarted.touch()
        except BaseException as err:  # noqa: BLE001 -- reported by the test below
            box["error"] = err

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    try:
        _run(own, "fill", seed=23, world=world)
        results = _run(own, "restart", seed=23, world=world, master_pid=own.children()["master"],
                       marked=str(marked), restarted=str(restarted))
        over.set()
        thread.join(60)
        assert "error" not in box, box.get("error")
        # A second instance: every page of the requests stored after the re-attach, from the cluster.
        warm = _run(box["served"], "warm", seed=24, world=world)
    finally:
        over.set()
        thread.join(60)
        if "served" in box:
            box["served"].stop()
        own.stop()
    for r in results:
        assert all(f["wrong"] == 0 for f in r["fetched"])
        stats = r["closed"]
        assert stats["cluster_available"] == 1 and stats["cluster_unavailable_marks"] == 1, stats
        assert stats["cluster_reattaches"] == 1 and stats["cluster_probes"] >= 1, stats
        assert r["off"]["cluster_available"] == 0 and r["on"]["cluster_available"] == 1
        marked_at, reattached_at = stats["cluster_marked_unavailable_at"], stats["cluster_reattached_at"]
        assert len(marked_at) == len(reattached_at) == 1 and marked_at[0] < reattached_at[0], stats
        assert r["closed"]["cluster_pages_put"] > 0
    # Every rank at the same digest check (by the store it follows), with the same loads throughout.
    assert len({(r["closed"]["cluster_marked_unavailable_at"][0], r["closed"]["cluster_reattached_at"][0],
                 r["turns_off"], r["turns_on"]) for r in results}) == 1
    assert len({tuple(f["loaded"] for f in r["fetched"]) for r in results}) == 1
    assert any(f["loaded"] > 0 for f in results[0]["fetched"][:3]), "hits before the kill"
    for r in warm:
        assert all(f["wrong"] == 0 for f in r["fetched"])
        assert [f["loaded"] for f in r["fetched"]] == [p * 4 for p in r["pages"]], "every page from the cluster"
        assert r["stats"]["cluster_pages_read"] > 0 and r["stats"]["cluster_corrupt_dropped"] == 0
