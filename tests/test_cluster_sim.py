"""``cpkv hitrate --instances N --cluster-pages P`` (``cpkv.cluster_sim``): against a plain reference
model on generated traces, its invariants step by step, the routing, and one instance without host
or cluster being exactly ``cpkv hitrate``'s replay."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_model import ModelCluster
from cpkv import PrefixTree
from cpkv.cli import main
from cpkv.cluster_sim import ClusterSim, route, simulate
from cpkv.hitrate import replay
from cpkv.traces import load_trace


def prefix_ids(paths: list[list[int]]) -> list[list[int]]:
    """Paths of small labels as a trace's hash ids: one id per distinct prefix, so equal ids at
    position i mean the same prefix up to i (as in the Mooncake traces)."""
    ids: dict[tuple[int, ...], int] = {}
    return [[ids.setdefault(tuple(path[: i + 1]), len(ids)) for i in range(len(path))] for path in paths]


traces = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=40).map(prefix_ids)
shapes = st.tuples(st.integers(1, 4), st.integers(1, 12), st.integers(0, 10), st.integers(0, 16),
                   st.sampled_from(PrefixTree.POLICIES), st.sampled_from(["prefix", "request"]),
                   st.integers(1, 3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=traces, shape=shapes)
def test_the_simulation_is_the_reference_model_step_by_step(requests, shape):
    instances, device, host, cluster, policy, split, root = shape
    sim = ClusterSim(instances, device, host, cluster, policy)
    model = ModelCluster(instances, device, host, cluster, policy)
    for i, blocks in zip(route(requests, instances, split, root), requests):
        got = sim.step(i, blocks)
        want = model.step(i, blocks)
        assert (got.device, got.host, got.cluster, got.missed) == tuple(want.values())
        assert sim.cluster.pages() == model.cluster_order()
        for j in range(instances):
            assert sim.instances[j].host.pages() == model.host_order(j)
    assert (sim.hits.device, sim.hits.host, sim.hits.cluster, sim.hits.missed) == tuple(model.totals.values())


@settings(max_examples=100, deadline=None)
@given(requests=traces, shape=shapes)
def test_invariants_hold_after_every_request(requests, shape):
    instances, device, host, cluster, policy, split, root = shape
    sim = ClusterSim(instances, device, host, cluster, policy)
    blocks_seen = 0
    for i, blocks in zip(route(requests, instances, split, root), requests):
        got = sim.step(i, blocks)
        blocks_seen += len(blocks)
        assert got.total == len(blocks) and min(got.device, got.host, got.cluster, got.missed) >= 0
        assert len(sim.cluster) <= cluster
        assert sim.hits.total == blocks_seen
        for inst in sim.instances:
            assert inst.tree.device_pages <= device and len(inst.host) <= host
            inst.tree.check_invariants()
            # what the simulation believes the device holds is what the tree holds
            assert sum(inst.on_device.values()) == inst.tree.device_pages == len(inst.block_of)
    ratios = sim.hits.ratios()
    assert ratios["total"] == pytest.approx(ratios["device"] + ratios["host"] + ratios["cluster"])


def test_a_page_computed_on_one_instance_is_a_cluster_hit_on_another():
    sim = ClusterSim(2, device_pages=4, host_pages=0, cluster_pages=8, policy="lru")
    assert sim.step(0, [1, 2, 3]).missed == 3
    second = sim.step(1, [1, 2, 3, 4])
    assert (second.device, second.host, second.cluster, second.missed) == (0, 0, 3, 1)
    assert sim.cluster.pages() == [3, 2, 1, 4]  # 3, 2, 1 read (deepest first), then 4 put
    assert sim.step(0, [1, 2, 3, 4]).cluster == 1  # block 4, computed on instance 1
    assert sim.cluster.pages() == [3, 2, 1, 4]  # device hits do not reach the cluster


def test_the_cluster_evicts_its_least_recently_used_page():
    sim = ClusterSim(1, device_pages=10, host_pages=0, cluster_pages=3, policy="lru")
    sim.step(0, [1, 2])
    sim.step(0, [5, 6])
    assert sim.cluster.pages() == [1, 6, 5]  # 2 went first: it was older than its prefix 1


@pytest.mark.parametrize("split", ["prefix", "request"])
def test_routing_is_deterministic_and_uses_every_instance(split):
    requests = prefix_ids([[a, b, c] for a in range(8) for b in range(8) for c in range(2)])
    first = route(requests, 8, split)
    assert first == route(requests, 8, split) and set(first) == set(range(8))
    if split == "request":
        assert first == [i % 8 for i in range(len(requests))]


def test_requests_sharing_a_root_go_to_one_instance():
    paths = [[0, root, *tail] for root in range(30) for tail in ([], [1], [2, 2], [1, 0, 1])]
    requests = prefix_ids(paths)
    where = route(requests, 4, "prefix", root_blocks=2)
    for start in range(0, len(paths), 4):  # the four turns of one root
        assert len(set(where[start:start + 4])) == 1
    assert len(set(where)) == 4
    # a root of one block is the first block, which all of them share
    assert len(set(route(requests, 4, "prefix", root_blocks=1))) == 1


# -- one instance, no host, no cluster: exactly today's `cpkv hitrate` ---------------------------

# `replay` hit blocks on the first 1,500 requests of each trace, recorded before the simulation
# existed; ghost is left out because its internals change on their own (it is compared live below).
RECORDED = {
    ("conversation", 300): {"lru": 1555, "arc": 1651, "s3fifo": 1651},
    ("conversation", 2000): {"lru": 1903, "arc": 2300, "s3fifo": 2848},
    ("synthetic", 300): {"lru": 356, "arc": 223, "s3fifo": 333},
    ("synthetic", 2000): {"lru": 1030, "arc": 1009, "s3fifo": 1140},
}


@pytest.mark.parametrize("trace", ["conversation", "synthetic"])
def test_one_instance_without_host_or_cluster_is_the_hitrate_replay(traces, trace):
    requests = [r.hash_ids for r in load_trace(traces / f"{trace}_trace.jsonl", limit=1500)]
    for capacity in (300, 2000):
        for policy in PrefixTree.POLICIES:
            hits = simulate(requests, 1, capacity, 0, 0, policy)
            assert hits.host == hits.cluster == 0
            assert (hits.device, hits.total) == replay(requests, capacity, policy), (capacity, policy)
            if policy in RECORDED[trace, capacity]:
                assert hits.device == RECORDED[trace, capacity][policy]


def test_the_command_with_one_instance_prints_hitrates_numbers(tmp_path, capsys):
    base = ["hitrate", "--generate", "300", "--seed", "3", "--capacity", "40,300", "--policy", "lru,ghost"]
    plain, single = tmp_path / "plain.json", tmp_path / "single.json"
    assert main([*base, "--no-belady", "--json", str(plain)]) == 0
    assert main([*base, "--instances", "1", "--cluster-pages", "0", "--json", str(single)]) == 0
    (table,) = json.loads(plain.read_text())["tables"]
    (sim,) = json.loads(single.read_text())["tables"]
    want = {(row["capacity"], p): row[p] for row in table["rows"] for p in ("lru", "ghost")}
    got = {(row["capacity"], row["policy"]): row["total"] for row in sim["rows"]}
    assert got == want
    assert all(row["device"] == row["total"] and row["host"] == row["cluster"] == 0 for row in sim["rows"])


def test_the_command_reports_every_tier_per_instance_count(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["hitrate", "--generate", "400", "--capacity", "30", "--policy", "lru", "--instances", "1,4",
                 "--host-pages", "60", "--cluster-pages", "500", "--split", "request", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["instances"], data["cluster_pages"], data["host_pages"], data["split"]) == ([1, 4], 500, 60,
                                                                                             "request")
    rows = data["tables"][0]["rows"]
    assert [row["instances"] for row in rows] == [1, 4]
    for row in rows:
        assert row["total"] == pytest.approx(row["device"] + row["host"] + row["cluster"])
        assert row["total"] >= row["total, no cluster"]
    assert rows[1]["cluster"] > 0  # round robin: the other instances' pages come from the cluster
    assert "cluster tier of 500 pages" in capsys.readouterr().out
