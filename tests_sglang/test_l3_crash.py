"""kill -9 under SGLang's L3 (DSA: the KV latent and the indexer, SGLang's own controller stack, CP 2).

A node lives, stores, and dies: each of its two rank processes SIGKILLs itself at its own store (a
different spill count per rank and per life, at one of four points: before any byte, between the KV
record and the indexer's, after both but before the store call returns, and with the KV records
written but neither synced nor logged). The next life starts new processes on the same directory and,
before storing anything, reads back every page any rank logged as acknowledged durable (its store
operation had returned) and every page ever offered, through the backend's own batch_get_v1 and
batch_get_v2. The harness scenario is ``l3_crash``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness import launch

LIVES = 9  # 8 with a kill -9 of both ranks, then one that only checks and stops cleanly
L3_BYTES = 32 << 20  # room for every page offered: nothing leaves L3, so every acknowledged page must stay


@pytest.mark.timeout(600)
def test_kill9_keeps_every_acknowledged_page_and_serves_no_wrong_byte(tmp_path: Path) -> None:
    directory, logs = tmp_path / "l3", tmp_path / "logs"
    directory.mkdir()
    logs.mkdir()
    opts = dict(kind="dsa", pages=8, model="crash-model", l3_dir=str(directory), l3_bytes=L3_BYTES, timeout_s=10)
    run_ids: list[str] = []
    checked = []
    for life in range(LIVES):
        last = life == LIVES - 1
        kill_at = [] if last else [1 + life, 2 + (3 * life) % 8]  # every kill of a rank at another spill count
        results = launch(2, "l3_crash", wall_s=120, args={"run": life, "kill_at": kill_at, "point": life % 4,
                                                          "log_dir": str(logs), "runs_before": life}, **opts)
        if not last:
            assert results == [None, None], results  # both ranks died by SIGKILL, none reported
        for rank in range(2):
            v = json.loads((logs / f"verify-{life}-r{rank}.json").read_text())
            run_ids.append(v["run_id"])
            assert v["acked_missing"] == [], (life, rank, v["acked_missing"])
            assert v["served_wrong"] == [], (life, rank, v["served_wrong"])
            assert v["l3_disk_bytes"] <= v["l3_cap_bytes"], v
            assert all(e == 0 for e in v["l3_evicted"].values()), v
            assert v["recovered"]["kv"] >= v["acked"] and v["recovered"]["indexer"] >= v["acked"], v
            checked.append((life, rank, v["acked"], v["served"], v["offered"]))
        if not last:
            assert len(list(logs.glob(f"acked-{life}-r*.jsonl"))) == 2  # both ranks stored before dying
    final = [c for c in checked if c[0] == LIVES - 1]
    assert final[0][2] > 0 and final[0][2] == final[1][2]
    print("life, rank, acknowledged pages, pages served, pages offered:", checked)
    leftovers = [n for n in os.listdir("/dev/shm") if any(run_id in n for run_id in run_ids)]
    assert leftovers == []
