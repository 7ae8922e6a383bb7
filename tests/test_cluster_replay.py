"""``cpkv replay --cluster-master``: two instances of 2 CP ranks (real processes) one after the other
share pages through a real cluster, every byte the cluster serves is checked by the replay's byte
check, and a master or store server SIGKILLed mid-run costs misses only: no hang, no wrong page,
every rank the same answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_serve import Served
from conftest import REPO_ROOT
from cpkv.replay import ReplayOptions
from cpkv.replay.options import parse_payloads
from cpkv.runtime.launch import run_ranks
from cpkv.workload import generate
from tamper import replay_with_tampered_reads

pytestmark = pytest.mark.slow

# A host tier small enough to evict into the cluster during the run.
SIZES = ["--device-pages", "64", "--host-pages", "160"]


def _replay(tmp_path: Path, served: Served, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, "-m", "cpkv", "replay", "--quiet", "--json", str(out), *SIZES,
                           "--cluster-master", served.master, "--cluster-metadata", served.metadata, *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())["report"]
    assert report["verification failures (pages)"] == 0
    assert "ranks differ" not in report["final digest"]
    return report


def test_a_second_instance_starts_warm_from_the_first_ones_pages(tmp_path: Path, served: Served) -> None:
    first = _replay(tmp_path, served, "first", "--limit", "150", "--seed", "11")
    assert first["cluster_pages_put"] > 0  # (it reads back some of its own evicted pages too)
    second = _replay(tmp_path, served, "second", "--limit", "150", "--seed", "11")
    assert second["hit_rate_cluster"] > first["hit_rate_cluster"] + 0.2, (first, second)
    assert second["cluster_pages_read"] > 0 and second["cluster_corrupt_dropped"] == 0
    assert second["cluster_pages_put"] < first["cluster_pages_put"], "pages the cluster holds are not put again"
    assert second["cluster_unavailable_s"] == 0


def _options(served_master: str, served_metadata: str, **kwargs: object) -> ReplayOptions:
    return ReplayOptions(ranks=2, payloads=parse_payloads("kv:4x8:float8_e4m3fn,index:16:bfloat16"), device_pages=48,
                         host_pages=120, check_every=1, progress=False, timeout_s=5.0, cluster_master=served_master,
                         cluster_metadata=served_metadata, **kwargs)  # type: ignore[arg-type]


def _replay_entry(rank: int, world: int, options: ReplayOptions, requests: list) -> dict:
    from cpkv.replay.rank import replay_rank

    return replay_rank(rank, world, options, requests)


def _tampering_rank(rank: int, world: int, options: ReplayOptions, requests: list) -> dict:
    """A rank whose cluster reads hand back one wrong byte per page (:mod:`tamper`)."""
    from cpkv.tier.cluster.tier import ClusterTier

    return replay_with_tampered_reads(ClusterTier, rank, world, options, requests)


def test_every_byte_the_cluster_serves_is_checked(served: Served) -> None:
    requests = [r.hash_ids for r in generate(60, 21)]
    options = _options(served.master, served.metadata)
    first = run_ranks(_replay_entry, 2, options, requests, timeout_s=120)
    assert [r["verification_failures"] for r in first] == [0, 0]
    second = run_ranks(_tampering_rank, 2, options, requests, timeout_s=120)
    hits = second[0]["cluster_hit_blocks"]
    assert hits > 0 and second[1]["cluster_hit_blocks"] == hits
    # One wrong byte per served page, in layer 0 of the first payload: at least one wrong row each.
    assert sum(r["verification_failures"] for r in second) >= hits


def _killing_rank(rank: int, world: int, options: ReplayOptions, requests: list, pid: int, at_forward: int) -> dict:
    """Rank 0 SIGKILLs ``pid`` (a Mooncake process) after its compose of forward ``at_forward``."""
    from cpkv.replay import rank as replay_rank_module

    killed: list[float] = []
    if rank == 0:
        def kill(forward: int, payload: str, layer: int, dense: object) -> None:
            if forward == at_forward and not killed:
                os.kill(pid, signal.SIGKILL)
                killed.append(time.time())

        replay_rank_module.after_compose = kill
    stats = replay_rank_module.replay_rank(rank, world, options, requests)
    stats["killed_at"] = killed[0] if killed else None
    return stats


@pytest.mark.parametrize("victim", ["master", "store"])
def test_a_process_of_the_cluster_killed_mid_run_costs_misses_only_on_every_rank_alike(victim: str) -> None:
    from cpkv.tier.cluster.local import local_cluster

    requests = [r.hash_ids for r in generate(80, 31)]
    with local_cluster(64 << 20) as cluster:  # a cluster with no supervisor: only the victim dies
        options = _options(cluster.master, cluster.metadata)
        warm = run_ranks(_replay_entry, 2, options, requests, timeout_s=120)
        assert [r["verification_failures"] for r in warm] == [0, 0]
        started = time.monotonic()
        ranks = run_ranks(_killing_rank, 2, options, requests, cluster.processes[victim].pid, 3, timeout_s=120)
        took = time.monotonic() - started
    assert all(isinstance(r, dict) for r in ranks), ranks
    assert [r["verification_failures"] for r in ranks] == [0, 0], "no wrong page"
    for key in ("cluster_hit_blocks", "cluster_unavailable_marks", "blocks", "forwards"):
        assert ranks[0][key] == ranks[1][key], f"{key} differs between the ranks: every rank the same answer"
    assert ranks[0]["cluster_unavailable_marks"] == 1 and ranks[0]["cluster_available"] == 0
    killed_at = ranks[0]["killed_at"]
    marked = ranks[0]["cluster_marked_unavailable_at"][0]
    assert 0 <= marked - killed_at < options.timeout_s + 1, (killed_at, marked)
    assert ranks[0]["cluster_hit_blocks"] > 0, "pages served before the kill"
    assert took < 100, "no hang"
    print(f"{victim} SIGKILLed: the tier was marked unavailable {marked - killed_at:.3f} s later on every rank; "
          f"the run took {took:.1f} s, 0 wrong pages")
