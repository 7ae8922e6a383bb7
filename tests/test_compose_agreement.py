"""Plan agreement across real ranks: a divergent plan is a DivergenceError on every rank, and a rank
that saw an error inside the protocol refuses to carry on (GroupBrokenError) until closed."""

from __future__ import annotations

import glob

import pytest
import torch

from cpkv.compose import ComposePlan, ShmGroup, SlotSpans
from cpkv.compose.plan import plan_digest
from cpkv.compose.workload import uniform_batch
from cpkv.errors import CollectiveTimeoutError, DivergenceError, GroupBrokenError, InvalidArgumentError
from cpkv.runtime.launch import run_ranks

PAGE_SIZE = 16
ROW = (8,)

pytestmark = pytest.mark.slow


def _plans(cp: int, rank: int, how: str) -> list[ComposePlan]:
    """Three batches; in the second, rank 1 holds a plan that differs in one thing only."""
    batch = uniform_batch(cp, requests=2, prefix_pages=3, current_pages=2)
    plans = []
    for index in range(3):
        requests, num_slots = batch.requests, batch.num_slots
        if index == 1 and rank == 1:
            if how == "pages":  # same shape (slots, counts, owners), other pages
                requests = _shift_prefix_pages(batch.requests, cp)
            elif how == "num_slots":
                num_slots += 1
        plans.append(ComposePlan(cp, PAGE_SIZE, requests, num_slots))
    return plans


def _shift_prefix_pages(requests, cp):
    """The same spans on pages 50 * cp further on: every page keeps its owner, every slot, count and
    staging row stays, only the bytes read differ."""
    out = []
    for r in requests:
        prefix = [(slot, page + cp * 50, count) for slot, page, count in r.prefix]
        current = [(slot, page + cp * 50, count) for slot, page, count in r.current]
        out.append(SlotSpans(prefix, current))
    return tuple(out)


def _divergence_worker(rank: int, cp: int, how: str) -> dict:
    plans = _plans(cp, rank, how)
    outcome: dict = {"plan_digest": plans[1].digest_hex, "composed": 0}
    group = ShmGroup(timeout_s=10)
    try:
        group.register_pool("kv", 64, ROW, torch.uint8, 8)  # room for every rank's plans (same on every rank)
        for index, plan in enumerate(plans):
            current = torch.full((plan.num_current(rank), *ROW), 10 + rank, dtype=torch.uint8)
            try:
                for layer in range(3):
                    group.compose(plan, "kv", current, layer=layer)
                    outcome["composed"] += 1
            except (DivergenceError, GroupBrokenError) as err:
                outcome.setdefault("errors", []).append(f"{index}: {type(err).__name__}: {err}")
        outcome["agreements"] = group.stats.agreements
        outcome["broken"] = group.broken
        run_id = group.run_id
    finally:
        group.close()
    outcome["closed"] = group.closed
    outcome["left"] = glob.glob(f"/dev/shm/cpkv-{run_id}-*")
    return outcome


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["pages", "num_slots"])
def test_a_plan_that_differs_on_one_rank_is_a_divergence_error_on_every_rank(how):
    cp = 3
    results = run_ranks(_divergence_worker, cp, how, timeout_s=90, collective_timeout_s=10)
    digests = [r["plan_digest"] for r in results]
    assert digests[0] == digests[2] != digests[1]
    for rank, r in enumerate(results):
        errors = r["errors"]
        # batch 0 composed (3 layers, one agreement); batch 1 diverged at its first layer; batch 2 refused
        assert r["composed"] == 3 and r["agreements"] == 2, r
        assert len(errors) == 2, errors
        assert errors[0].startswith("1: DivergenceError: "), errors
        assert f"rank {rank}: layer 0:" in errors[0]
        assert f"ranks [0, 2] hold {digests[0]}" in errors[0] and f"ranks [1] hold {digests[1]}" in errors[0]
        assert errors[1].startswith("2: GroupBrokenError: ") and "DivergenceError" in errors[1]
        assert r["broken"].startswith("compose of layer 0: DivergenceError")
        assert r["closed"] and r["left"] == []


def _mid_protocol_worker(rank: int, cp: int) -> dict:
    batch = uniform_batch(cp, requests=2, prefix_pages=3, current_pages=2)
    plan = ComposePlan(cp, PAGE_SIZE, batch.requests, batch.num_slots)
    outcome: dict = {}
    with ShmGroup(timeout_s=3) as group:
        group.register_pool("kv", batch.pool_rows, ROW, torch.uint8, batch.max_current_pages)
        good = torch.zeros(plan.num_current(rank), *ROW, dtype=torch.uint8)
        group.compose(plan, "kv", good, layer=0)
        # Layer 1: rank 0 passes one current row too many (its own mistake, raised before the barrier);
        # its peers time out at that barrier.
        bad = torch.zeros(plan.num_current(rank) + 1, *ROW, dtype=torch.uint8) if rank == 0 else good
        try:
            group.compose(plan, "kv", bad, layer=1)
            outcome["layer 1"] = "no error"
        except (InvalidArgumentError, CollectiveTimeoutError) as err:
            outcome["layer 1"] = type(err).__name__
        # Every rank catches its error and tries to carry on: each must be refused, not shifted.
        for name, call in (("compose", lambda: group.compose(plan, "kv", good, layer=2)),
                           ("allreduce", lambda: group.compose_allreduce(plan, "kv", good, layer=2)),
                           ("barrier", lambda: group.barrier()),
                           ("register", lambda: group.register_pool("v", 4, ROW, torch.uint8, 1)),
                           ("pool", lambda: group.pool("kv"))):
            try:
                call()
                outcome[name] = "no error"
            except GroupBrokenError as err:
                outcome[name] = str(err)
        outcome["broken"] = group.broken
    outcome["closed"] = group.closed
    with pytest.raises(InvalidArgumentError, match="closed"):
        group.compose(plan, "kv", good, layer=3)
    return outcome


@pytest.mark.timeout(120)
def test_a_rank_that_hits_an_error_mid_protocol_leaves_the_group_broken():
    results = run_ranks(_mid_protocol_worker, 3, timeout_s=90, collective_timeout_s=3)
    assert results[0]["layer 1"] == "InvalidArgumentError"
    assert results[1]["layer 1"] == results[2]["layer 1"] == "CollectiveTimeoutError"
    for rank, r in enumerate(results):
        # the innermost step names the cause: rank 0's own check, the peers' barrier of layer 1 (which
        # gloo fails as soon as rank 0 leaves the protocol, or at the timeout: either is a barrier error)
        cause = ("compose of layer 1: InvalidArgumentError: rank 0: 3 current rows given" if rank == 0 else
                 f"compose barrier: CollectiveTimeoutError: rank {rank}: compose barrier of layer 1 ")
        assert r["broken"].startswith(cause), r["broken"]
        for name in ("compose", "allreduce", "barrier", "register", "pool"):
            assert r[name].startswith(f"rank {rank}: the group is broken by an earlier error ({cause}"), r
        assert r["closed"]  # close() of a broken group releases locally (no collective that could hang)


def test_plan_digest_covers_what_the_ranks_must_agree_on():
    batch = uniform_batch(2, requests=3, prefix_pages=4, current_pages=2)
    base = ComposePlan(2, PAGE_SIZE, batch.requests, batch.num_slots)
    same = ComposePlan(2, PAGE_SIZE, batch.requests, batch.num_slots, payload="v", device="cpu")
    assert base.digest == same.digest  # payload and device are not part of what ranks share
    assert 0 <= base.digest < 2**63 and len(base.digest_hex) == 16
    variants = [  # each differs from base in one thing
        ComposePlan(2, PAGE_SIZE, _shift_prefix_pages(batch.requests, 2), batch.num_slots),
        ComposePlan(2, PAGE_SIZE, batch.requests, batch.num_slots + 1),
        ComposePlan(2, PAGE_SIZE, batch.requests, batch.num_slots, pool_rows=batch.pool_rows),
        ComposePlan(2, PAGE_SIZE, batch.requests, batch.num_slots, pool_rows=batch.pool_rows + 1),
        ComposePlan(2, PAGE_SIZE * 2, batch.requests, batch.num_slots),
        ComposePlan(1, PAGE_SIZE, batch.requests, batch.num_slots),
        ComposePlan(2, PAGE_SIZE, batch.requests[::-1], batch.num_slots),
        ComposePlan(2, PAGE_SIZE, batch.requests[:-1], batch.num_slots),
    ]
    digests = {base.digest, *(v.digest for v in variants)}
    assert len(digests) == 1 + len(variants)
    # A prefix span split in two covers the same pages and slots, but is another description: it differs.
    r0 = batch.requests[0]
    (slot, page, count), *rest = r0.prefix
    split = SlotSpans([(slot, page, 1), (slot + 1, page + 1, count - 1), *rest], r0.current)
    assert ComposePlan(2, PAGE_SIZE, (split, *batch.requests[1:]), batch.num_slots).digest != base.digest
    # Fixed encoding: a pinned value catches an accidental change of the digest's definition.
    tiny = ComposePlan(2, 4, [SlotSpans([(0, 0, 2)], [(2, 2, 1)])], 4)
    assert plan_digest(tiny.key) == tiny.digest
    assert tiny.digest_hex == PINNED_TINY_DIGEST


PINNED_TINY_DIGEST = "58bc18c6602840ca"
