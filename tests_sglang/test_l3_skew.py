"""The L3 tier under skewed ranks with a tiny cap, through the stack SGLang's server builds (GQA and
DSA, CP 2): rank 1's backup thread 0 to 8 requests behind rank 0's, so rank 1 writes its share of
each spill after rank 0 has already reused those slots, and rank 0 reads records rank 1 has not
written yet.

- Every record the logs name is on disk and checks good after the stores return: a late rank's
  older record never overwrites a newer placement (:mod:`cpkv.tier.l3.order`).
- A record read before its writer wrote it is a transient miss: once rank 1 has caught up, every
  page every pool's L3 index holds is served on both ranks, none refused, none wrong.

One launch per model runs every lag (each on a fresh directory), so the test stays quick.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import launch
from l3_files import lost_records

LAGS = list(range(9))
SLAB_PAGES = 16
# Tiny caps: GQA 15 slots of 4 KiB records, DSA 8 slots in each of its two pools.
CAPS = {"gqa": 100 << 10, "dsa": 300 << 10}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["gqa", "dsa"])
def test_skewed_ranks_lose_no_logged_record_and_serve_every_held_page(kind: str, tmp_path: Path) -> None:
    results = launch(2, "l3_skew", wall_s=800, kind=kind, pages=SLAB_PAGES, model=f"test-skew-{kind}",
                     l3_dir=str(tmp_path), l3_bytes=CAPS[kind], args={"root": str(tmp_path), "lags": LAGS})
    report = []
    for lag in LAGS:
        ranks = [res[str(lag)] for res in results]
        a = ranks[0]
        logged = lost = 0  # after the clean stop
        for pool in a["pools"]:
            n, bad = lost_records(Path(a["dir"]) / pool, 2, a["page_bytes"][pool])
            logged, lost = logged + n, lost + bad
        report.append(f"lag {lag}: slots {a['slots']}, logged records lost {a['lost_open']} of {a['logged_open']} "
                      f"with the stores open, {lost} of {logged} after the clean stop; refused "
                      f"{[r['refused'] for r in ranks]} of {a['held']} held, reads not written "
                      f"{[r['not_written'] for r in ranks]}, superseded {[r['superseded'] for r in ranks]}")
        good = (logged > 0 and a["logged_open"] > 0 and lost == 0 and a["lost_open"] == 0
                and all(r["wrong"] == 0 for r in ranks) and all(r["held"] == a["held"] > 0 for r in ranks)
                and all(r["refused"] == 0 for r in ranks))
        report[-1] += "" if good else "  <- FAILED"
    print(f"{kind}:\n" + "\n".join(report))
    assert not any(line.endswith("FAILED") for line in report), "\n".join(report)


@pytest.mark.timeout(600)
def test_a_page_read_before_its_writer_wrote_it_is_served_once_written(tmp_path: Path) -> None:
    """Rank 0 reads every page L3 holds before rank 1 has written its share (a room for every page:
    no slot is reused): those are misses now, never rejections, so once rank 1 has caught up every
    held page is served on both ranks, byte-exact."""
    results = launch(2, "l3_read_before_write", kind="gqa", pages=SLAB_PAGES, model="test-skew-early",
                     l3_dir=str(tmp_path), l3_bytes=8 << 20, check_every=1000)
    early, late = results[0]["early"], results
    held = late[0]["held"]
    print(f"read before the writer: {early['served']} of {held} served early; after rank 1 caught up "
          f"{[r['served'] for r in late]} served, refused {[held - r['served'] for r in late]}")
    assert 0 < early["served"] < held  # rank 1 writes some of the held pages: those missed early
    assert early["wrong"] == 0
    assert all(r["held"] == held and r["wrong"] == 0 for r in late)
    assert all(r["served"] == held for r in late)
    kv = late[0]["stats"]["l3_pools"]["kv"]
    assert kv["l3_reads_not_written"] == held - early["served"] and kv["l3_read_failures"] == 0
