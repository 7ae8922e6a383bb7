"""L3 with two workers holding different shards of each chunk (tensor parallelism): the manager and
two CpkvOffloadingWorker instances of ranks 0 and 1 fed the very specs vLLM's connector hands every
worker. Each worker writes only its shard, each once; after a restart both read back their own
bytes exactly; a record damaged on one shard makes the chunk a miss for every worker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
    make_offload_key,
)

from cpkv._cpkv import l3_check
from cpkv.integrations.vllm.l3 import L3Catalog, L3Geometry, l3_key
from cpkv.integrations.vllm.manager import CpkvOffloadingManager
from cpkv.integrations.vllm.worker import CpkvOffloadingWorker
from test_l3 import disk_bytes

BLOCKS, HOST_CHUNKS, PER_CHUNK, CHUNK_TOKENS = 16, 2, 2, 32
PAGES = (64, 40)
WORLD = 2
TIMEOUT_S = 60.0


def geometry(directory: Path, cap: int = 1 << 20) -> L3Geometry:
    return L3Geometry(directory=directory, cap_bytes=cap, model="m", dtype="bfloat16", layout="test",
                      tokens_per_chunk=CHUNK_TOKENS, world=WORLD, page_bytes=sum(PAGES) * PER_CHUNK)


def workers(directory: Path, seed: int, cap: int = 1 << 20) -> tuple[list[CpkvOffloadingWorker], list[list[torch.Tensor]]]:
    """One worker per rank, each over its own KV tensors (different bytes: different heads)."""
    out, kv = [], []
    for rank in range(WORLD):
        gen = torch.Generator().manual_seed(seed * 10 + rank)
        tensors = [torch.randint(-128, 127, (BLOCKS, page), dtype=torch.int8, generator=gen) for page in PAGES]
        caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, t.shape[1]) for t in tensors],
                                   [[CanonicalKVCacheRef(i, page) for i, page in enumerate(PAGES)]])
        out.append(CpkvOffloadingWorker(caches, blocks_per_chunk=PER_CHUNK, host_blocks=HOST_CHUNKS, slab="private",
                                        l3=(geometry(directory, cap), rank)))
        kv.append(tensors)
    return out, kv


def request(req_id: str, chain: list[int]) -> tuple[ReqContext, list[bytes]]:
    ctx = ReqContext(req_id=req_id)
    keys = [make_offload_key(bytes(repr(tuple(chain[: i + 1])), "ascii"), 0) for i in range(len(chain))]
    for i, key in enumerate(keys):
        ctx.set_offload_key_position(key, (i + 1) * CHUNK_TOKENS)
    return ctx, keys


def store(m: CpkvOffloadingManager, ws: list[CpkvOffloadingWorker], ctx: ReqContext, keys: list[bytes],
          blocks: list[int], job: int, success: bool = True) -> None:
    out = m.prepare_store(keys, ctx)
    assert out is not None and out.keys_to_store == keys
    for w in ws:  # every worker runs every job (vLLM's connector), then the scheduler completes it
        w.submit_store(job, GPULoadStoreSpec(blocks, [len(blocks)], [0]), out.store_spec)
    m.complete_store(keys, ctx, success=success)
    m.on_request_finished(ctx)


def assert_loaded(kv: list[list[torch.Tensor]], original: list[list[torch.Tensor]], targets: list[int],
                  sources: list[int]) -> None:
    """Every worker's device blocks ``targets`` hold, layer by layer, what its blocks ``sources`` held
    when they were stored: each worker got its own shard back."""
    for rank in range(WORLD):
        for t in range(len(PAGES)):
            for target, source in zip(targets, sources, strict=True):
                assert torch.equal(kv[rank][t][target], original[rank][t][source]), (rank, t, target)


def promote_and_load(m: CpkvOffloadingManager, ws: list[CpkvOffloadingWorker], req_id: str, chain: list[int],
                     job: int, targets: list[int]) -> Any:
    """A request whose chunks are all on disk only: RETRY while the catalog checks them, then HIT, and
    a load of them into the device blocks ``targets`` on every worker; the load spec."""
    ctx, keys = request(req_id, chain)
    assert [m.lookup(k, ctx) for k in keys] == [LookupResult.RETRY] * len(keys)
    assert m.l3 is not None and m.l3.wait_idle(TIMEOUT_S)
    assert [m.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * len(keys)
    spec = m.prepare_load(keys, ctx)
    for w in ws:
        w.submit_load(job, spec, GPULoadStoreSpec(targets, [len(targets)], [0]))
    m.complete_load(keys, ctx)
    return spec


def test_each_worker_writes_and_reads_back_only_its_own_shard(tmp_path: Path) -> None:
    m = CpkvOffloadingManager(HOST_CHUNKS, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=1)
    first_ctx, first = request("a", [1, 2])
    store(m, ws, first_ctx, first, [3, 4, 5, 6], job=1)
    second_ctx, second = request("b", [7, 8])
    store(m, ws, second_ctx, second, [9, 10, 11, 12], job=2)  # evicts "a": its spills ride on this job
    stats = m.stats()
    assert stats["l3_spilled"] == 2 and stats["l3_committed"] == 2, stats
    assert [w.l3.counters["pages_written"] if w.l3 else None for w in ws] == [2, 2]  # each its own shard, once
    original = [[t.clone() for t in tensors] for tensors in kv]
    m.shutdown()
    for w in ws:
        w.shutdown()

    # A restart: fresh manager and workers (other device bytes) on the same directory.
    m = CpkvOffloadingManager(8, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=2)
    assert m.stats()["l3_recovered"] == 2
    targets = [0, 1, 14, 15]
    spec = promote_and_load(m, ws, "c", [1, 2], 3, targets)
    assert len(spec.fills) == 2
    assert_loaded(kv, original, targets, [3, 4, 5, 6])
    assert not torch.equal(original[0][0][3], original[1][0][3]), "the ranks hold different bytes"
    assert m.num_pins == 0
    m.check()
    m.shutdown()
    for w in ws:
        w.shutdown()


def test_a_failed_store_acknowledges_none_of_the_spills_it_carried(tmp_path: Path) -> None:
    """vLLM reports a store failed (its tiering manager does): the spills that job carried are not
    known written, so they stay pending and unreadable, and the next job carries them and commits
    them. The failed chunks leave the host: their rows take the next store without an eviction, and
    a clean stop takes in only what the host really holds."""
    m = CpkvOffloadingManager(HOST_CHUNKS, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=8)
    a_ctx, a = request("a", [1, 2])
    store(m, ws, a_ctx, a, [3, 4, 5, 6], job=1)
    b_ctx, b = request("b", [7, 8])
    store(m, ws, b_ctx, b, [9, 10, 11, 12], job=2, success=False)  # evicted "a": its spills rode on it
    assert m.l3 is not None and m.stats()["l3_committed"] == 0 and len(m.l3.pending) == 1
    ctx, keys = request("c", [1, 2])
    assert [m.lookup(k, ctx) for k in keys] == [LookupResult.MISS] * 2, "not acknowledged: not readable"
    assert [m.lookup(k, b_ctx) for k in b] == [LookupResult.MISS] * 2 and m.resident_keys() == []
    d_ctx, d = request("d", [5, 6])
    out = m.prepare_store(d, d_ctx)
    assert out is not None and out.evicted_keys == [] and len(out.store_spec.spills) == 1
    for w in ws:
        w.submit_store(3, GPULoadStoreSpec([13, 14, 15, 0], [4], [0]), out.store_spec)
    m.complete_store(d, d_ctx)
    assert m.stats()["l3_committed"] == 2 and not m.l3.pending
    assert [w.l3.counters["pages_written"] if w.l3 else None for w in ws] == [2, 2], "written once"
    original = [[t.clone() for t in tensors] for tensors in kv]
    for w in ws:
        w.shutdown()
    m.shutdown()
    assert m.stats()["l3_stop_spilled"] == 2  # "d", not the failed "b"

    m = CpkvOffloadingManager(8, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=9)
    assert m.stats()["l3_recovered"] == 4
    promote_and_load(m, ws, "e", [1, 2], 4, [0, 1, 2, 7])
    assert_loaded(kv, original, [0, 1, 2, 7], [3, 4, 5, 6])
    ctx, keys = request("f", [7, 8])
    assert [m.lookup(k, ctx) for k in keys] == [LookupResult.MISS] * 2, "the failed store never reached disk"
    m.shutdown()
    for w in ws:
        w.shutdown()


def test_a_record_damaged_on_one_shard_is_a_miss_for_every_worker(tmp_path: Path) -> None:
    m = CpkvOffloadingManager(1, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, _ = workers(tmp_path, seed=3)
    a_ctx, a = request("a", [1])
    store(m, ws, a_ctx, a, [3, 4], job=1)
    b_ctx, b = request("b", [2])
    store(m, ws, b_ctx, b, [5, 6], job=2)
    assert m.stats()["l3_committed"] == 1
    g = geometry(tmp_path)
    assert m.l3 is not None
    slot, sequence = m.l3.index.peek(l3_key(a[0]))
    file, offset = g.where(slot)
    with open(g.shard_dir(1) / f"data-{file}.bin", "r+b") as f:  # rank 1's shard only
        f.seek(offset)  # the record's first payload bytes
        f.write(b"\xff\x00\xff")
    ctx, keys = request("c", [1])
    assert m.lookup(keys[0], ctx) is LookupResult.RETRY
    assert m.l3.wait_idle(TIMEOUT_S)
    assert m.lookup(keys[0], ctx) is LookupResult.MISS
    stats = m.stats()
    assert stats["l3_corrupt_dropped"] == 1 and list(stats["l3_rejects"]) == ["shard 1: checksum"], stats
    assert m.lookup(keys[0], ctx) is LookupResult.MISS and m.l3.peek(l3_key(a[0])) is None
    data = np.fromfile(g.shard_dir(0) / f"data-{file}.bin", dtype=np.uint8)
    record = np.ascontiguousarray(data[offset:offset + g.slot_bytes])
    assert l3_check(record, g.namespace(0), l3_key(a[0]), sequence, g.page_bytes) is None, "rank 0's shard is intact"
    m.shutdown()
    for w in ws:
        w.shutdown()


def test_a_clean_stop_takes_in_every_workers_shard_of_the_host_copy(tmp_path: Path) -> None:
    """Nothing evicted: both chunks are only in host memory. The workers close first (vLLM's order),
    each leaving its stop copy; the catalog takes both chunks in; after a restart each worker reads
    back exactly its own bytes."""
    m = CpkvOffloadingManager(HOST_CHUNKS, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=4)
    ctx, keys = request("a", [1, 2])
    store(m, ws, ctx, keys, [3, 4, 5, 6], job=1)
    assert m.stats()["l3_spilled"] == 0
    original = [[t.clone() for t in tensors] for tensors in kv]
    for w in ws:
        w.shutdown()
    m.shutdown()
    stats = m.stats()
    assert stats["l3_stop_spilled"] == 2 and stats["l3_committed"] == 2 and stats["l3_stop_unproven"] == 0, stats
    assert not list(tmp_path.rglob("stop.bin"))

    m = CpkvOffloadingManager(8, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=5)
    assert m.stats()["l3_recovered"] == 2
    targets = [0, 1, 14, 15]
    promote_and_load(m, ws, "b", [1, 2], 2, targets)
    assert_loaded(kv, original, targets, [3, 4, 5, 6])
    m.shutdown()
    for w in ws:
        w.shutdown()


def test_a_worker_that_left_no_stop_copy_keeps_the_host_copy_off_the_log(tmp_path: Path) -> None:
    """Rank 1 does not close before the catalog: no chunk is proven on every shard, none is logged;
    the stop copy rank 1 writes afterwards is removed by the next life's workers."""
    m = CpkvOffloadingManager(HOST_CHUNKS, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, _ = workers(tmp_path, seed=6)
    ctx, keys = request("a", [1, 2])
    store(m, ws, ctx, keys, [3, 4, 5, 6], job=1)
    ws[0].shutdown()
    m.shutdown()
    stats = m.stats()
    assert stats["l3_stop_spilled"] == 0 and stats["l3_stop_unproven"] == 2 and stats["l3_committed"] == 0, stats
    ws[1].shutdown()
    assert (geometry(tmp_path).stop_copy(1)).exists()
    m = CpkvOffloadingManager(8, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, _ = workers(tmp_path, seed=7)
    assert m.stats()["l3_recovered"] == 0 and not list(tmp_path.rglob("stop.bin"))
    m.shutdown()
    for w in ws:
        w.shutdown()


def disk_read_bytes() -> int:
    """Bytes this process has read from the block device (/proc/self/io): page-cache hits are not in it."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no read_bytes")


def test_spills_bypass_the_page_cache_and_a_promotion_reads_each_record_from_disk_once(tmp_path: Path) -> None:
    """With O_DIRECT spills, the scheduler's check of a promoted chunk reads every shard's record
    from disk, and the workers' fills read those bytes again from the page cache: one disk read
    per record, not zero (a buffered spill left it cached) and not two (an O_DIRECT fill)."""
    m = CpkvOffloadingManager(HOST_CHUNKS, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=8)
    shard = ws[0].l3
    assert shard is not None and m.l3 is not None
    if shard.mode != "o_direct":
        pytest.skip(f"this file system takes no O_DIRECT: {shard.mode_reason}")
    assert m.stats()["l3_io"] == "o_direct" and shard.stats()["l3_io"] == "o_direct"
    a_ctx, a = request("a", [1, 2])
    store(m, ws, a_ctx, a, [3, 4, 5, 6], job=1)
    original = [[t.clone() for t in tensors] for tensors in kv]
    b_ctx, b = request("b", [7, 8])
    store(m, ws, b_ctx, b, [9, 10, 11, 12], job=2)  # evicts "a": two chunks to disk, on both shards
    assert m.stats()["l3_committed"] == 2
    before = disk_read_bytes()
    ctx, keys = request("c", [1, 2])
    assert [m.lookup(k, ctx) for k in keys] == [LookupResult.RETRY] * 2
    assert m.l3.wait_idle(TIMEOUT_S)
    assert [m.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 2  # evicts "b" from the host: rows for "a"
    spec = m.prepare_load(keys, ctx)
    assert len(spec.fills) == 2
    targets = [0, 1, 14, 15]
    for w in ws:
        w.submit_load(3, spec, GPULoadStoreSpec(targets, [len(targets)], [0]))
    m.complete_load(keys, ctx)
    read = disk_read_bytes() - before
    records = 2 * WORLD * geometry(tmp_path).slot_bytes
    assert records <= read < 2 * records, (read, records)
    assert_loaded(kv, original, targets, [3, 4, 5, 6])
    m.shutdown()
    for w in ws:
        w.shutdown()


def test_a_file_system_that_refuses_o_direct_falls_back_to_buffered_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def refusing_open(path: object, flags: int, *args: object) -> int:
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument", str(path))
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing_open)
    m = CpkvOffloadingManager(1, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=9)
    for stats in [m.stats(), *(w.l3.stats() for w in ws if w.l3 is not None)]:
        assert stats["l3_io"] == "buffered", stats
        assert "O_DIRECT refused by the file system (EINVAL)" in stats["l3_io_reason"], stats
    a_ctx, a = request("a", [1])
    store(m, ws, a_ctx, a, [3, 4], job=1)
    b_ctx, b = request("b", [2])
    store(m, ws, b_ctx, b, [5, 6], job=2)  # "a" to disk, buffered
    original = [[t.clone() for t in tensors] for tensors in kv]
    ctx, keys = request("c", [1])
    assert m.lookup(keys[0], ctx) is LookupResult.RETRY
    assert m.l3 is not None and m.l3.wait_idle(TIMEOUT_S)
    assert m.lookup(keys[0], ctx) is LookupResult.HIT
    spec = m.prepare_load(keys, ctx)
    for w in ws:
        w.submit_load(3, spec, GPULoadStoreSpec([0, 1], [2], [0]))
    m.complete_load(keys, ctx)
    for rank in range(WORLD):
        for t in range(len(PAGES)):
            assert torch.equal(kv[rank][t][0], original[rank][t][3]) and torch.equal(kv[rank][t][1], original[rank][t][4])
    m.shutdown()
    for w in ws:
        w.shutdown()


# Per worker: 8 slots' worth of 4 KiB records (cpkv.tier.l3.store.slots_for), so 7 data slots and a
# stop-copy reserve of 1 record, smaller than the 2-chunk host
ONE_RECORD_RESERVE_CAP = WORLD * (24576 + 8 * 4192 + 50)


def test_both_workers_keep_the_same_rows_when_the_host_exceeds_the_stop_copy_reserve(tmp_path: Path) -> None:
    """Two workers, a one-record reserve, both host chunks only in memory: each worker's stop copy
    holds one record, of the same chunk (the job's first), the directory stays within the cap, the
    catalog takes that chunk in and counts the other, and a restart reads back each worker's bytes."""
    cap = ONE_RECORD_RESERVE_CAP
    g = geometry(tmp_path, cap)
    assert g.stop_rows == 1 and g.slots == 7
    m = CpkvOffloadingManager(HOST_CHUNKS, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(g))
    ws, kv = workers(tmp_path, seed=8, cap=cap)
    ctx, keys = request("a", [1, 2])
    store(m, ws, ctx, keys, [3, 4, 5, 6], job=1)
    original = [[t.clone() for t in tensors] for tensors in kv]
    for w in ws:
        w.shutdown()
    assert disk_bytes(tmp_path) <= cap
    assert [g.stop_copy(rank).stat().st_blocks * 512 for rank in range(WORLD)] == [g.slot_bytes] * WORLD
    m.shutdown()
    stats = m.stats()
    assert stats["l3_stop_spilled"] == 1 and stats["l3_not_spilled"] == 1 and stats["l3_stop_unproven"] == 0, stats
    assert disk_bytes(tmp_path) <= cap

    m = CpkvOffloadingManager(8, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(g))
    ws, kv = workers(tmp_path, seed=9, cap=cap)
    assert m.stats()["l3_recovered"] == 1
    ctx, keys = request("b", [1, 2])
    assert m.lookup(keys[0], ctx) is LookupResult.RETRY
    assert m.l3 is not None and m.l3.wait_idle(TIMEOUT_S)
    assert m.lookup(keys[0], ctx) is LookupResult.HIT
    assert m.lookup(keys[1], ctx) is LookupResult.MISS
    spec = m.prepare_load(keys[:1], ctx)
    targets = [0, 1]
    for w in ws:
        w.submit_load(2, spec, GPULoadStoreSpec(targets, [len(targets)], [0]))
    m.complete_load(keys[:1], ctx)
    assert_loaded(kv, original, targets, [3, 4])
    m.shutdown()
    for w in ws:
        w.shutdown()


def _l3_worker_on(rank: int, world: int, directory: str, machines: list[str]) -> str:
    """Builds rank's L3 worker over the launch's gloo group, as if on machine ``machines[rank]``."""
    import cpkv.tier.slab as slab
    from cpkv.errors import InvalidArgumentError

    slab._node_id = lambda: machines[rank]  # type: ignore[attr-defined]
    tensors = [torch.zeros((BLOCKS, page), dtype=torch.int8) for page in PAGES]
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, t.shape[1]) for t in tensors],
                               [[CanonicalKVCacheRef(i, page) for i, page in enumerate(PAGES)]])
    try:
        worker = CpkvOffloadingWorker(caches, blocks_per_chunk=PER_CHUNK, host_blocks=HOST_CHUNKS, slab="private",
                                      process_group=torch.distributed.group.WORLD, timeout_s=TIMEOUT_S,
                                      l3=(geometry(Path(directory)), rank))
    except InvalidArgumentError as err:
        return f"refused: {err}"
    worker.shutdown()
    return "built"


def test_l3_workers_on_more_than_one_machine_are_refused(tmp_path: Path) -> None:
    """The scheduler checks every worker's shard on its own node's disk, so L3 workers spread over
    machines (possible with cpkv_slab='private') are refused on every rank, naming cpkv_l3_dir."""
    from cpkv.runtime.launch import run_ranks

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    assert run_ranks(_l3_worker_on, WORLD, str(tmp_path / "one"), ["m0", "m0"], timeout_s=240) == ["built"] * WORLD
    split = run_ranks(_l3_worker_on, WORLD, str(tmp_path / "two"), ["m0", "m1"], timeout_s=240)
    assert all(r.startswith("refused: ") and "cpkv_l3_dir" in r and "2 machines" in r for r in split), split
    assert not any((tmp_path / "two").iterdir()), "a refused worker creates no shard"
