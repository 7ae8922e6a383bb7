"""``cpkv sweep``: a valid PNG, and CSV numbers equal to ``hitrate.replay`` / ``belady_hits`` at the same points."""

from __future__ import annotations

import csv
import json

import pytest

from cpkv import PrefixTree
from cpkv.belady import belady_hits
from cpkv.cli import main
from cpkv.hitrate import replay
from cpkv.sweep import GRID_POINTS, grid
from cpkv.traces import load_trace
from cpkv.workload import generate

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0]) == ["capacity", "policy", "hit_ratio"]
    return [(int(r["capacity"]), r["policy"], float(r["hit_ratio"])) for r in rows]


def check_png(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def check_points(points, requests, policies):
    for capacity, policy, ratio in points:
        if policy == "belady":
            hits, total = belady_hits(requests, capacity)
        else:
            hits, total = replay(requests, capacity, policy)
        assert ratio == hits / total, (capacity, policy)


def test_sweep_of_a_trace_slice(traces, tmp_path, capsys):
    png, out_csv, out_json = tmp_path / "s.png", tmp_path / "s.csv", tmp_path / "s.json"
    trace = traces / "conversation_trace.jsonl"
    code = main(["sweep", str(trace), "--limit", "300", "--out-png", str(png), "--out-csv", str(out_csv),
                 "--json", str(out_json)])
    assert code == 0
    check_png(png)
    points = read_csv(out_csv)
    requests = [r.hash_ids for r in load_trace(trace, limit=300)]
    capacities = grid(len({h for b in requests for h in b}), GRID_POINTS)
    assert len(capacities) == GRID_POINTS
    names = [*PrefixTree.POLICIES, "belady"]
    assert [(c, p) for c, p, _ in points] == [(c, p) for c in capacities for p in names]
    check_points(points, requests, PrefixTree.POLICIES)
    for c in capacities:  # Belady is the ceiling at every point
        ratio = {p: r for cc, p, r in points if cc == c}
        assert all(ratio[p] <= ratio["belady"] for p in PrefixTree.POLICIES)
    rows = json.loads(out_json.read_text())["tables"][0]["rows"]
    assert [r["capacity"] for r in rows] == capacities
    assert "belady" in capsys.readouterr().out


def test_sweep_of_the_generated_workload(tmp_path):
    png, out_csv = tmp_path / "g.png", tmp_path / "g.csv"
    code = main(["sweep", "--generate", "200", "--seed", "3", "--capacities", "80,5,20,20",
                 "--policy", "ghost,lru", "--out-png", str(png), "--out-csv", str(out_csv)])
    assert code == 0
    check_png(png)
    points = read_csv(out_csv)
    # Capacities once each, in the order given.
    assert [(c, p) for c, p, _ in points] == [(c, p) for c in (80, 5, 20) for p in ("ghost", "lru", "belady")]
    requests = [r.hash_ids for r in generate(200, 3)]
    check_points(points, requests, ("ghost", "lru"))
    assert all(r > 0 for c, p, r in points if c == 80)


@pytest.mark.parametrize("distinct,points", [(182_790, 12), (589, 12), (20, 12), (1, 5), (1000, 1), (10**6, 40)])
def test_grid(distinct, points):
    caps = grid(distinct, points)
    assert caps == sorted(set(caps)) and all(type(c) is int and c >= 1 for c in caps)
    assert 1 <= len(caps) <= points
    assert caps[0] == max(1, round(0.005 * distinct))
    if points > 1:
        assert caps[-1] == max(1, round(0.5 * distinct))
    if distinct >= 100_000:
        assert len(caps) == points  # dense traces keep every point
