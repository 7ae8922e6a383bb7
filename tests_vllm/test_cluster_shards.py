"""The cluster tier under cpkv's connector with two workers holding different shards of each chunk
(tensor parallelism): the manager and two CpkvOffloadingWorker instances of ranks 0 and 1 fed the
very specs vLLM's connector hands every worker, against a real ``cpkv cluster serve``. Each worker
puts only its own shard; another instance's workers each read back exactly their own bytes; a chunk
with one shard absent or damaged is a miss for every worker; and a model-based test of random
stores and lookups across two instances: every hit is exactly the chunks whose every shard the
cluster holds, byte for byte, and no staging slot or pin is left behind."""

from __future__ import annotations

import itertools

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
    make_offload_key,
)

from cluster_serve import Served
from cpkv.integrations.vllm import CpkvOffloadConfig
from cpkv.integrations.vllm.cluster import ClusterCatalog, ClusterGeometry
from cpkv.integrations.vllm.l3 import l3_key
from cpkv.integrations.vllm.manager import CpkvOffloadingManager
from cpkv.integrations.vllm.worker import CpkvOffloadingWorker
from cpkv.tier.cluster.tier import object_key

BLOCKS, PER_CHUNK, CHUNK_TOKENS = 16, 2, 32
PAGES = (64, 40)
WORLD = 2
TIMEOUT_S = 60.0
_salts = itertools.count()


def geometry() -> ClusterGeometry:
    return ClusterGeometry(model="m", dtype="bfloat16", layout="shards test", tokens_per_chunk=CHUNK_TOKENS,
                           world=WORLD, page_bytes=sum(PAGES) * PER_CHUNK)


def instance(served: Served, seed: int, host_chunks: int = 8) -> tuple[CpkvOffloadingManager, list[CpkvOffloadingWorker],
                                                                        list[list[torch.Tensor]]]:
    """A manager and one worker per rank, each over its own KV tensors (different bytes: different heads)."""
    settings_ = CpkvOffloadConfig(host_blocks=host_chunks, timeout_s=5.0, cluster_master=served.master,
                                  cluster_metadata=served.metadata)
    m = CpkvOffloadingManager(host_chunks, "lru", tokens_per_chunk=(CHUNK_TOKENS,),
                              cluster=ClusterCatalog(geometry(), served.master, served.metadata, 5.0))
    ws, kv = [], []
    for rank in range(WORLD):
        gen = torch.Generator().manual_seed(seed * 10 + rank)
        tensors = [torch.randint(-128, 127, (BLOCKS, page), dtype=torch.int8, generator=gen) for page in PAGES]
        caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, t.shape[1]) for t in tensors],
                                   [[CanonicalKVCacheRef(i, page) for i, page in enumerate(PAGES)]])
        ws.append(CpkvOffloadingWorker(caches, blocks_per_chunk=PER_CHUNK, host_blocks=host_chunks, slab="private",
                                       cluster=(geometry(), rank, settings_)))
        kv.append(tensors)
    return m, ws, kv


def close(m: CpkvOffloadingManager, ws: list[CpkvOffloadingWorker]) -> None:
    for w in ws:  # vLLM's order: the workers, then the scheduler
        w.shutdown()
    m.shutdown()


def request(req_id: str, chain: list[int], salt: int) -> tuple[ReqContext, list[bytes]]:
    ctx = ReqContext(req_id=req_id)
    keys = [make_offload_key(bytes(repr((salt, *chain[: i + 1])), "ascii"), 0) for i in range(len(chain))]
    for i, key in enumerate(keys):
        ctx.set_offload_key_position(key, (i + 1) * CHUNK_TOKENS)
    return ctx, keys


def store(m: CpkvOffloadingManager, ws: list[CpkvOffloadingWorker], ctx: ReqContext, keys: list[bytes],
          blocks: list[int], job: int) -> list[bytes]:
    """Stores what the manager takes of ``keys`` from device ``blocks`` (PER_CHUNK per key) on every
    worker; returns the keys stored."""
    out = m.prepare_store(keys, ctx)
    assert out is not None
    stored = list(out.keys_to_store)
    if not stored:  # vLLM submits no job for an offer the host already holds
        m.on_request_finished(ctx)
        return []
    at = [keys.index(k) for k in stored]
    src = [blocks[i * PER_CHUNK + j] for i in at for j in range(PER_CHUNK)]
    for w in ws:  # every worker runs every job (vLLM's connector), then the scheduler completes it
        w.submit_store(job, GPULoadStoreSpec(src, [len(src)], [0]), out.store_spec)
    m.complete_store(stored, ctx)
    m.on_request_finished(ctx)
    return stored


def hits(m: CpkvOffloadingManager, ctx: ReqContext, keys: list[bytes]) -> int:
    """vLLM's maximal-prefix scan, repeated (waiting on the reads) until no lookup is deferred."""
    assert m.cluster is not None
    for _ in range(10):
        results = []
        for key in keys:
            result = m.lookup(key, ctx)
            results.append(result)
            if result is LookupResult.MISS:
                break
        m.on_schedule_end(None)
        if LookupResult.RETRY not in results:
            return sum(1 for r in results if r is LookupResult.HIT)
        assert m.cluster.wait_idle(TIMEOUT_S)
    raise AssertionError("the lookups stayed deferred")


def load(m: CpkvOffloadingManager, ws: list[CpkvOffloadingWorker], ctx: ReqContext, keys: list[bytes],
         targets: list[int], job: int) -> None:
    spec = m.prepare_load(keys, ctx)
    for w in ws:
        w.submit_load(job, spec, GPULoadStoreSpec(targets, [len(targets)], [0]))
    m.complete_load(keys, ctx)
    m.on_request_finished(ctx)


def chunk_bytes(kv: list[list[torch.Tensor]], blocks: list[int]) -> list[list[torch.Tensor]]:
    """Per rank, per tensor: the bytes of device ``blocks`` (cloned)."""
    return [[t[blocks].clone() for t in tensors] for tensors in kv]


def assert_loaded(kv: list[list[torch.Tensor]], expected: list[list[torch.Tensor]], targets: list[int]) -> None:
    for rank in range(WORLD):
        for t in range(len(PAGES)):
            assert torch.equal(kv[rank][t][targets], expected[rank][t]), (rank, t)


def test_each_worker_puts_and_another_instance_reads_back_only_its_own_shard(served: Served) -> None:
    salt = next(_salts)
    m, ws, kv = instance(served, seed=1)
    ctx, keys = request("a", [1, 2], salt)
    assert store(m, ws, ctx, keys, [3, 4, 5, 6], job=1) == keys
    assert [w.cluster.stats()["cluster_pages_put"] if w.cluster else None for w in ws] == [2, 2]
    original = chunk_bytes(kv, [3, 4, 5, 6])
    assert not torch.equal(original[0][0], original[1][0]), "the ranks hold different bytes"
    close(m, ws)

    m, ws, kv = instance(served, seed=2)  # another instance: other device bytes, an empty host
    ctx, keys = request("b", [1, 2], salt)
    assert hits(m, ctx, keys) == 2
    load(m, ws, ctx, keys, [0, 1, 14, 15], job=1)
    assert_loaded(kv, original, [0, 1, 14, 15])
    assert m.num_pins == 0 and m.stats()["cluster_staging_free"] == geometry().staging_chunks()
    m.check()
    close(m, ws)


def test_a_chunk_with_one_shard_absent_or_damaged_is_a_miss_for_every_worker(served: Served) -> None:
    salt = next(_salts)
    m, ws, _ = instance(served, seed=3)
    assert ws[1].cluster is not None
    ctx, keys = request("a", [1, 2], salt)
    store(m, ws, ctx, keys[:1], [3, 4], job=1)
    ws[1].cluster.client.mark_down("a failed put (the test)")  # rank 1 puts nothing more
    store(m, ws, ctx, keys, [3, 4, 5, 6], job=2)
    assert [w.cluster.stats()["cluster_pages_put"] if w.cluster else None for w in ws] == [2, 1]
    close(m, ws)

    m, ws, _ = instance(served, seed=4)
    ctx, keys = request("b", [1, 2], salt)
    assert hits(m, ctx, keys) == 1, "the second chunk lacks rank 1's shard: no hit"
    load(m, ws, ctx, keys[:1], [0, 1], job=1)
    assert m.cluster is not None
    catalog = m.cluster
    name = object_key(catalog.namespaces[1], l3_key(keys[0]))
    replica = catalog.client.store._store.get_replica_desc(name)[0]  # type: ignore[union-attr]
    address = replica.get_memory_descriptor().buffer_descriptor.buffer_address
    with open(f"/proc/{served.children()['store']}/mem", "r+b", buffering=0) as memory:  # rank 1's shard only
        memory.seek(address + 3)
        byte = memory.read(1)[0]
        memory.seek(address + 3)
        memory.write(bytes([byte ^ 0x01]))
    close(m, ws)

    m, ws, _ = instance(served, seed=5)
    ctx, keys = request("c", [1, 2], salt)
    assert hits(m, ctx, keys) == 0, "rank 1's damaged shard makes the first chunk a miss for every worker"
    stats = m.stats()
    assert stats["cluster_corrupt_dropped"] == 1 and stats["cluster_promoted"] == 0, stats
    assert stats["cluster_staging_free"] == geometry().staging_chunks()
    close(m, ws)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stored=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=3), min_size=1, max_size=4),
       asked=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=3), min_size=1, max_size=4))
def test_random_stores_and_lookups_across_two_instances_serve_exactly_what_the_cluster_holds(
        served: Served, stored: list[list[int]], asked: list[list[int]]) -> None:
    """Instance A stores random chains (prefixes shared); instance B looks up random chains. Model:
    the chunks A stored (each put by both workers). B hits exactly the leading chunks of each chain
    the model holds (or B's host already holds, from its own earlier loads), with A's bytes."""
    salt = next(_salts)
    m, ws, kv = instance(served, seed=6, host_chunks=16)
    model: dict[bytes, list[list[torch.Tensor]]] = {}
    for i, chain in enumerate(stored):
        ctx, keys = request(f"a{i}", chain, salt)
        blocks = list(range(len(keys) * PER_CHUNK))
        for key in store(m, ws, ctx, keys, blocks, job=i + 1):
            at = keys.index(key)
            model[key] = chunk_bytes(kv, blocks[at * PER_CHUNK:(at + 1) * PER_CHUNK])
    close(m, ws)

    m, ws, kv = instance(served, seed=7, host_chunks=16)
    for i, chain in enumerate(asked):
        ctx, keys = request(f"b{i}", chain, salt)
        expected = 0
        while expected < len(keys) and keys[expected] in model:
            expected += 1
        got = hits(m, ctx, keys)
        assert got == expected, (chain, got, expected)
        if got:
            targets = list(range(BLOCKS - got * PER_CHUNK, BLOCKS))
            load(m, ws, ctx, keys[:got], targets, job=100 + i)
            expected_bytes = [[torch.cat([model[k][rank][t] for k in keys[:got]]) for t in range(len(PAGES))]
                              for rank in range(WORLD)]
            assert_loaded(kv, expected_bytes, targets)
        else:
            m.on_request_finished(ctx)
    for _ in range(2):  # a read no lookup used (its chain stopped at an earlier miss) is freed within two steps
        m.on_schedule_end(None)
    assert m.num_pins == 0 and m.stats()["cluster_staging_free"] == geometry().staging_chunks()
    m.check()
    close(m, ws)

