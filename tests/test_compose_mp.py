"""The compose path across real processes: cp ranks in a gloo group sharing pools through /dev/shm."""

from __future__ import annotations

import glob
import hashlib
import os
import time

import numpy as np
import pytest
import torch

from compose_reference import DTYPES, as_bytes, last_pages, random_rows, reference_dense, tail_not_aligned
from cpkv.compose import ComposePlan, ShmGroup
from cpkv.compose.workload import random_batch, uniform_batch
from cpkv.errors import CollectiveTimeoutError, FallbackError, InvalidArgumentError
from cpkv.runtime.launch import run_ranks

PAGE_SIZE = 16
PAGE_SHAPE = (PAGE_SIZE, 4)
BATCHES, LAYERS = 4, 3

pytestmark = pytest.mark.slow


def _inputs(seed: int, cp: int, batch_index: int, layer: int, plan: ComposePlan, pool_rows: int, dtype: str):
    """Every rank's pool and current rows, regenerated identically in every process."""
    gen = torch.Generator().manual_seed(seed * 1000 + batch_index)
    pools = [random_rows(gen, pool_rows, PAGE_SHAPE, DTYPES[dtype]) for _ in range(cp)]
    gen.manual_seed(seed * 1000 + batch_index * 10 + layer + 1)
    current = [random_rows(gen, plan.num_current(r), PAGE_SHAPE, DTYPES[dtype]) for r in range(cp)]
    tails = last_pages(plan, PAGE_SIZE, np.random.default_rng(batch_index))
    for r in range(cp):
        tail_not_aligned(current[r], plan, r, tails)
    return pools, current


def _byte_exact_worker(rank: int, cp: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)  # same seed on every rank: the same batches everywhere
    batches = [random_batch(rng, cp, max_requests=16, max_prefix_pages=60) for _ in range(BATCHES)]
    pool_rows = max(b.pool_rows for b in batches)
    max_current = max(b.max_current_pages for b in batches)
    digests, checks = [], 0
    group = ShmGroup(timeout_s=60)
    lenient = ShmGroup(timeout_s=60, allow_allreduce_fallback=True)
    with group, lenient:
        names = {dtype: group.register_pool(dtype, pool_rows, PAGE_SHAPE, DTYPES[dtype], max_current)
                 for dtype in DTYPES}
        group.register_pool("tiny", pool_rows, PAGE_SHAPE, torch.bfloat16, 0)  # stagings hold no current page
        small = lenient.register_pool("small", pool_rows, PAGE_SHAPE, torch.bfloat16, 0)
        for batch_index, batch in enumerate(batches):
            plan = ComposePlan(cp, PAGE_SIZE, batch.requests, batch.num_slots, pool_rows=pool_rows)
            for dtype, pool in names.items():
                keyed = group.plan(dtype, PAGE_SIZE, batch.requests, batch.num_slots)  # a cache miss per payload
                assert group.plan(dtype, PAGE_SIZE, batch.requests, batch.num_slots) is keyed
                assert keyed.key.payload == dtype and keyed.key.pool_rows == pool_rows
                pools, _ = _inputs(seed, cp, batch_index, 0, plan, pool_rows, dtype)
                group.barrier("pool fill")  # nobody still reads the previous batch's pools
                pool.copy_(pools[rank])
                group.barrier("pool fill")
                for layer in range(LAYERS):
                    _, current = _inputs(seed, cp, batch_index, layer, plan, pool_rows, dtype)
                    want = reference_dense(plan, pools, current)
                    staged = group.compose(keyed, dtype, current[rank], layer=layer)
                    dense = group.compose_allreduce(plan, dtype, current[rank], layer=layer)
                    assert staged.dtype == DTYPES[dtype] and staged.shape == (batch.num_slots, *PAGE_SHAPE)
                    assert torch.equal(as_bytes(staged), want), (batch_index, dtype, layer)
                    assert torch.equal(as_bytes(dense), want), (batch_index, dtype, layer)
                    digests.append(hashlib.sha256(as_bytes(staged).numpy().tobytes()).hexdigest())
                    checks += 1
            # A batch the staging cannot hold: an error by default, the explicit all-reduce when allowed.
            pools, current = _inputs(seed, cp, batch_index, 0, plan, pool_rows, "bf16")
            with pytest.raises(FallbackError):
                group.compose(plan, "tiny", current[rank])
            lenient.barrier("pool fill")
            small.copy_(pools[rank])
            lenient.barrier("pool fill")
            if batch_index == 0:  # the first fallback warns (then rate-limited)
                with pytest.warns(UserWarning, match="composing by all-reduce"):
                    dense = lenient.compose(plan, "small", current[rank])
            else:
                dense = lenient.compose(plan, "small", current[rank])
            assert torch.equal(as_bytes(dense), reference_dense(plan, pools, current))
        assert (group.plans.misses, group.plans.hits) == (BATCHES * len(DTYPES), BATCHES * len(DTYPES))
        stats = (group.stats.barriers, group.stats.collectives, lenient.stats.fallbacks, group.stats.agreements)
        with pytest.raises(InvalidArgumentError, match="payload 'bf16', not 'fp8'"):
            group.compose(group.plan("bf16", PAGE_SIZE, batch.requests, batch.num_slots), "fp8", current[rank])
        assert "payload 'bf16', not 'fp8'" in group.broken  # an error inside the protocol breaks the group
    assert group.closed and lenient.closed
    run_ids = (group.run_id, lenient.run_id)
    return {"digests": digests, "checks": checks, "stats": stats, "run_ids": run_ids}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cp", [8, 3])
def test_shm_group_byte_exact_across_real_ranks(cp):
    results = run_ranks(_byte_exact_worker, cp, 7 + cp, timeout_s=240, env={"CPKV_DEBUG_COMPOSE": "1"})
    assert all(r["checks"] == BATCHES * LAYERS * len(DTYPES) for r in results)
    # Every rank composed the same bytes (the dense buffer is replicated by construction).
    assert len({tuple(r["digests"]) for r in results}) == 1
    barriers, collectives, fallbacks, agreements = results[0]["stats"]
    composes = BATCHES * LAYERS * len(DTYPES)
    # one barrier per staged compose, two per pool fill and one per registration (read before close)
    assert barriers == composes + 2 * BATCHES * len(DTYPES) + (len(DTYPES) + 1)
    # the all-reduce baseline per compose, and a plan agreement at each return to layer 0 with a plan
    # (per payload here, since this test runs every layer of one payload before the next; and "tiny")
    assert agreements == BATCHES * (len(DTYPES) + 1)
    assert collectives == composes + agreements and fallbacks == BATCHES
    for run_id in results[0]["run_ids"]:
        assert glob.glob(f"/dev/shm/cpkv-{run_id}-*") == []  # every segment unlinked


def _failing_worker(rank: int, cp: int, victim: int, how: str, flags: str) -> str:
    batch = uniform_batch(cp, requests=2, prefix_pages=5, current_pages=3)
    plan = ComposePlan(cp, PAGE_SIZE, batch.requests, batch.num_slots)
    group = ShmGroup(timeout_s=2)
    try:
        group.register_pool("kv", batch.pool_rows, (64,), torch.uint8, batch.max_current_pages)
        current = torch.zeros(plan.num_current(rank), 64, dtype=torch.uint8)
        group.compose(plan, "kv", current, layer=0)
        if rank == victim:
            if how.startswith("kill"):
                os._exit(3)
            # Stalls until every other rank has timed out (each leaves a flag file), however long
            # a loaded machine takes: a fixed sleep raced the others' 2 s timeout.
            deadline = time.monotonic() + 60
            while len(glob.glob(os.path.join(flags, "timed-out-*"))) < cp - 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            group.abort()
            return "stalled"
        if how.endswith("allreduce"):
            group.compose_allreduce(plan, "kv", current, layer=1)
        else:
            group.compose(plan, "kv", current, layer=1)
        return "no error"
    except CollectiveTimeoutError as err:
        open(os.path.join(flags, f"timed-out-{rank}"), "w").close()
        group.abort()  # error path: unlink every segment of the group
        return f"timeout: {err} | run {group.run_id}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim, how", [(2, "kill"), (0, "stall"), (1, "kill-allreduce")])
def test_dead_or_stalled_rank_is_a_timeout_error_not_a_hang(victim, how, tmp_path):
    start = time.monotonic()
    results = run_ranks(_failing_worker, 3, victim, how, str(tmp_path), timeout_s=60, collective_timeout_s=2,
                        expect_failures=True)
    assert time.monotonic() - start < 60
    for rank, result in enumerate(results):
        if rank == victim:
            assert result == ("stalled" if how == "stall" else None)
            continue
        what = "all-reduce" if how.endswith("allreduce") else "compose barrier"
        assert result.startswith(f"timeout: rank {rank}: {what} of layer 1"), result
        run_id = result.rsplit("run ", 1)[1]
        assert glob.glob(f"/dev/shm/cpkv-{run_id}-*") == []


def _setup_worker(rank: int, cp: int) -> dict:
    """Registration is collective and checked uniformly: a refused registration leaves the group usable."""
    outcome: dict = {}
    with ShmGroup(timeout_s=10) as group:
        try:  # rank-dependent pool sizes: every rank must refuse, none may hang
            group.register_pool("kv", 4 + rank, (8,), torch.uint8, 2)
        except InvalidArgumentError as err:
            outcome["mismatch"] = str(err)
        pool = group.register_pool("kv", 8, (8,), torch.uint8, 4)
        try:
            group.register_pool("kv", 8, (8,), torch.uint8, 4)
        except InvalidArgumentError as err:
            outcome["twice"] = str(err)
        pool.copy_(torch.arange(64, dtype=torch.uint8).view(8, 8) + 64 * rank)
        group.barrier("pool fill")
        batch = uniform_batch(cp, requests=2, prefix_pages=3, current_pages=2)
        plan = ComposePlan(cp, PAGE_SIZE, batch.requests, batch.num_slots)
        current = torch.full((plan.num_current(rank), 8), 200 + rank, dtype=torch.uint8)
        outcome["digest"] = hashlib.sha256(as_bytes(group.compose(plan, "kv", current)).numpy().tobytes()).hexdigest()
        outcome["broken"] = group.broken
    return outcome


@pytest.mark.timeout(120)
def test_registration_is_uniform_and_a_refusal_keeps_the_group_usable():
    results = run_ranks(_setup_worker, 2, timeout_s=60, collective_timeout_s=10)
    for r in results:
        assert "ranks registered different pools" in r["mismatch"]
        assert "already registered" in r["twice"]
        assert r["broken"] is None
    assert results[0]["digest"] == results[1]["digest"]  # same plan: same bytes on both ranks


def _unclosed_worker(rank: int, cp: int) -> str:
    group = ShmGroup(timeout_s=10)
    group.register_pool("kv", 4, (8,), torch.uint8, 1)
    group.barrier()
    return group.run_id  # exits without close(): the exit hook still unlinks this rank's segment


@pytest.mark.timeout(120)
def test_segments_are_unlinked_when_a_rank_exits_without_closing():
    run_id = run_ranks(_unclosed_worker, 2, timeout_s=60)[0]
    assert glob.glob(f"/dev/shm/cpkv-{run_id}-*") == []


def _oversized_worker(rank: int, cp: int) -> dict:
    st = os.statvfs("/dev/shm")
    too_many_rows = (st.f_blocks * st.f_frsize) // 4096 + 1  # more than the whole of /dev/shm
    with ShmGroup(timeout_s=10) as group:
        try:
            group.register_pool("kv", too_many_rows, (4096,), torch.uint8, 1)
            outcome = {"error": None}
        except InvalidArgumentError as err:
            outcome = {"error": str(err)}
        # Refused alike on every rank, nothing changed: the group still registers and composes.
        batch = uniform_batch(cp, requests=1, prefix_pages=2, current_pages=1)
        plan = ComposePlan(cp, PAGE_SIZE, batch.requests, batch.num_slots)
        group.register_pool("small", batch.pool_rows, (8,), torch.uint8, batch.max_current_pages)
        group.compose(plan, "small", torch.zeros(plan.num_current(rank), 8, dtype=torch.uint8))
        outcome["run_id"] = group.run_id
    return outcome


@pytest.mark.timeout(120)
def test_an_undersized_dev_shm_fails_at_registration_on_every_rank_leaving_nothing():
    results = run_ranks(_oversized_worker, 2, timeout_s=60, collective_timeout_s=10)
    for r in results:
        assert r["error"] is not None and "cannot reserve" in r["error"], r
        assert "/dev/shm has" in r["error"] and "bytes free" in r["error"], r
        assert glob.glob(f"/dev/shm/cpkv-{r['run_id']}-*") == []
