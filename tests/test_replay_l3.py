"""``cpkv replay --l3-dir``: pages leaving the host slab go to L3, a second run on the same directory
starts warm, every byte L3 serves passes the replay's byte check, a damaged record is a counted
drop on every rank and never a wrong page. Two real rank processes per run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpkv import _cpkv
from cpkv.replay import ReplayOptions
from cpkv.replay.options import parse_payloads
from cpkv.runtime.launch import run_ranks
from cpkv.workload import generate
from tamper import replay_with_tampered_reads

pytestmark = pytest.mark.slow

# Small enough to be quick, a host tier small enough to evict into L3 during the run.
SIZES = ["--device-pages", "64", "--host-pages", "160", "--l3-bytes", str(24 << 20)]


def _replay(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, "-m", "cpkv", "replay", "--quiet", "--json", str(out),
                           "--l3-dir", str(tmp_path / "l3"), *SIZES, *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def _check_run(run: dict) -> dict:
    report, ranks = run["report"], run["per_rank"]
    assert report["verification failures (pages)"] == 0
    assert "ranks differ" not in report["final digest"]
    assert len({r["l3_digest"] for r in ranks}) == 1, "the L3 index is replicated"
    assert report["agreement checks passed"] > 0
    return report


def test_a_second_run_on_the_same_directory_starts_warm(tmp_path: Path) -> None:
    (tmp_path / "l3").mkdir()
    first = _check_run(_replay(tmp_path, "first", "--limit", "150"))
    assert first["host evictions (victims / pages)"] != "0 / 0", "the run should evict into L3"
    assert first["l3_pages_written"] > 0 and first["l3_recovered_pages"] == 0
    # The same first requests again: L3 serves them from the start.
    second_run = _replay(tmp_path, "second", "--limit", "24")
    second = _check_run(second_run)
    assert second["l3_recovered_pages"] > 0
    assert second["hit_rate_l3"] > first["hit_rate_l3"]
    assert second["hit_rate_l3"] > 0
    assert second["prefix hit rate: total with L3"] > first["prefix hit rate: total with L3"] or \
        second["prefix hit rate: total with L3"] > second["prefix hit rate: total"]
    # Each page read once per node: the ranks' reads add up to the pages served.
    served = second_run["per_rank"][0]["l3_hit_blocks"]
    assert second["l3_pages_read"] == served > 0
    assert second["l3_corrupt_dropped"] == 0
    assert second["l3_disk_bytes"] <= second["l3_cap_bytes"]


def test_a_damaged_record_between_runs_is_a_counted_drop_and_never_a_wrong_page(tmp_path: Path) -> None:
    (tmp_path / "l3").mkdir()
    _check_run(_replay(tmp_path, "first", "--limit", "150"))
    # Flip one payload byte of every slot's record in the first data file.
    page_bytes = 2 * sum(spec.row_bytes for spec in parse_payloads("kv:8x16:float8_e4m3fn,index:32:bfloat16").values())
    slot_bytes = int(_cpkv.l3_record_bytes(page_bytes))
    data = tmp_path / "l3" / "data-0.bin"
    raw = np.fromfile(data, dtype=np.uint8)
    raw[7::slot_bytes] ^= 0x40
    raw.tofile(data)
    second = _check_run(_replay(tmp_path, "second", "--limit", "24"))
    assert second["l3_corrupt_dropped"] > 0, "a damaged record is found, counted and dropped"
    assert second["hit_rate_l3"] == 0, "no damaged page is served"


def _tampering_rank(rank: int, world: int, options: ReplayOptions, requests: list) -> dict:
    """A rank whose L3 reads hand back one wrong byte per page (:mod:`tamper`)."""
    from cpkv.tier.l3.tier import L3Tier

    return replay_with_tampered_reads(L3Tier, rank, world, options, requests)


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_byte_l3_serves_is_checked(tmp_path: Path, ranks: int) -> None:
    requests = [r.hash_ids for r in generate(60, 5)]
    options = ReplayOptions(ranks=ranks, payloads=parse_payloads("kv:4x8:float8_e4m3fn,index:16:bfloat16"), device_pages=48,
                            host_pages=120, check_every=1, progress=False, timeout_s=20.0,
                            l3_dir=str(tmp_path), l3_bytes=8 << 20)
    first = run_ranks(_replay_entry, ranks, options, requests, timeout_s=120)
    assert [r["verification_failures"] for r in first] == [0] * ranks
    second = run_ranks(_tampering_rank, ranks, options, requests, timeout_s=120)
    served = second[0]["l3_hit_blocks"]
    assert served > 0
    # One wrong byte per served page, in layer 0 of the first payload: at least one wrong row each.
    assert sum(r["verification_failures"] for r in second) >= served


def _replay_entry(rank: int, world: int, options: ReplayOptions, requests: list) -> dict:
    from cpkv.replay.rank import replay_rank

    return replay_rank(rank, world, options, requests)


def _records_per_key(directory: Path, slot_bytes: int) -> dict[int, int]:
    """How many records of each key the node's data files hold, read straight from the slot headers."""
    counts: dict[int, int] = {}
    header_at = slot_bytes - _cpkv.L3_HEADER_BYTES  # a record's header is its last bytes
    for data in sorted(directory.glob("data-*.bin")):
        raw = np.fromfile(data, dtype=np.uint8)
        for start in range(header_at, len(raw) - _cpkv.L3_HEADER_BYTES + 1, slot_bytes):
            header = raw[start:start + _cpkv.L3_HEADER_BYTES].tobytes()
            if int.from_bytes(header[:8], "little") == _cpkv.L3_RECORD_MAGIC:
                key = int.from_bytes(header[_cpkv.L3_RECORD_KEY_AT:_cpkv.L3_RECORD_KEY_AT + 8], "little")
                counts[key] = counts.get(key, 0) + 1
    return counts


def test_four_ranks_start_warm_agree_and_hold_each_page_once_on_the_node(tmp_path: Path) -> None:
    """Four ranks on one node (the replay's host slab and L3 directory are one node's; it has no
    multi-node mode): each page spilled is written by one rank, once, and a second run on the same
    directory reads back every byte it serves, checked."""
    (tmp_path / "l3").mkdir()
    page_bytes = 2 * sum(spec.row_bytes for spec in parse_payloads("kv:8x16:float8_e4m3fn,index:32:bfloat16").values())
    slot_bytes = int(_cpkv.l3_record_bytes(page_bytes))
    written_so_far = 0
    reports = []
    for name, limit in (("first", "150"), ("second", "24")):
        run = _replay(tmp_path, name, "--ranks", "4", "--limit", limit)
        report, ranks = _check_run(run), run["per_rank"]
        assert len(ranks) == 4
        placed = {r["l3_pages_spilled"] for r in ranks}
        assert len(placed) == 1, "placement is replicated"
        if name == "first":  # (the second run's pages are mostly on disk already)
            assert all(r["l3_pages_written"] > 0 for r in ranks), "the writes are spread over the node's ranks"
        # Once per node: the ranks' writes add up to the pages placed, never a page per rank.
        assert report["l3_pages_written"] == sum(r["l3_pages_written"] for r in ranks) == placed.pop()
        written_so_far += report["l3_pages_written"]
        # The cap holds every page of both runs, so no slot is reused: what is on disk is what was written.
        assert all(r["l3_slots"] >= written_so_far for r in ranks)
        counts = _records_per_key(tmp_path / "l3", slot_bytes)
        assert sum(counts.values()) == written_so_far
        assert max(counts.values()) == 1, "one copy of each page on the node's disk"
        assert report["l3_corrupt_dropped"] == 0
        assert report["l3_disk_bytes"] <= report["l3_cap_bytes"]
        reports.append((report, ranks))
    (first, _), (second, second_ranks) = reports
    assert first["l3_recovered_pages"] == 0 and second["l3_recovered_pages"] == first["l3_pages_written"]
    assert second["hit_rate_l3"] > first["hit_rate_l3"] and second["hit_rate_l3"] > 0
    # Each page served was read once on the node, by the rank owning its device page.
    served = second_ranks[0]["l3_hit_blocks"]
    assert all(r["l3_hit_blocks"] == served for r in second_ranks)
    assert second["l3_pages_read"] == served > 0
