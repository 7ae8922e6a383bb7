"""Two processes, like two CP ranks, form the same batches from the same queue.

Each process gets a different hash seed and different per-rank wall-clock
ages (CP mode must ignore them); the batch digests must match. A single
perturbed prefix match on one rank must show up as a digest mismatch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

RANK_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, random, sys
    from dataclasses import replace
    from cpkv.scheduling import AffinityPolicy, BudgetConfig, Candidate, ScanState, form_batch

    rank, perturb, cp_mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "cp"
    rng = random.Random(20261202)         # the replicated event stream: same on every rank
    clock = random.Random(1000 + rank)    # per-rank wall clock: differs
    waves, rid = [], 0
    for _ in range(60):
        wave = []
        for _ in range(rng.randrange(0, 4)):
            matched = rng.choice([0, 0, 32, 128, 512, 4096, 4096 + 17])
            wave.append(Candidate(rid, device_hit=matched, host_hit=rng.choice([0, 64]),
                                  extend_tokens=rng.randrange(1, 6000), age_s=clock.uniform(0, 30)))
            rid += 1
        waves.append(wave)
    if perturb >= 0:  # one divergent input: one request's host hit differs on this rank
        flat = [c for w in waves for c in w]
        victim = flat[perturb]
        waves = [[replace(c, host_hit=c.host_hit + 64) if c is victim else c for c in w] for w in waves]

    policy = AffinityPolicy(floor_tokens=256, skip_window=3, defer_limit=2, cp_mode=cp_mode)
    budget = BudgetConfig(page_size=64, extend_cap=2048, cached_cap=20000, staging_pages=33, mixing=True)
    queue, state, carried, records = [], ScanState(), None, []
    for k in range(10000):
        if k < len(waves):
            queue.extend(waves[k])
        if not queue and carried is None:
            if k >= len(waves):
                break
            continue
        step = form_batch(queue, state, policy, budget, chunked=carried)
        records.append(step.record())
        taken = set(step.taken_from_queue)
        queue = [c for c in queue if c.request_id not in taken]
        state, carried = step.state, step.carried
    blob = json.dumps(records, sort_keys=True).encode()
    print(json.dumps({"digest": hashlib.sha256(blob).hexdigest(), "records": records}))
    """
)


def run_processes(*specs: tuple[int, int], mode: str = "cp") -> list[dict]:
    # Fresh interpreters, not cpkv.runtime.launch.run_ranks: its ranks fork from one interpreter and
    # share its hash seed, and these must each start with their own.
    procs = []
    for rank, perturb in specs:
        env = {**os.environ, "PYTHONHASHSEED": str(rank + 1)}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(rank), str(perturb), mode],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    return outs


def first_divergence(a: list, b: list) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_ranks_form_identical_batches_and_a_divergent_match_is_detected() -> None:
    rank0, rank1, bad = run_processes((0, -1), (1, -1), (1, 17))
    assert len(rank0["records"]) > 50  # a real workload: many passes
    steps = [s for r in rank0["records"] for s in r["steps"]]
    assert any(s[1] == "skip" for s in steps) and any(r["carried"] for r in rank0["records"])
    assert rank0["digest"] == rank1["digest"] and rank0["records"] == rank1["records"]
    assert bad["digest"] != rank0["digest"]
    assert first_divergence(rank0["records"], bad["records"]) is not None


def test_outside_cp_mode_per_rank_ages_would_split_the_ranks() -> None:
    # Why CP mode ignores age: the same queue with each rank's own clock diverges.
    rank0, rank1 = run_processes((0, -1), (1, -1), mode="single")
    assert rank0["digest"] != rank1["digest"]
    assert any(s[2] == "age bound" for r in rank0["records"] for s in r["steps"])
