"""The L3 tier under the SGLang backend (``cpkv_l3_dir`` / ``cpkv_l3_bytes``), through SGLang's own
controller stack in gloo processes.

One fill at CP 2 (module fixture): a 32-row slab under a stream of far more distinct pages, rank 1's
backup thread two requests behind rank 0's (so rank 0 reuses rows whose old pages rank 1 has not
reached yet), then every request prefetched and checked, then a clean stop. Each test then starts
new processes on a copy of that directory: restart-warm, damaged records, a foreign namespace.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from harness import launch
from l3_files import check_agreed_and_exact, copy_filled, damage

SLAB_PAGES = 32
L3_BYTES = 8 << 20
MODEL = "test-model-a"


def _opts(directory: Path, model: str = MODEL) -> dict:
    return dict(kind="gqa", pages=SLAB_PAGES, model=model, l3_dir=str(directory), l3_bytes=L3_BYTES)


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    directory = tmp_path_factory.mktemp("l3-fill")
    results = launch(2, "l3", args={"phase": "fill", "lag": 2}, **_opts(directory))
    return directory, results


def _hits(result: dict) -> list[int]:
    return [f["post"] for f in result["fetched"]]


@pytest.mark.timeout(900)
def test_fill_spills_each_victim_once_per_node_from_skewed_ranks(filled) -> None:
    """Rank 1 two requests late: the rank that overwrites a row is the one that copies its victim out,
    so every victim of a rank's rows is copied (none found already overwritten), each page is on
    disk once per node, every rank holds the same L3 index, and the fill's own loads are exact."""
    directory, results = filled
    check_agreed_and_exact(results)
    a, b = results
    assert a["distinct_pages"] > 4 * SLAB_PAGES
    assert a["stats"]["evicted"] == b["stats"]["evicted"] > 0
    assert a["stats"]["l3_pages_spilled"] == b["stats"]["l3_pages_spilled"] == a["stats"]["evicted"]
    assert a["stats"]["l3_pages_read"] > 0  # the fill itself loads evicted pages back from L3
    assert a["closed"]["l3_digest"] == b["closed"]["l3_digest"]
    for res in results:
        assert res["closed"]["l3_pages_not_copied"] == 0, res["closed"]
        assert res["closed"]["l3_pages_written"] > 0  # both ranks write their rows' victims
        assert res["closed"]["l3_disk_bytes"] <= res["closed"]["l3_cap_bytes"]
    # One copy per node: the pages written by the two ranks are the index's pages, each once.
    written = a["closed"]["l3_pages_written"] + b["closed"]["l3_pages_written"]
    print(f"fill: hit tokens {sum(_hits(a))}, L3 pages read per rank {[r['stats']['l3_pages_read'] for r in results]}, "
          f"victims spilled {a['stats']['l3_pages_spilled']} (+{a['closed']['l3_pages_spilled'] - a['stats']['l3_pages_spilled']}"
          f" at the clean stop), written per rank {[r['closed']['l3_pages_written'] for r in results]}, "
          f"on disk {a['closed']['l3_pages']} pages, {a['closed']['l3_disk_bytes']} of {a['closed']['l3_cap_bytes']} bytes")
    assert written == a["closed"]["l3_pages"]
    # On disk (read only): every record the node's two logs name reads back whole, one per key.
    from cpkv import _cpkv

    sub = Path(a["closed"]["l3_dir"]) / "kv"
    assert sub.parent.parent == directory
    logs = [(sub / f"index-r{r}.log").read_bytes() for r in range(2)]
    namespace, slot_bytes, slots = (int.from_bytes(logs[0][at:at + 8], "little") for at in (16, 24, 32))
    index, _, valid = _cpkv.L3Index.recover(slots, 2, logs, namespace, slot_bytes)
    assert valid == [len(log) for log in logs]
    entries = index.entries()
    assert len(entries) == written == len({key for key, _, _ in entries})
    page_bytes = a["page_bytes"]
    with open(sub / "data-0.bin", "rb") as f:
        for key, slot, sequence in entries:
            f.seek(slot * slot_bytes)
            record = np.frombuffer(f.read(slot_bytes), dtype=np.uint8)
            assert _cpkv.l3_check(record, namespace, key, sequence, page_bytes) is None


@pytest.mark.timeout(900)
def test_restart_is_warm_and_every_byte_served_is_exact(filled, tmp_path) -> None:
    """New processes, same directory and settings: the empty slab misses, L3's recovered index answers
    batch_exists, batch_get_v1 reads the records; every rank agrees before the MIN, nothing is cut,
    and every page loaded is byte-exact. All the fill's hits come back."""
    directory = copy_filled(filled, tmp_path)
    before = filled[1]
    results = launch(2, "l3", args={"phase": "warm"}, **_opts(directory))
    check_agreed_and_exact(results)
    for res in results:
        s = res["stats"]
        assert s["resident"] == 0 and s["l3_recovered_pages"] == before[0]["closed"]["l3_pages"]
        assert s["l3_read_failures"] == 0
        for f in res["fetched"]:
            assert f["post"] == f["pre"] and f["loaded"] == f["post"], f
    warm = sum(_hits(results[0]))
    print(f"hit tokens: fill run {sum(_hits(before[0]))}, after the restart {warm}; "
          f"L3 pages read after the restart: {results[0]['stats']['l3_pages_read']}")
    assert warm == sum(_hits(before[0])) > 0
    # Read once per node: every rank loaded every hit, but each record came off the disk once.
    _check_read_once_per_node(results)


def _check_read_once_per_node(results: list[dict]) -> None:
    """The node's ranks together read each distinct page they loaded from disk once (not once per
    rank, nor once per request that hit it); every other load came from the staging area; no
    name of the area is left in /dev/shm."""
    distinct = results[0]["distinct_loaded"]
    assert distinct > 0 and all(r["distinct_loaded"] == distinct for r in results)
    disk = [r["stats"]["l3_disk_reads"] for r in results]
    served = [r["stats"]["l3_pages_read"] for r in results]
    print(f"{len(results)} ranks, {distinct} distinct pages loaded from L3: pages served per rank {served}, "
          f"disk reads per rank {disk} ({sum(disk) / distinct:.2f} per page per node; before the staging area "
          f"every served page was a disk read: {sum(served) / distinct:.2f}), prefetch seconds per rank "
          f"{[round(r['prefetch_s'], 2) for r in results]}")
    assert sum(disk) == distinct
    for r in results:
        s = r["stats"]
        assert s["l3_staging_hits"] + s["l3_disk_reads"] == s["l3_pages_read"] + s["l3_read_failures"]
        assert [n for n in os.listdir("/dev/shm") if s["l3_staging_run_id"] in n] == []


@pytest.mark.timeout(900)
def test_a_late_rank_is_served_from_the_staging_area(filled, tmp_path) -> None:
    """Rank 1 makes each of its L3 reads only after rank 0 has finished the same one: it reads no
    record from disk, every page it loads comes from shared memory, byte-exact."""
    marks = tmp_path / "marks"
    marks.mkdir()
    results = launch(2, "l3", args={"phase": "warm", "late_reads": str(marks)}, **_opts(copy_filled(filled, tmp_path)))
    check_agreed_and_exact(results)
    _check_read_once_per_node(results)
    early, late = (r["stats"] for r in results)
    assert early["l3_disk_reads"] == results[0]["distinct_loaded"] and late["l3_disk_reads"] == 0
    assert late["l3_staging_hits"] == late["l3_pages_read"] > 0


@pytest.mark.timeout(900)
def test_a_late_rank_after_the_entries_were_reused_reads_from_disk(filled, tmp_path) -> None:
    """The same with a staging area of 4 entries: by the time rank 1 comes, rank 0 has reused most
    entries for later records, so rank 1 reads those itself (each counted as a disk read), the rest
    from the area; every page right either way."""
    marks = tmp_path / "marks"
    marks.mkdir()
    results = launch(2, "l3", args={"phase": "warm", "late_reads": str(marks)},
                     **_opts(copy_filled(filled, tmp_path)), staging_pages=4)
    check_agreed_and_exact(results)
    for res in results:
        s = res["stats"]
        assert s["l3_staging_entries"] == 4 and s["l3_read_failures"] == 0
        assert s["l3_staging_hits"] + s["l3_disk_reads"] == s["l3_pages_read"]
        for f in res["fetched"]:
            assert f["loaded"] == f["post"], f
    late = results[1]["stats"]
    assert 0 < late["l3_disk_reads"] < late["l3_pages_read"] and late["l3_staging_hits"] > 0
    print(f"4 staging entries, rank 1 late: disk reads per rank {[r['stats']['l3_disk_reads'] for r in results]}, "
          f"staging hits per rank {[r['stats']['l3_staging_hits'] for r in results]}")


@pytest.mark.timeout(900)
def test_a_claimant_killed_mid_read_leaves_the_others_a_correct_answer(filled, tmp_path) -> None:
    """Rank 1 claims the staging entries of the pages both ranks need, then is SIGKILLed before it
    reads any. Rank 0 waits for the claims (cpkv_timeout_s), takes them over, reads the records and
    loads every page byte-exact; /dev/shm keeps nothing of the area."""
    timeout_s = 5
    results = launch(2, "l3_killed_claimant", args={"marker": str(tmp_path / "claimed")},
                     **_opts(copy_filled(filled, tmp_path)), timeout_s=timeout_s)
    survivor, dead = results
    assert dead is None  # SIGKILLed before it could report
    s = survivor["stats"]
    assert survivor["hits"] > 0 and survivor["loaded"] == survivor["hits"] and survivor["wrong"] == 0, survivor
    assert s["l3_staging_waits"] == s["l3_staging_takeovers"] == s["l3_disk_reads"] == survivor["hits"]
    assert survivor["seconds"] < timeout_s + 30, survivor
    assert [n for n in os.listdir("/dev/shm") if survivor["run_id"] in n] == []


@pytest.mark.timeout(900)
def test_damaged_records_are_counted_misses_never_served(filled, tmp_path) -> None:
    directory = copy_filled(filled, tmp_path)
    damaged = damage(next(directory.glob("group-*")) / "kv", 6)
    results = launch(2, "l3", args={"phase": "warm"}, **_opts(directory))
    check_agreed_and_exact(results)  # 0 wrong pages: a damaged record is never loaded
    failures = [r["stats"]["l3_read_failures"] for r in results]
    assert all(f >= 1 for f in failures), failures
    # The same miss on every rank, and each damaged record read from disk once on the node.
    assert failures[0] == failures[1]
    assert sum(r["stats"]["l3_disk_read_failures"] for r in results) == failures[0]
    assert all(r["stats"]["l3_rejects"] for r in results)
    loaded = sum(f["loaded"] for f in results[0]["fetched"])
    assert 0 < loaded < sum(_hits(filled[1][0]))
    assert np.all([f["loaded"] <= f["post"] for f in results[0]["fetched"]])
    print(f"{damaged} records damaged: read failures per rank {failures}, tokens loaded {loaded}, "
          f"L3 pages read per rank {[r['stats']['l3_pages_read'] for r in results]}")


@pytest.mark.timeout(900)
def test_a_foreign_namespace_starts_cold(filled, tmp_path) -> None:
    """Another model on the same directory: nothing recovered, nothing served."""
    directory = copy_filled(filled, tmp_path)
    results = launch(2, "l3", args={"phase": "warm"}, **_opts(directory, model="test-model-b"))
    for res in results:
        assert res["stats"]["l3_recovered_pages"] == 0
        assert sum(f["post"] for f in res["fetched"]) == 0


@pytest.mark.timeout(1200)
def test_cp4_as_two_nodes_one_copy_per_node_and_warm_after_restart(tmp_path) -> None:
    """CP 4 as two simulated nodes of two ranks: one L3 directory per node, each page written once
    per node (by its row's writer on that node), every rank's L3 index the same; new processes on
    the same directory get every hit back, byte-exact."""
    opts = dict(_opts(tmp_path), ranks_per_node=2)
    fill = launch(4, "l3", args={"phase": "fill", "requests": 16}, **opts)
    pre = [[f["pre"] for f in r["fetched"]] for r in fill]
    assert all(p == pre[0] for p in pre)
    assert all(f["wrong"] == 0 for r in fill for f in r["fetched"])
    nodes = sorted({r["closed"]["l3_dir"] for r in fill})
    assert len(nodes) == 2
    assert len({r["closed"]["l3_digest"] for r in fill}) == 1
    for node in nodes:
        here = [r for r in fill if r["closed"]["l3_dir"] == node]
        assert len(here) == 2
        assert sum(r["closed"]["l3_pages_written"] for r in here) == here[0]["closed"]["l3_pages"] > 0
        assert all(r["closed"]["l3_pages_not_copied"] == 0 for r in here)
    warm = launch(4, "l3", args={"phase": "warm", "requests": 16}, **opts)
    pre = [[f["pre"] for f in r["fetched"]] for r in warm]
    assert all(p == pre[0] for p in pre)
    for res in warm:
        assert res["stats"]["l3_read_failures"] == 0
        for f in res["fetched"]:
            assert f["wrong"] == 0 and f["post"] == f["pre"] and f["loaded"] == f["post"], f
    for node in nodes:  # each node's staging area: its pages read from disk once on that node
        _check_read_once_per_node([r for r in warm if r["stats"]["l3_dir"] == node])
    print(f"CP 4 (2 nodes): hit tokens fill {sum(_hits(fill[0]))}, after the restart {sum(_hits(warm[0]))}; "
          f"on disk per node {[next(r for r in fill if r['closed']['l3_dir'] == n)['closed']['l3_pages'] for n in nodes]}")
    assert sum(_hits(warm[0])) == sum(_hits(fill[0])) > 0
