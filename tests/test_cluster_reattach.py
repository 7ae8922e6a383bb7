"""The main job's cluster tier re-attaches at a counted point, the same on every rank: two ranks (real
processes in a gloo group) share a tier whose master is frozen (SIGSTOP) and then thawed; while
unavailable each rank starts a probe at most every ``probe_every`` of the tier's agreed lookups (its
cadence counted in the replicated call sequence, never timed), and the lookup at which the tier is
available again is the same on both ranks, as is every answer before and after it."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from cluster_serve import Served
from cpkv.errors import InvalidArgumentError
from cpkv.runtime.launch import run_ranks
from cpkv.tier import SlabSpec

pytestmark = pytest.mark.slow

PAYLOADS = {"kv": SlabSpec((8, 16), torch.bfloat16)}
KEYS = [31000 + i for i in range(4)]
PROBE_EVERY = 4
# Lookups after the master is thawed within which the tier must be back (each waits a little).
MAX_LOOKUPS = 3000


def _rank(rank: int, world: int, master: str, metadata: str, master_pid: int) -> dict:
    import threading

    import numpy as np
    import torch.distributed as dist

    from cpkv.runtime.agree import all_reduce_min
    from cpkv.tier.cluster.tier import ClusterTier

    group = dist.new_group(list(range(world)), backend="gloo")

    def agree_min(values: list[int], what: str) -> list[int]:
        return all_reduce_min(values, group=group, rank=rank, step=what, timeout_s=120)

    tier = ClusterTier(master, metadata, slab=None, payloads=PAYLOADS, num_layers=1, page_size=16, rank=rank,
                       cp_size=world, model="reattach test", timeout_s=1.0, all_reduce_min=agree_min,
                       probe_every=PROBE_EVERY)
    if rank == 0:
        pages = np.random.default_rng(1).integers(0, 256, (len(KEYS), tier.page_bytes), dtype=np.uint8)

        def fill(rows: np.ndarray) -> None:
            rows[:, :tier.page_bytes] = pages

        assert tier.put_pages(KEYS, fill) == len(KEYS)
    agree_min([0], "pages put")  # rank 1 asks the store only once rank 0's put returned
    before = len(tier.find([KEYS])[0])
    if rank == 0:
        os.kill(master_pid, signal.SIGSTOP)  # alive but silent
    agree_min([0], "master frozen")
    answers: list[int] = []  # pages found at each lookup from the freeze on
    probes: list[int] = []  # probes this rank had started after each lookup
    reattached_at = None
    pause = threading.Event()  # a short wait per lookup, so the probe has time to finish
    for lookup in range(MAX_LOOKUPS):
        answers.append(len(tier.find([KEYS])[0]))
        probes.append(tier._probe.probes if tier._probe is not None else -1)
        if lookup == 2 and rank == 0:
            os.kill(master_pid, signal.SIGCONT)  # at a counted point, after this lookup's MIN
        if lookup >= 2 and tier.available:  # agreed: every rank leaves the loop at the same lookup
            reattached_at = lookup
            break
        pause.wait(0.005)
    after = len(tier.find([KEYS])[0])
    stats = tier.stats()
    tier.close()
    return {"before": before, "answers": answers, "probes": probes, "reattached_at": reattached_at,
            "after": after, "marks": stats["cluster_unavailable_marks"], "reattaches": stats["cluster_reattaches"]}


def test_the_tier_reattaches_at_the_same_counted_lookup_on_every_rank(served: Served) -> None:
    master_pid = served.children()["master"]
    try:
        ranks = run_ranks(_rank, 2, served.master, served.metadata, master_pid, timeout_s=300)
    finally:
        os.kill(master_pid, signal.SIGCONT)
    first, second = ranks
    assert first["reattached_at"] is not None, "the tier never re-attached"
    assert first["reattached_at"] == second["reattached_at"], ranks
    assert first["answers"] == second["answers"], "every rank the same answer at every lookup"
    assert first["before"] == first["after"] == len(KEYS), ranks
    assert first["answers"][0] == 0 and first["marks"] == second["marks"] == 1
    assert first["reattaches"] == second["reattaches"] == 1
    for result in ranks:
        # The cadence is counted in lookups: after the first probe (at once), a new one starts at most
        # every PROBE_EVERY lookups; the re-attach falls on a lookup at least one poll after a start.
        starts = [i for i, (was, now) in enumerate(zip([0, *result["probes"]], result["probes"])) if now > was]
        assert starts, result
        assert all(b - a >= PROBE_EVERY for a, b in zip(starts, starts[1:])), starts
        assert starts[-1] < result["reattached_at"]


def test_a_probe_cadence_that_is_not_a_count_is_refused(served: Served) -> None:
    from cpkv.tier.cluster.tier import ClusterTier

    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(InvalidArgumentError, match="probe_every"):
            ClusterTier(served.master, served.metadata, slab=None, payloads=PAYLOADS, num_layers=1, page_size=16,
                        rank=0, cp_size=1, model="reattach test", timeout_s=5.0,
                        all_reduce_min=lambda values, what: list(values), probe_every=bad)  # type: ignore[arg-type]
