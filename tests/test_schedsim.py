"""``cpkv schedsim``: the cost model and the policies wired through a replay."""

from __future__ import annotations

import argparse
import json

import pytest

from cpkv.cli import COMMANDS
from cpkv.scheduling import AffinityPolicy, BudgetConfig, RequestClass, sim
from cpkv.traces import TraceRequest

COST = sim.CostModel(fixed_s=0.03, per_extend_s=0.3e-3, per_cached_s=0.02e-3)
# A primes the cache with blocks 1-3; at t=10 s two warm requests (sharing A's
# 1536-token prefix) arrive around a cold one.
TRACE = [
    TraceRequest(0, 1536, 1, (1, 2, 3)),
    TraceRequest(10_000, 1636, 1, (1, 2, 3, 4)),  # warm, extend 100
    TraceRequest(10_000, 2000, 1, (20, 21, 22, 23)),  # cold, extend 2000
    TraceRequest(10_000, 1736, 1, (1, 2, 3, 5)),  # warm, extend 200
]
ARRIVALS = [r.timestamp_ms / 1e3 for r in TRACE]


def replay(affinity: bool, mixing: bool = False) -> sim.SimResult:
    policy = AffinityPolicy(floor_tokens=1024, enabled=affinity)
    return sim.simulate("t", TRACE, ARRIVALS, policy, BudgetConfig(mixing=mixing), COST, cache_blocks=100)


def test_cost_model_and_fcfs_timing_by_hand() -> None:
    res = replay(affinity=False)
    a = 0.03 + 0.3e-3 * 1536
    together = 0.03 + 0.3e-3 * (100 + 2000 + 200) + 0.02e-3 * (1536 + 1536)
    assert res.ttft_s[RequestClass.COLD] == pytest.approx([a, together])
    assert res.ttft_s[RequestClass.WARM] == pytest.approx([together, together])
    assert res.forwards == 2 and res.makespan_s == pytest.approx(10 + together)


def test_affinity_serves_the_warm_pair_first() -> None:
    res = replay(affinity=True)
    warm_pair = 0.03 + 0.3e-3 * 300 + 0.02e-3 * 3072
    assert res.ttft_s[RequestClass.WARM] == pytest.approx([warm_pair, warm_pair])
    assert res.ttft_s[RequestClass.COLD][1] == pytest.approx(warm_pair + 0.03 + 0.3e-3 * 2000)
    assert res.max_skips == 1 and res.forwards == 3


def test_percentile_is_nearest_rank() -> None:
    assert sim.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert sim.percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    assert sim.percentile(list(map(float, range(1, 101))), 90) == 90.0


def test_prefix_cache_is_lru_and_caps_the_match() -> None:
    cache = sim.PrefixCache(capacity_blocks=3)
    cache.insert(TRACE[0])
    assert cache.matched_tokens(TRACE[1]) == 1536
    assert cache.matched_tokens(TraceRequest(0, 1500, 1, (1, 2, 3))) == 1499  # one token is always computed
    cache.insert(TraceRequest(0, 10, 1, (9,)))  # evicts block 1, the least recently used
    assert cache.matched_tokens(TRACE[1]) == 0


def test_schedsim_command_on_a_trace_prefix(traces, tmp_path, capsys) -> None:
    assert any(words == ("schedsim",) and module == "cpkv.scheduling.sim" for words, module, _ in COMMANDS)
    parser = argparse.ArgumentParser()
    sim.configure(parser)
    out = tmp_path / "schedsim.json"
    args = parser.parse_args([str(traces / "conversation_trace.jsonl"), "--limit", "400", "--json", str(out)])
    assert sim.run(args) == 0
    printed = capsys.readouterr().out
    assert "affinity+mixing" in printed and "warm p99" in printed
    report = json.loads(out.read_text())
    assert report["command"] == "schedsim" and report["cost_model"]["per_extend_s"] == pytest.approx(3e-4)
    main, ratio, stops = report["tables"]
    assert [row["config"] for row in main["rows"]] == [name for name, _, _ in sim.CONFIGS]
    for row in main["rows"]:
        assert row["warm n"] + row["cold n"] == 400
        assert row["warm p50"] <= row["warm p90"] <= row["warm p99"]
        assert row["cold p50"] <= row["cold p90"] <= row["cold p99"]
        assert row["max head defers"] <= 3  # the default defer limit
        assert row["fwd/s"] > 0
    assert ratio["rows"][0]["warm p99 / fcfs"] == 1.0
    passes = [sum(v for k, v in row.items() if k != "config") for row in stops["rows"]]
    assert all(p > 0 for p in passes)


def test_bad_numbers_are_refused_before_any_work(traces, capsys) -> None:
    from cpkv.cli import main

    trace = str(traces / "conversation_trace.jsonl")
    for option, value in (("--speedup", "0"), ("--speedup", "nan"), ("--load", "nan"), ("--extend-us", "nan")):
        assert main(["schedsim", trace, "--limit", "10", option, value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"argument {option}" in err, err
