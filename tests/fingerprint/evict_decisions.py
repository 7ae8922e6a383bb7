"""A fingerprint of every policy's decisions, to hold a refactor of ``crates/evict`` against.

Replays each policy through ``PrefixTree`` the way ``cpkv.hitrate.replay`` does (match, lock, evict
just enough, insert, unlock) over the shared Mooncake traces and generated workloads at the hit-rate
grid's capacities, and records per run: the hit blocks, a hash of the eviction victims (node id and
pages, in order), a hash of what ghost follows after every request, a hash of the digest every 256
requests, the final digest, and the snapshot's length and SHA-256 (also checked to restore to the same
digest and bytes).

    .venv/bin/python tests/fingerprint/evict_decisions.py --out NEW.json
    .venv/bin/python tests/fingerprint/evict_decisions.py --check tests/fingerprint/evict_decisions.json

``--check`` compares run by run and exits 1 naming every run and field that differs. ``--policy`` may name
``ghost-exact``: ghost with its candidates as full-size replicas fed every request (``PrefixTree._ghost_sampled(1,
0, 0)``, for tests only), recorded under its own key. At or below the sampling floor (16,384 pages) its hits,
victims and what it follows equal sampled ghost's; its digests and snapshots differ, as they carry the sampling.
The baseline holds every policy and ``ghost-exact`` (``--policy`` the policies plus ``,ghost-exact``).
Not a pytest test (it takes minutes); run it by hand before landing a change to the tree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from cpkv import PrefixTree
from cpkv.hitrate import grid_capacities
from cpkv.traces import load_trace
from cpkv.workload import generate

TRACES = Path(os.environ.get("CPKV_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces"))
# (name, mix, seed, requests): the default workload, and the held-out seeds of docs/ghost.md (docqa's
# margins depend on the transplant and the seeded ghost lists).
GENERATED = [
    ("generated default seed 0", "default", 0, 4000),
    ("generated default seed 7", "default", 7, 8000),
    ("generated slow seed 7", "slow", 7, 8000),
    ("generated bursty seed 7", "bursty", 7, 3000),
    ("generated docqa seed 29", "docqa", 29, 8000),
]
DIGEST_EVERY = 256


def workloads() -> list[tuple[str, list[tuple[int, ...]]]]:
    out = []
    for name in ("synthetic_trace.jsonl", "conversation_trace.jsonl"):
        out.append((name, [tuple(r.hash_ids) for r in load_trace(TRACES / name)]))
    for name, mix, seed, n in GENERATED:
        out.append((name, [tuple(r.hash_ids) for r in generate(n, seed, mix)]))
    return out


def run(requests: list[tuple[int, ...]], capacity: int, policy: str) -> dict[str, object]:
    tree = PrefixTree._ghost_sampled(1, 0, 0) if policy == "ghost-exact" else PrefixTree(1, policy)
    victims, following, digests = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    hits = 0
    next_page = 0
    for i, blocks in enumerate(requests):
        m = tree.match(blocks)
        hits += m.length
        tree.lock(m.node)
        new = len(blocks) - m.length
        if new > capacity - tree.device_pages:
            for v in tree.evict(new - (capacity - tree.device_pages)):
                victims.update(np.int64(v.node).tobytes())
                victims.update(np.asarray(v.pages, dtype=np.int64).tobytes())
                victims.update(b"|")
        keep = m.length + min(new, capacity - tree.device_pages)
        fresh = np.arange(next_page, next_page + keep - m.length, dtype=np.int64)
        next_page += len(fresh)
        tree.insert(blocks[:keep], np.concatenate([m.device_pages, fresh]))
        tree.unlock(m.node)
        following.update(f"{tree.following}|".encode())
        if i % DIGEST_EVERY == 0:
            digests.update(tree.digest().to_bytes(8, "little"))
    snapshot = tree.snapshot()
    restored = PrefixTree.restore(snapshot)
    if restored.digest() != tree.digest() or restored.snapshot() != snapshot:
        raise SystemExit(f"{policy} at {capacity}: the snapshot does not restore to the same tree")
    return {
        "hits": hits,
        "victims": victims.hexdigest()[:16],
        "following": following.hexdigest()[:16],
        "digests": digests.hexdigest()[:16],
        "digest": f"{tree.digest():#018x}",
        "snapshot_bytes": len(snapshot),
        "snapshot_sha256": hashlib.sha256(snapshot).hexdigest()[:16],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the fingerprint here")
    parser.add_argument("--check", help="compare against this fingerprint; exit 1 on any difference")
    parser.add_argument("--policy", default=",".join(PrefixTree.POLICIES))
    args = parser.parse_args()
    policies = args.policy.split(",")
    runs: dict[str, dict[str, object]] = {}
    for name, requests in workloads():
        distinct = len({b for r in requests for b in r})
        for capacity in grid_capacities(distinct):
            for policy in policies:
                key = f"{name} | {capacity} | {policy}"
                runs[key] = run(requests, capacity, policy)
                print(key, runs[key], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    if args.check:
        expected = json.loads(Path(args.check).read_text())
        differ = 0
        for key, got in runs.items():
            want = expected.get(key)
            if want is None:
                print(f"NOT IN BASELINE: {key}")
                differ += 1
                continue
            fields = [f for f in got if got[f] != want.get(f)]
            if fields:
                differ += 1
                print(f"DIFFERS: {key}: " + ", ".join(f"{f} {want.get(f)} -> {got[f]}" for f in fields))
        print(f"{len(runs)} runs, {differ} differ")
        return 1 if differ else 0
    print(f"{len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
