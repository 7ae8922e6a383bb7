"""`cpkv bench evict` runs end to end on a small tree, and its victim check can fail."""

from __future__ import annotations

import json

import pytest

from cpkv.bench import evict as bench
from cpkv.cli import main


def test_bench_evict_reports_every_implementation_against_the_linked_list(tmp_path):
    out = tmp_path / "evict.json"
    assert main(["bench", "evict", "--leaves", "600", "--calls", "2", "--page-size", "4",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["tables"][0]["rows"]
    assert [(row["call pages"], row["implementation"]) for row in rows] == [
        (size, bench.LABELS[name]) for size in bench.CALL_PAGES for name in bench.ROWS]
    # The floor row counts the pages evict_pages returned, call size by call size.
    by = {(row["call pages"], row["implementation"]): row for row in rows}
    for size in bench.CALL_PAGES:
        floor, pages = by[size, bench.LABELS["array_floor"]], by[size, bench.LABELS["cpkv_pages"]]
        assert floor["us per call"] / floor["us per evicted page"] == pytest.approx(
            pages["us per call"] / pages["us per evicted page"])
    ratio = "per page / linked list's"
    for row in rows:
        assert row["us per call"] > 0 and row[ratio] > 0
        if row["implementation"] == bench.LABELS["lru_list"]:
            assert row[ratio] == 1


def test_a_baseline_that_evicts_differently_fails_the_command(monkeypatch):
    honest = bench.LruListEvict.evict

    def one_victim_short(self, num_pages):
        return honest(self, num_pages)[:-1]

    monkeypatch.setattr(bench.LruListEvict, "evict", one_victim_short)
    with pytest.raises(SystemExit, match="lru_list and cpkv lru disagree on the victims of call 0"):
        main(["bench", "evict", "--leaves", "600", "--calls", "2", "--page-size", "4"])
