"""The vLLM adapter's L3 directory: a cap beyond the free space is refused by name before anything
is created (on a small tmpfs); one engine per directory: an engine of another model is refused
while the first one's processes live, and takes the directory once they are gone (closed or
killed); and an I/O error at run time (a disk that fills, a worker's failed write) stops the tier
for every worker, while the engine serves on and every chunk already logged stays good."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LookupResult

from cpkv.errors import InvalidArgumentError
from cpkv.integrations.vllm.l3 import CATALOG_LOG, L3Catalog, L3Shard, l3_key
from cpkv.integrations.vllm.manager import CpkvOffloadingManager
from cpkv.tier.l3.directory import tree_bytes
from engine import Engine, cpkv_extra, prompt
from small_fs import fill_disk
from test_l3 import BLOCKS, assert_exact, keys_of, leading, serve
from test_l3_shards import CHUNK_TOKENS, HOST_CHUNKS, assert_loaded, geometry, promote_and_load, request, store, workers


def test_a_cap_beyond_the_free_space_is_refused_by_name_and_leaves_nothing(small_disk: Path) -> None:
    g = geometry(small_disk, cap=64 << 20)
    for open_side in (lambda: L3Shard(g, 0), lambda: L3Catalog(g)):
        with pytest.raises(InvalidArgumentError, match=r"^kv_connector_extra_config\['cpkv_l3_bytes'\] 67108864 is more"):
            open_side()
    assert not (small_disk / CATALOG_LOG).exists() and not list(small_disk.glob("shard-*"))
    assert tree_bytes(small_disk) == 0  # the lock files are empty
    statvfs = os.statvfs(small_disk)
    assert statvfs.f_bfree == statvfs.f_blocks


HOLDER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_l3_shards import geometry
from cpkv.integrations.vllm.l3 import L3Catalog, L3Shard
g = geometry(Path({directory!r}))
catalog, shard = L3Catalog(g), L3Shard(g, 0)
print("holding", flush=True)
sys.stdin.read()
"""


def test_an_engine_of_another_model_is_refused_while_the_first_lives_and_a_killed_one_blocks_nothing(
        tmp_path: Path) -> None:
    first = geometry(tmp_path)
    other = dataclasses.replace(first, model="another-model")
    catalog, shard = L3Catalog(first), L3Shard(first, 0)
    log = (tmp_path / CATALOG_LOG).read_bytes()
    for open_side in (lambda: L3Catalog(other), lambda: L3Shard(other, 1)):
        with pytest.raises(InvalidArgumentError, match=r"cpkv_l3_dir'\] .* is in use by another engine"):
            open_side()
    assert (tmp_path / CATALOG_LOG).read_bytes() == log, "the live engine's log is untouched"
    # The same engine's other processes join it (a second worker's shard).
    L3Shard(first, 1).close()
    shard.close()
    catalog.close()
    L3Catalog(other).close()  # closed: the directory is free
    # A holder killed with SIGKILL leaves a lock the kernel has released.
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(tests=str(Path(__file__).parent),
                                                                   directory=str(tmp_path))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(InvalidArgumentError, match="is in use by another engine"):
            L3Catalog(other)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    L3Catalog(other).close()


def l3_descriptors(directory: Path) -> list[str]:
    """This process's open descriptors on files under ``directory``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            out.append(target)
    return out


def test_a_disk_that_fills_mid_run_stops_the_tier_once_and_the_engine_serves_on(small_disk: Path,
                                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Another file takes the disk's last byte while the engine runs: the catalog's next log write
    fails (ENOSPC). The engine goes on (before: vLLM's update_from_output raised an OSError), the
    tier takes no more chunks (warned once, naming the directory and the error), the chunks logged
    before are still served exactly from disk, the stop leaves no partial file and no descriptor, and
    a restart recovers exactly the logged chunks, each checking good."""
    caplog.set_level(logging.WARNING, logger="cpkv")
    cap = 24576 + 13 * 16480 + 100  # 12 data slots and one reserved for the stop copy
    extra = cpkv_extra(cpkv_host_blocks=4, cpkv_l3_dir=str(small_disk), cpkv_l3_bytes=cap)
    eng = Engine(extra)
    keys: dict[int, list[bytes]] = {}

    def run(seed: int) -> None:
        keys[seed] = keys_of(eng.add(f"r{seed}", prompt(seed, blocks=BLOCKS)))
        eng.run()  # never raises: the disk's error is the tier's, not the engine's

    for seed in (1, 2, 3):
        run(seed)
    assert eng.manager.stats()["l3_committed"] > 0
    filler = fill_disk(small_disk)
    seed = 3
    while eng.manager.stats().get("l3_stopped") is None:  # the log's next block or compaction needs room
        seed += 1
        assert seed < 30, "the tier never met the full disk"
        run(seed)
    stopped = eng.manager.stats()
    # The log's first block holds 126 entries: its compaction (past 24) is the first write needing room.
    assert stopped["l3_stopped"] == "its log compaction failed: ENOSPC (No space left on device)", stopped
    assert stopped["l3_pending_batches"] == 0 and not list(small_disk.glob("*.tmp")), stopped
    for more in range(seed + 1, seed + 4):
        run(more)
    after = eng.manager.stats()
    assert after["l3_spilled"] == stopped["l3_spilled"] and after["l3_committed"] == stopped["l3_committed"], after
    assert after["l3_not_spilled"] > stopped["l3_not_spilled"], after
    warned = [r.getMessage() for r in caplog.records if "takes no more chunks" in r.getMessage()]
    assert warned == [f"cpkv L3 in {small_disk} takes no more chunks: {after['l3_stopped']}"]

    catalog = eng.manager.l3
    logged = {k for k, _, _ in catalog.index.entries()}
    best = max(keys, key=lambda s: leading(keys[s], logged))
    expected = leading(keys[best], logged)
    assert expected >= 1, "a chunk logged before the stop is still in the index"
    eng.reset_device()  # only the tiers below vLLM's device cache hold it: the host no more, L3 yes
    tokens = prompt(best, blocks=BLOCKS)
    hits, blocks = serve(eng, "again", tokens)
    assert hits == expected and eng.manager.stats()["l3_promoted"] == expected
    assert_exact(eng, tokens, blocks, hits)
    eng.close()  # the workers' stop copies do not fit the full disk: nothing taken in, nothing left
    assert {k for k, _, _ in catalog.index.entries()} == logged
    assert not list(small_disk.rglob("stop.bin")) and not list(small_disk.rglob("*.tmp"))
    assert l3_descriptors(small_disk) == []

    filler.unlink()
    eng = Engine(dict(extra, cpkv_host_blocks=16))
    assert eng.manager.stats()["l3_recovered"] == len(logged)
    served = 0
    for seed in [s for s in keys if leading(keys[s], logged)]:
        tokens = prompt(seed, blocks=BLOCKS)
        hits, blocks = serve(eng, f"restart-{seed}", tokens)
        assert hits == leading(keys[seed], logged)
        assert_exact(eng, tokens, blocks, hits)
        served += hits
    stats = eng.manager.stats()
    assert served > 0 and stats["l3_verified"] == served and stats["l3_corrupt_dropped"] == 0, stats
    eng.close()


def test_a_workers_failed_write_stops_the_tier_for_every_worker_and_logs_none_of_its_records(tmp_path: Path) -> None:
    """Rank 1's write of its shard fails (its data file's descriptor refuses writes: EBADF, as any
    I/O error would) while rank 0's succeeds. vLLM asserts a worker's job succeeded, so the job goes
    on (before: the worker raised out of vLLM's connector); rank 1 writes nothing more and says so on
    disk before the job completes, so the catalog logs none of that job's chunks and places none
    again for any worker. The chunks logged before are still served to both workers, exactly; a
    restart recovers only them."""
    m = CpkvOffloadingManager(HOST_CHUNKS, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, kv = workers(tmp_path, seed=11)
    a_ctx, a = request("a", [1, 2])
    store(m, ws, a_ctx, a, [3, 4, 5, 6], job=1)
    b_ctx, b = request("b", [7, 8])
    store(m, ws, b_ctx, b, [9, 10, 11, 12], job=2)  # evicts "a": logged
    assert m.stats()["l3_committed"] == 2
    shard = ws[1].l3
    assert shard is not None
    read_only = os.open(geometry(tmp_path).data_files(1).path(0), os.O_RDONLY)
    os.dup2(read_only, shard._fds[0])
    os.close(read_only)
    c_ctx, c = request("c", [4, 5])
    store(m, ws, c_ctx, c, [13, 14, 15, 0], job=3)  # evicts "b": rank 1's write fails
    stats = m.stats()
    assert "EBADF" in str(shard.stats()["l3_stopped"]) and ws[0].l3 is not None and ws[0].l3.stopped is None
    assert stats["l3_stopped"] == "worker rank 1 stopped writing its shard (its log names the error)", stats
    assert stats["l3_committed"] == 2 and stats["l3_pending_batches"] == 0, stats
    assert [m.lookup(k, b_ctx) for k in b] == [LookupResult.MISS] * 2, "b's records are not logged: not on disk"
    written = [w.l3.counters["pages_written"] if w.l3 else None for w in ws]
    d_ctx, d = request("d", [9, 6])
    out = m.prepare_store(d, d_ctx)  # evicts "c": placed for no worker
    assert out is not None and out.evicted_keys == c and out.store_spec.spills == []
    store_job = 4
    for w in ws:
        w.submit_store(store_job, GPULoadStoreSpec([1, 2, 7, 8], [4], [0]), out.store_spec)
    m.complete_store(d, d_ctx)
    assert [w.l3.counters["pages_written"] if w.l3 else None for w in ws] == written
    assert m.stats()["l3_not_spilled"] == 2

    original = [[t.clone() for t in tensors] for tensors in kv]
    promote_and_load(m, ws, "e", [1, 2], 5, [0, 1, 2, 7])  # logged before the failure: both shards serve it
    assert_loaded(kv, original, [0, 1, 2, 7], [3, 4, 5, 6])
    for w in ws:
        w.shutdown()
    m.shutdown()
    assert not list(tmp_path.rglob("stop.bin")) and m.stats()["l3_stop_spilled"] == 0

    m = CpkvOffloadingManager(8, "lru", tokens_per_chunk=(CHUNK_TOKENS,), l3=L3Catalog(geometry(tmp_path)))
    ws, _ = workers(tmp_path, seed=12)
    assert m.stats()["l3_recovered"] == 2 and m.l3 is not None
    assert {k for k, _, _ in m.l3.index.entries()} == {l3_key(k) for k in a}
    assert all(geometry(tmp_path).writing(r).exists() for r in range(2)), "a new life writes again"
    m.shutdown()
    for w in ws:
        w.shutdown()
