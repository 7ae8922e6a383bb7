"""``cpkv hitrate --grid``: the log-spaced capacity grid, its per-policy summary, and the default
policy against the best classic policy on a generated workload."""

from __future__ import annotations

import math

import pytest

from cpkv.cli import main
from cpkv.hitrate import CLASSIC, DEFAULT_POLICY, GRID_POINTS, grid_capacities, grid_rows, grid_summary
from cpkv.workload import generate

ONLINE = [*CLASSIC, DEFAULT_POLICY]


def test_grid_is_log_spaced_from_half_a_percent_to_half_of_the_distinct_blocks():
    caps = grid_capacities(100_000)
    assert len(caps) == GRID_POINTS == 12
    assert caps[0] == 500 and caps[-1] == 50_000
    ratios = [b / a for a, b in zip(caps, caps[1:])]
    assert all(math.isclose(r, 100 ** (1 / 11), rel_tol=1e-3) for r in ratios)
    # Tiny traces: at least one block, no repeated capacity.
    assert grid_capacities(10) == sorted(set(grid_capacities(10))) and grid_capacities(10)[0] == 1


def test_summary_counts_wins_gaps_and_margins():
    rows = {
        10: {"lru": 0.10, "arc": 0.20, "ghost": 0.25},
        20: {"lru": 0.30, "arc": 0.30, "ghost": 0.28},
        40: {"lru": 0.50, "arc": 0.40, "ghost": 0.50},
    }
    belady = {10: 0.30, 20: 0.50, 40: 0.50}
    s = grid_summary(rows, belady)
    assert [s[p]["won"] for p in ("lru", "arc", "ghost")] == [2, 1, 2]  # ties count for each
    assert s["ghost"]["median_gap_closed"] == pytest.approx(0.0)  # 0.75, -0.1, 0 (no gap at 40)
    assert s["ghost"]["worst_gap_closed"] == pytest.approx(-0.1)
    assert s["ghost"]["worst_margin_vs_best_classic"] == pytest.approx(-0.02)
    assert s["ghost"]["worst_margin_at"] == 20
    assert s["arc"]["worst_margin_vs_best_classic"] == pytest.approx(-0.10)  # vs lru, not itself


def test_the_default_is_never_below_the_best_classic_policy_on_a_bursty_workload():
    requests = [r.hash_ids for r in generate(3000, 1, "bursty")]
    capacities, rows, belady = grid_rows(requests, ONLINE)
    assert len(capacities) == GRID_POINTS
    for c in capacities:
        best = max(rows[c][p] for p in CLASSIC)
        assert rows[c][DEFAULT_POLICY] >= best - 0.001, (c, rows[c])
        assert all(rows[c][p] <= belady[c] + 1e-12 for p in ONLINE), (c, rows[c], belady[c])
    summary = grid_summary(rows, belady)
    assert summary[DEFAULT_POLICY]["median_gap_closed"] >= 0.2, summary[DEFAULT_POLICY]


def test_the_default_is_never_below_the_best_classic_policy_on_the_synthetic_trace(traces):
    """A regression guard on a shared trace the default was partly tuned on (docs/ghost.md says
    how): at every grid point at or above the best classic policy, allowing 0.001."""
    from cpkv.traces import load_trace

    requests = [r.hash_ids for r in load_trace(traces / "synthetic_trace.jsonl")]
    below = _below_the_best_classic_policy(requests)
    assert not below, below


def test_the_default_is_never_below_the_best_classic_policy_on_documents_with_questions():
    """Long documents that come back with new questions (docqa, 8,000 requests, seed 3), where the
    default follows arc and s3fifo for long stretches: the same guard, allowing 0.001."""
    below = _below_the_best_classic_policy([r.hash_ids for r in generate(8000, 3, "docqa")])
    assert not below, below


# Seeds never used to choose any of ghost's parts or constants (docs/ghost.md, "Held-out seeds"):
# (mix, seed, requests) -> the least median gap closed and worst margin it must keep, and the most
# grid points more than 0.001 below the best classic policy. Measured when ghost was kept whole:
# slow 7: median 0.046, worst -0.0007, no miss; docqa 29: median 0.111, worst -0.0051, two misses
# (823 blocks against s3fifo, 2,889 against arc), the kind of miss docqa 13 has too.
HELD_OUT = [
    (("slow", 7, 8000), 0.04, -0.001, 0),
    (("docqa", 29, 8000), 0.10, -0.0055, 2),
]


@pytest.mark.parametrize("workload, median_at_least, margin_at_least, misses_at_most", HELD_OUT,
                         ids=[f"{mix}-{seed}" for (mix, seed, _), *_ in HELD_OUT])
def test_the_default_on_held_out_seeds(workload, median_at_least, margin_at_least, misses_at_most):
    mix, seed, n = workload
    requests = [r.hash_ids for r in generate(n, seed, mix)]
    _, rows, belady = grid_rows(requests, ONLINE)
    summary = grid_summary(rows, belady)[DEFAULT_POLICY]
    assert summary["median_gap_closed"] >= median_at_least, summary
    assert summary["worst_margin_vs_best_classic"] >= margin_at_least, summary
    below = {c: r for c, r in rows.items() if r[DEFAULT_POLICY] < max(r[p] for p in CLASSIC) - 0.001}
    assert len(below) <= misses_at_most, below


def _below_the_best_classic_policy(requests: list) -> dict:
    """Grid points where the default is more than 0.001 below the best classic policy:
    capacity -> (default, best classic)."""
    capacities, rows, _ = grid_rows(requests, ONLINE)
    best = {c: max(rows[c][p] for p in CLASSIC) for c in capacities}
    return {c: (rows[c][DEFAULT_POLICY], best[c]) for c in capacities if rows[c][DEFAULT_POLICY] < best[c] - 0.001}


def test_grid_command_prints_the_summary(capsys, tmp_path):
    out = tmp_path / "grid.json"
    assert main(["hitrate", "--generate", "300", "--seed", "2", "--mix", "bursty", "--grid",
                 "--policy", "lru,arc,s3fifo,ghost", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "points won" in text and "median gap closed" in text and "worst margin" in text
    assert f"default {DEFAULT_POLICY}: worst margin vs best classic" in text
    import json

    grid = json.loads(out.read_text())["grid"]
    (name, data), = grid.items()
    assert "bursty" in name and len(data["capacities"]) == GRID_POINTS
    assert set(data["summary"]) == {"lru", "arc", "s3fifo", "ghost"}
    assert "one-shot oracle (offline)" in text
    oracle, belady = data["one_shot_oracle"], data["belady"]
    assert set(oracle) == set(belady) and all(oracle[c] <= belady[c] + 1e-12 for c in oracle)


@pytest.mark.parametrize(
    "argv, want",
    [
        (["--generate", "50", "--grid", "--capacity", "10"], "exclude each other"),
        (["--generate", "50", "--grid", "--no-belady"], "needs Belady"),
        (["--generate", "50", "--grid", "--policy", "arc,ghost"], "include lru"),
        ([], "trace file(s) or --generate"),
        (["--generate", "0"], "--generate"),
        (["--generate", "10", "--mix", "nope"], "nope"),
        (["--generate", "10", "--seed", "-1"], "--seed"),
    ],
)
def test_bad_grid_arguments_exit_2_with_one_line(argv, want, capsys):
    assert main(["hitrate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and want in err[0], err
