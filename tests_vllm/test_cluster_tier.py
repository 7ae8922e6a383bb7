"""cpkv's cluster tier as an out-of-tree vLLM 0.33 secondary tier (``CpkvClusterTier``) under vLLM's
own CPU tier, against a real ``cpkv cluster serve``. vLLM's Scheduler builds the connector, its
``TieringOffloadingSpec`` loads the tier from the tier config's ``module_path``, and the test drives
the ``TieringOffloadingManager`` vLLM built the way vLLM's scheduler-side connector does
(``on_new_request``, ``prepare_store``/``complete_store``, ``lookup`` per step with
``on_schedule_end``, ``prepare_load``/``complete_load``); the bytes a GPU worker would copy in and out
of the CPU tier's rows are written and read here (vLLM's CPU worker needs CUDA).

A second instance starts warm from the first's chunks, byte for byte; a flipped byte in the store
is a counted miss; another KV dtype misses; a master down at start is refused by name; a killed
master: no hang, misses only."""

from __future__ import annotations

import hashlib
import os
import signal
from typing import Any

import numpy as np
import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.tiering.async_lookup import LookupPhase

from cluster_serve import Served, start_serve
from cpkv.errors import InvalidArgumentError
from engine import Engine
from waiting import wait_for

CHUNKS = 6
STEPS = 100


def tiering_extra(master: str, metadata: str, **tier: Any) -> dict[str, Any]:
    return {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 4 << 20,
            "secondary_tiers": [{"type": "CpkvClusterTier", "module_path": "cpkv.integrations.vllm.cluster_tier",
                                 "cpkv_cluster_master": master, "cpkv_cluster_metadata": metadata,
                                 "cpkv_timeout_s": 5, **tier}]}


class Instance:
    """One vLLM instance's scheduler side: vLLM's Scheduler, its TieringOffloadingManager, the rows
    of its CPU tier."""

    def __init__(self, served: Served, model_dtype: str = "float32") -> None:
        self.engine = Engine(tiering_extra(served.master, served.metadata), worker_side=False,
                             model_dtype=model_dtype)
        self.manager = self.engine.manager
        self.tier = self.manager.secondary_tiers[0]
        view = np.asarray(self.manager.primary_tier.get_kv_memoryview())
        self.rows = view.view(np.uint8).reshape(view.shape[0], -1)

    def end_step(self) -> None:
        self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))

    def store(self, req_id: str, keys: list[bytes]) -> None:
        """A request's chunks into the CPU tier (their bytes written as the GPU->CPU copy would),
        cascaded by vLLM to the secondary tier; returns once the tier's store jobs are done."""
        ctx = ReqContext(req_id=req_id)
        self.manager.on_new_request(ctx)
        out = self.manager.prepare_store(keys, ctx)
        assert out is not None and list(out.keys_to_store) == keys
        for key, chunk in zip(keys, out.store_spec.chunk_ids):
            self.rows[chunk] = np.frombuffer(chunk_bytes(key, self.rows.shape[1]), dtype=np.uint8)
        self.manager.complete_store(keys, ctx)
        self.manager.on_request_finished(ctx)
        self.settle()

    def settle(self) -> None:
        for _ in range(STEPS):
            self.end_step()
            if not self.manager.has_pending_work():
                return
            wait_for(self.answered, 30, "the cluster tier's jobs")
        raise AssertionError("the tiers did not settle")

    def answered(self) -> bool:
        """Nothing the tier does is still unanswered (its lookup thread's answers and its jobs' results
        are in, for vLLM to take at its next call)."""
        lookups = self.tier._lookups
        in_flight = any(state.phase is LookupPhase.IN_FLIGHT and state.result is None
                        for state in lookups._lookup_state.values())
        return (not in_flight or not lookups._pending_results.empty()) and not self.tier._running

    def hits(self, req_id: str, keys: list[bytes]) -> tuple[int, list[bytes]]:
        """Steps as vLLM's scheduler does until every chunk's lookup is final; returns the leading
        hits and their bytes as a load from the CPU tier would copy them out."""
        ctx = ReqContext(req_id=req_id)
        self.manager.on_new_request(ctx)
        for _ in range(STEPS):
            results = []
            for key in keys:
                results.append(self.manager.lookup(key, ctx))
                if results[-1] is not LookupResult.HIT:
                    break
            if results[-1] in (LookupResult.HIT, LookupResult.MISS):
                break
            self.end_step()
            wait_for(self.answered, 30, "the cluster tier's lookups and loads to answer")
        else:
            raise AssertionError("the lookups never settled")
        n = sum(1 for r in results if r is LookupResult.HIT)
        data: list[bytes] = []
        if n:
            spec = self.manager.prepare_load(keys[:n], ctx)
            data = [bytes(self.rows[c]) for c in spec.chunk_ids]
            self.manager.complete_load(keys[:n], ctx)
        self.manager.on_request_finished(ctx)
        self.settle()
        return n, data

    def close(self) -> None:
        self.engine.scheduler.shutdown()


def chunk_bytes(key: bytes, size: int) -> bytes:
    """A chunk's content: a pure function of its key."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def chunk_keys(seed: int) -> list[bytes]:
    return [make_offload_key(hashlib.sha256(f"{seed}/{i}".encode()).digest(), 0) for i in range(CHUNKS)]


def test_a_second_instance_starts_warm_from_the_first_byte_for_byte(served: Served) -> None:
    keys = chunk_keys(31)
    first = Instance(served)
    first.store("first", keys)
    assert first.tier.stats()["cluster_pages_put"] == CHUNKS
    second = Instance(served)
    n, data = second.hits("again", keys)
    assert n == CHUNKS, "every chunk from the cluster"
    assert data == [chunk_bytes(k, second.rows.shape[1]) for k in keys]
    stats = second.tier.stats()
    assert stats["cluster_chunks_loaded"] == CHUNKS and stats["cluster_corrupt_dropped"] == 0
    second.store("again-stored", chunk_keys(32)[:1])  # a new chunk goes up; the held ones are not put again
    assert second.tier.stats()["cluster_pages_put"] == 1
    first.close()
    second.close()


def test_a_flipped_byte_in_the_store_is_a_counted_miss(served: Served) -> None:
    from cpkv.integrations.vllm.l3 import l3_key
    from cpkv.tier.cluster.tier import object_key

    keys = chunk_keys(37)
    first = Instance(served)
    first.store("first", keys)
    raw = first.tier._client.store._store  # the Mooncake client: where the replica lives
    replica = raw.get_replica_desc(object_key(first.tier.namespace_id, l3_key(keys[3])))[0]
    address = replica.get_memory_descriptor().buffer_descriptor.buffer_address
    with open(f"/proc/{served.children()['store']}/mem", "r+b", buffering=0) as memory:
        memory.seek(address + 100)
        byte = memory.read(1)[0]
        memory.seek(address + 100)
        memory.write(bytes([byte ^ 0x01]))
    second = Instance(served)
    n, data = second.hits("again", keys)
    assert second.tier.stats()["cluster_corrupt_dropped"] == 1
    assert n == 3, "chunks 0-2 from the cluster; chunk 3 failed its check and is no hit"
    assert data == [chunk_bytes(k, second.rows.shape[1]) for k in keys[:3]]
    first.close()
    second.close()


def test_another_kv_dtype_misses(served: Served) -> None:
    keys = chunk_keys(41)
    first = Instance(served)
    first.store("first", keys)
    other = Instance(served, model_dtype="float16")  # the same bytes per chunk (engine.py keeps them)
    assert other.rows.shape[1] == first.rows.shape[1]
    assert other.hits("again", keys) == (0, [])
    assert other.tier.stats()["cluster_chunks_loaded"] == 0
    first.close()
    other.close()


def test_a_master_down_at_start_is_refused_naming_the_key() -> None:
    from cpkv.tier.cluster.local import free_port

    master = f"127.0.0.1:{free_port()}"
    served = Served(None, master, f"http://127.0.0.1:{free_port()}/metadata")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"secondary_tiers\[CpkvClusterTier\]\['cpkv_cluster_master'\]"):
        Instance(served)
    with pytest.raises(InvalidArgumentError, match="cpkv_cluster_metadata"):
        Engine(tiering_extra(master, "not-a-url"), worker_side=False)


def test_a_killed_master_gives_misses_only_and_no_hang() -> None:
    own = start_serve()
    try:
        keys = chunk_keys(43)
        first = Instance(own)
        first.store("first", keys)
        second = Instance(own)
        os.kill(own.children()["master"], signal.SIGKILL)
        assert second.hits("again", keys) == (0, [])
        stats = second.tier.stats()
        assert stats["cluster_available"] == 0 and stats["cluster_chunks_loaded"] == 0
        first.close()
        second.close()
    finally:
        own.stop()


def test_a_restarted_master_is_reattached_cold_and_serves_again() -> None:
    """The master killed (``cluster serve`` then stops its store server) and a new one started on the
    same ports: the tier goes off at its first failed call, probes while off (by scheduler steps),
    comes back on by itself, cold (the old chunks are gone: misses, never stale bytes), and the
    chunks it stores after that serve a new instance byte for byte."""
    from cluster_serve import restart_serve

    own = start_serve()
    instances: list[Instance] = []
    try:
        keys = chunk_keys(47)
        first = Instance(own)
        instances.append(first)
        first.store("first", keys)
        second = Instance(own)  # its own CPU tier is empty: every hit would be the cluster's
        instances.append(second)
        os.kill(own.children()["master"], signal.SIGKILL)
        assert second.hits("during", keys) == (0, [])
        assert second.tier.stats()["cluster_available"] == 0
        own = restart_serve(own)

        def reattached() -> bool:
            second.end_step()  # a scheduler step: the tier polls its probe of the store
            return bool(second.tier.stats()["cluster_available"])

        wait_for(reattached, 60, "the tier to re-attach to the restarted master", poll_s=0.01)
        stats = second.tier.stats()
        assert stats["cluster_reattaches"] == 1 and stats["cluster_probes"] >= 1, stats
        assert second.hits("cold", keys) == (0, []), "a restarted master holds nothing: misses only"
        fresh = chunk_keys(48)
        put_before = second.tier.stats()["cluster_pages_put"]
        second.store("after", fresh)
        assert second.tier.stats()["cluster_pages_put"] - put_before == CHUNKS
        third = Instance(own)
        instances.append(third)
        n, data = third.hits("again", fresh)
        assert n == CHUNKS and data == [chunk_bytes(k, third.rows.shape[1]) for k in fresh]
        assert third.tier.stats()["cluster_corrupt_dropped"] == 0
        assert second.tier.stats()["cluster_available"] == 1
    finally:
        for instance in instances:
            instance.close()
        own.stop()
