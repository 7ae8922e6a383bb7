"""The cluster tier under cpkv's own vLLM connector (``CpkvOffloadingSpec`` with
``cpkv_cluster_master`` / ``cpkv_cluster_metadata``), through vLLM's real Scheduler and worker-side
OffloadingConnector on the CPU (tests_vllm/engine.py), against a real ``cpkv cluster serve``.

A second instance starts warm from the first's chunks, byte for byte (every worker's record put by
the worker at store, read and checked by the scheduler, copied into the host row by the worker);
a byte flipped in the store's memory is a counted miss, never served, and the next store replaces
it; another dtype misses; a master down at start is refused by name; a master killed mid-run: no
hang, 0 wrong pages, and the tier re-attaches (counted in scheduler steps) once a master is back."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from cluster_serve import Served, restart_serve, start_serve
from cpkv.errors import InvalidArgumentError
from cpkv.integrations.vllm.l3 import l3_key
from cpkv.tier.cluster.tier import object_key
from engine import BLOCK_TOKENS, Engine, cpkv_extra, prompt
from test_l3 import assert_exact, keys_of
from waiting import wait_for

BLOCKS = 4
READ_TIMEOUT_S = 60.0


def cluster_extra(served: Served, **overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"cpkv_host_blocks": 16, "cpkv_cluster_master": served.master,
                                "cpkv_cluster_metadata": served.metadata, "cpkv_timeout_s": 2}
    return cpkv_extra(**{**settings, **overrides})


def serve(eng: Engine, req_id: str, tokens: list[int], keys: list[bytes] | None = None) -> tuple[int, list[int]]:
    """Adds the request and steps (waiting on the cluster reads, never on the clock) until it
    computes and every offload landed; returns its hit blocks and its device blocks (its chunk
    keys into ``keys``)."""
    request = eng.add(req_id, tokens)
    if keys is not None:
        keys.extend(keys_of(request))
    for _ in range(30):
        out = eng.step()
        if req_id in out.num_scheduled_tokens:
            settle(eng)
            return eng.started_at[req_id] // BLOCK_TOKENS, eng.last_blocks[req_id]
        assert eng.manager.cluster.wait_idle(READ_TIMEOUT_S), "a cluster read did not finish"
        if eng.manager.l3 is not None:
            assert eng.manager.l3.wait_idle(READ_TIMEOUT_S), "an L3 record check did not finish"
    raise AssertionError(f"{req_id} was never scheduled")


def settle(eng: Engine, steps: int = 50) -> None:
    """Steps until no request is left and every offload has landed (as Engine.run, waiting on the
    cluster reads between steps)."""
    for _ in range(steps):
        eng.step()
        if not eng.scheduler.requests and not eng.scheduler.has_requests() and not eng.manager.num_pins:
            return
        assert eng.manager.cluster.wait_idle(READ_TIMEOUT_S), "a cluster read did not finish"
    raise AssertionError(f"the engine did not settle in {steps} steps")


def first_instance(served: Served, seed: int, **overrides: Any) -> list[bytes]:
    """Computes one prompt and stops; returns its chunk keys (each put to the cluster at its store)."""
    eng = Engine(cluster_extra(served, **overrides))
    keys: list[bytes] = []
    hits, _ = serve(eng, "first", prompt(seed, blocks=BLOCKS), keys)
    assert hits == 0
    assert eng.worker.connector_worker.worker.cluster.stats()["cluster_pages_put"] == BLOCKS
    eng.close()
    return keys


def test_a_second_instance_starts_warm_from_the_first_byte_for_byte(served: Served) -> None:
    first_instance(served, 11)
    eng = Engine(cluster_extra(served))  # a fresh instance: empty host, zeroed KV
    tokens = prompt(11, blocks=BLOCKS)
    hits, blocks = serve(eng, "again", tokens)
    stats = eng.manager.stats()
    assert hits == BLOCKS, stats
    assert stats["cluster_promoted"] == BLOCKS and stats["cluster_corrupt_dropped"] == 0, stats
    assert_exact(eng, tokens, blocks, BLOCKS)  # from the store, through the staging and the host row
    worker = eng.worker.connector_worker.worker.cluster
    assert worker.stats()["cluster_chunks_filled"] == BLOCKS
    assert worker.stats()["cluster_pages_put"] == 0, "chunks the cluster holds are not put again"
    assert eng.manager.num_pins == 0 and stats["cluster_staging_free"] == eng.manager.cluster.geometry.staging_chunks()
    eng.manager.check()
    eng.close()


def _flip(served: Served, eng: Engine, key: bytes, offset: int) -> None:
    """Flips one byte of the key's record (shard 0) in the store server's own memory."""
    catalog = eng.manager.cluster
    replica = catalog.client.store._store.get_replica_desc(object_key(catalog.namespaces[0], l3_key(key)))[0]
    address = replica.get_memory_descriptor().buffer_descriptor.buffer_address
    with open(f"/proc/{served.children()['store']}/mem", "r+b", buffering=0) as memory:
        memory.seek(address + offset)
        byte = memory.read(1)[0]
        memory.seek(address + offset)
        memory.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("where", ["payload", "trailer"])
def test_a_flipped_byte_in_the_store_is_a_counted_miss_and_the_next_store_replaces_it(served: Served,
                                                                                       where: str) -> None:
    seed = 13 if where == "payload" else 17
    keys = first_instance(served, seed)
    eng = Engine(cluster_extra(served))
    page_bytes = eng.manager.cluster.geometry.page_bytes
    _flip(served, eng, keys[1], 100 if where == "payload" else page_bytes + 30)
    tokens = prompt(seed, blocks=BLOCKS)
    hits, blocks = serve(eng, "again", tokens)
    stats = eng.manager.stats()
    assert hits == 1, "the first chunk is served, the damaged second one ends the hit"
    assert stats["cluster_corrupt_dropped"] == 1, stats
    assert_exact(eng, tokens, blocks, BLOCKS)  # the rest was computed, not read from the bad record
    # The recomputed chunk's store replaced the damaged record (upsert): a third instance hits it all.
    eng.close()
    third = Engine(cluster_extra(served))
    hits, blocks = serve(third, "third", tokens)
    assert hits == BLOCKS and third.manager.stats()["cluster_corrupt_dropped"] == 0
    assert_exact(third, tokens, blocks, BLOCKS)
    third.close()


def test_another_dtype_misses(served: Served) -> None:
    first_instance(served, 19)
    other = Engine(cluster_extra(served), model_dtype="float16")  # the same bytes per chunk (engine.py)
    hits, _ = serve(other, "again", prompt(19, blocks=BLOCKS))
    assert hits == 0 and other.manager.stats()["cluster_promoted"] == 0
    other.close()


def test_a_master_down_at_start_is_refused_naming_the_key() -> None:
    from cpkv.tier.cluster.local import free_port

    down = Served(None, f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}/metadata")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"kv_connector_extra_config\['cpkv_cluster_master'\]"):
        Engine(cluster_extra(down))


@pytest.mark.parametrize(("overrides", "named"), [
    ({"cpkv_cluster_metadata": None}, "cpkv_cluster_metadata"),
    ({"cpkv_cluster_master": "no-port"}, "cpkv_cluster_master"),
    ({"cpkv_cluster_metadata": "ftp://x"}, "cpkv_cluster_metadata"),
    ({"cpkv_cluster_bytes": -1}, "cpkv_cluster_bytes"),
])
def test_bad_cluster_settings_are_refused_naming_the_key(served: Served, overrides: dict, named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        Engine(cluster_extra(served, **overrides))


def test_a_killed_master_costs_misses_only_and_the_tier_reattaches_when_one_is_back() -> None:
    own = start_serve()
    try:
        first_instance(own, 23)
        eng = Engine(cluster_extra(own))
        os.kill(own.children()["master"], signal.SIGKILL)  # cluster serve then stops its store server too
        tokens = prompt(23, blocks=BLOCKS)
        hits, blocks = serve(eng, "during", tokens)
        stats = eng.manager.stats()
        assert hits == 0 and stats["cluster_available"] == 0 and stats["cluster_faults"] == 1, stats
        assert_exact(eng, tokens, blocks, BLOCKS)  # 0 wrong pages: computed
        own = restart_serve(own)
        # Re-attached by the scheduler's probe, polled once per step (counted, never timed).
        wait_for(lambda: eng.step() is not None and eng.manager.stats()["cluster_available"] == 1, 60,
                 "the scheduler's tier to re-attach", poll_s=0.01)
        assert eng.manager.stats()["cluster_reattaches"] == 1
        # The worker's puts failed too: it re-attaches by its own probe, polled once per job.
        worker = eng.worker.connector_worker.worker.cluster
        served_prompts = iter(range(1000, 2000))
        wait_for(lambda: serve(eng, f"p{next(served_prompts)}", prompt(next(served_prompts), blocks=1)) is not None
                 and worker.stats()["cluster_available"] == 1, 120, "the worker to re-attach", poll_s=0.01)
        # Cold: the restarted master holds nothing; a new chunk goes up and a new instance is served it.
        tokens = prompt(29, blocks=BLOCKS)
        serve(eng, "new", tokens)
        assert worker.stats()["cluster_pages_put"] >= BLOCKS
        eng.close()
        fresh = Engine(cluster_extra(own))
        hits, blocks = serve(fresh, "fresh", tokens)
        assert hits == BLOCKS
        assert_exact(fresh, tokens, blocks, BLOCKS)
        fresh.close()
    finally:
        own.stop()



def test_under_l3_a_cluster_chunk_is_served_and_its_eviction_spills_the_filled_bytes_to_disk(
        served: Served, tmp_path: Any) -> None:
    """Host, then L3, then the cluster: a chunk read from the cluster fills its host row; when the
    host evicts it, the filled bytes go to L3 and are served from there, byte for byte."""
    first_instance(served, 31)
    eng = Engine(cluster_extra(served, cpkv_host_blocks=4, cpkv_l3_dir=str(tmp_path), cpkv_l3_bytes=1 << 22))
    tokens = prompt(31, blocks=BLOCKS)
    hits, blocks = serve(eng, "from-cluster", tokens)
    assert hits == BLOCKS and eng.manager.stats()["cluster_promoted"] == BLOCKS
    assert_exact(eng, tokens, blocks, BLOCKS)
    for seed in (32, 33):  # new prompts evict the cluster's chunks from the 4-block host to disk
        serve(eng, f"evict{seed}", prompt(seed, blocks=BLOCKS))
    eng.reset_device()
    assert eng.manager.stats()["l3_spilled"] >= BLOCKS
    promoted = eng.manager.stats()["cluster_promoted"]
    hits, blocks = serve(eng, "from-disk", tokens)
    stats = eng.manager.stats()
    assert hits >= 1 and stats["l3_promoted"] >= 1 and stats["cluster_promoted"] == promoted, stats
    assert_exact(eng, tokens, blocks, hits)
    eng.close()
