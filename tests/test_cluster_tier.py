"""The cluster tier against a real ``cpkv cluster serve`` (one rank here; the replay tests run two):
checked round trips, a byte flipped in the store server's own memory is a counted miss and is
replaced by the next writer, a changed dtype or page size misses, an unresponsive or killed master
bounds every call, marks the tier unavailable and re-attaches when the master is back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import torch

from cluster_serve import Served, start_serve, wait_gone
from conftest import REPO_ROOT, wait_for
from cpkv.tier import SlabSpec
from cpkv.tier.cluster.tier import ClusterTier, object_key

pytestmark = pytest.mark.slow

PAYLOADS = {"kv": SlabSpec((8, 16), torch.bfloat16), "index": SlabSpec((32,), torch.bfloat16)}
LAYERS = 2


def _tier(served: Served, payloads: dict = PAYLOADS, page_size: int = 16, timeout_s: float = 10.0,
          **kwargs: Any) -> ClusterTier:
    return ClusterTier(served.master, served.metadata, slab=None, payloads=payloads, num_layers=LAYERS,
                       page_size=page_size, rank=0, cp_size=1, model="cluster test", timeout_s=timeout_s,
                       all_reduce_min=lambda values, what: list(values), **kwargs)


def _pages(tier: ClusterTier, keys: list[int]) -> np.ndarray:
    rng = np.random.default_rng(keys[0])
    return rng.integers(0, 256, (len(keys), tier.page_bytes), dtype=np.uint8)


def _put(tier: ClusterTier, keys: list[int], pages: np.ndarray) -> int:
    def fill(rows: np.ndarray) -> None:
        rows[:, :tier.page_bytes] = pages

    return tier.put_pages(keys, fill)


def _read(tier: ClusterTier, keys: list[int]) -> tuple[int, np.ndarray, int]:
    """(pages found, the pages read back whole, pages served after the settle)."""
    found = tier.find([keys])[0]
    positions, data = tier.read(found, np.arange(len(found), dtype=np.int64))
    served = tier.settle()
    assert len(positions) == served
    return len(found), data, served


def test_pages_round_trip_as_checked_records(served: Served) -> None:
    tier = _tier(served)
    keys = [1000 + i for i in range(200)]  # more than one batch of 128
    pages = _pages(tier, keys)
    put = sum(_put(tier, keys[i:i + 128], pages[i:i + 128]) for i in range(0, 200, 128))
    assert put == 200
    assert _put(tier, keys[:128], pages[:128]) == 0, "a page the cluster holds is not put again"
    found, data, hits = _read(tier, keys)
    assert found == hits == 200
    assert np.array_equal(data, pages)
    assert tier.stats()["cluster_corrupt_dropped"] == 0
    tier.close()


def _flip_in_store_memory(served: Served, tier: ClusterTier, key: int, offset: int) -> None:
    """Flips one byte of the object's replica in the store server's own memory (/proc/PID/mem)."""
    assert tier.store is not None
    replica = tier.store._store.get_replica_desc(object_key(tier.namespace_id, key))[0]
    address = replica.get_memory_descriptor().buffer_descriptor.buffer_address
    with open(f"/proc/{served.children()['store']}/mem", "r+b", buffering=0) as memory:
        memory.seek(address + offset)
        byte = memory.read(1)[0]
        memory.seek(address + offset)
        memory.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("where", ["payload", "trailer"])
def test_a_flipped_byte_in_the_store_is_a_counted_miss_and_the_next_writer_replaces_it(served: Served,
                                                                                       where: str) -> None:
    tier = _tier(served)
    keys = [5000 + (where == "trailer") * 100 + i for i in range(4)]
    pages = _pages(tier, keys)
    assert _put(tier, keys, pages) == 4
    _flip_in_store_memory(served, tier, keys[1], 7 if where == "payload" else tier.page_bytes + 30)
    found, data, hits = _read(tier, keys)
    assert found == 4 and hits == 3, "the damaged page is found, read, and not served"
    assert np.array_equal(data, pages[[0, 2, 3]])
    assert tier.stats()["cluster_corrupt_dropped"] == 1
    # Mooncake's put keeps a key's old value: the writer replaces the damaged record by upsert.
    assert _put(tier, keys, pages) == 1
    found, data, hits = _read(tier, keys)
    assert found == hits == 4 and np.array_equal(data, pages)
    tier.close()


def test_a_changed_dtype_or_page_size_misses(served: Served) -> None:
    tier = _tier(served)
    keys = [9000 + i for i in range(8)]
    assert _put(tier, keys, _pages(tier, keys)) == 8
    as_fp16 = {name: SlabSpec(spec.page_shape, torch.float16) for name, spec in PAYLOADS.items()}  # same bytes
    for other in (_tier(served, payloads=as_fp16), _tier(served, page_size=32)):
        assert other.page_bytes == tier.page_bytes
        assert other.find([keys])[0].keys == []
        other.close()
    assert len(tier.find([keys])[0]) == 8
    tier.close()


def test_a_master_down_at_start_is_refused_by_name() -> None:
    from cpkv.tier.cluster.local import free_port

    port = free_port()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cpkv", "replay", "--quiet", "--requests", "10",
                           "--cluster-master", f"127.0.0.1:{port}",
                           "--cluster-metadata", f"http://127.0.0.1:{free_port()}/metadata"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--cluster-master 127.0.0.1:{port}" in lines[0], done.stderr
    assert time.monotonic() - started < 60


def test_an_unresponsive_master_bounds_the_call_then_the_tier_reattaches() -> None:
    served = start_serve()
    try:
        tier = _tier(served, timeout_s=1.0, probe_every=1)
        keys = [12000 + i for i in range(4)]
        assert _put(tier, keys, _pages(tier, keys)) == 4
        master = served.children()["master"]
        os.kill(master, signal.SIGSTOP)  # alive but silent: Mooncake's own RPC timeout is 30 s
        try:
            started = time.monotonic()
            assert tier.find([keys])[0].keys == []
            assert time.monotonic() - started < 5.0, "the call was not bounded by the tier's timeout"
            assert not tier.available and tier.stats()["cluster_unavailable_marks"] == 1
            assert _put(tier, [12100], _pages(tier, [12100])) == 0, "nothing is written while unavailable"
        finally:
            os.kill(master, signal.SIGCONT)
        # Back: the stuck call returns, a probe succeeds, the next lookup re-attaches (the objects are
        # still there: the master never restarted).
        wait_for(lambda: tier.find([keys]) and tier.available, 60, "the tier to re-attach", poll_s=0.1)
        assert len(tier.find([keys])[0]) == 4
        assert tier.stats()["cluster_reattaches"] == 1
        tier.close()
    finally:
        served.stop()


def test_a_killed_master_marks_the_tier_unavailable_and_a_restarted_one_is_reattached_cold() -> None:
    from cpkv.tier.cluster.local import local_cluster

    with local_cluster(64 << 20) as cluster:
        served = Served(None, cluster.master, cluster.metadata)  # type: ignore[arg-type]
        tier = _tier(served, timeout_s=5.0, probe_every=1)
        keys = [13000 + i for i in range(4)]
        pages = _pages(tier, keys)
        assert _put(tier, keys, pages) == 4
        master = cluster.processes["master"]
        master.kill()
        master.wait()
        assert tier.find([keys])[0].keys == [] and not tier.available
        cluster.start_master()  # the store server mounts its memory again at the new master
        wait_for(lambda: tier.find([keys]) and tier.available, 60, "the tier to re-attach", poll_s=0.1)
        assert tier.find([keys])[0].keys == [], "a restarted master is cold"
        assert _put(tier, keys, pages) == 4
        found, data, hits = _read(tier, keys)
        assert found == hits == 4 and np.array_equal(data, pages)
        tier.close()
        wait_gone(master.pid)
