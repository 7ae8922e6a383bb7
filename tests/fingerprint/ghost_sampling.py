"""Ghost's sampled candidates against the exact replicas and the classic policies, on every workload of the
hit-rate record (docs/ghost.md, "Sampled candidates").

    .venv/bin/python tests/fingerprint/ghost_sampling.py OUT.txt [TREE,...]

Writes each workload out as a Mooncake trace, replays it at the grid's 12 capacities through
``crates/evict/examples/sampled_grid`` (built first with ``cargo build --release -p cpkv-evict --example
sampled_grid``; ``CARGO_TARGET_DIR`` is honoured) under the classic policies, ``exact`` (ghost's replicas fed
every request, reachable from tests only) and each TREE (``ghost`` as it ships, or ``ghost:SHIFT:FLOOR``), and
prints per workload and tree: the worst and median hit-ratio difference from exact ghost, the points more than
0.001 below the best classic policy where exact ghost is not, and the share of requests where the sampled
tree follows what the exact one follows. A measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TRACES = Path(os.environ.get("CPKV_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces"))
CLASSIC = ("lru", "lfu", "fifo", "slru", "arc", "s3fifo")
# (name, mix, seed, requests): the grid's record (docs/ghost.md's ablation), then the held-out seeds and the
# default workload of `bench vllm`.
GENERATED = [
    ("slow 1", "slow", 1, 20000),
    ("bursty 2", "bursty", 2, 20000),
    ("docqa 3", "docqa", 3, 8000),
    ("docqa 13", "docqa", 13, 8000),
    ("slow 7 (held out)", "slow", 7, 8000),
    ("bursty 7 (held out)", "bursty", 7, 3000),
    ("docqa 29 (held out)", "docqa", 29, 8000),
    ("default 7 (held out)", "default", 7, 8000),
    ("default 0", "default", 0, 4000),
]


def example() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", Path(__file__).resolve().parents[2] / "target"))
    return target / "release" / "examples" / "sampled_grid"


def workloads(directory: Path) -> list[tuple[str, Path]]:
    from cpkv.workload import generate

    out = [("synthetic", TRACES / "synthetic_trace.jsonl"), ("conversation", TRACES / "conversation_trace.jsonl")]
    for name, mix, seed, n in GENERATED:
        path = directory / f"{mix}_{seed}_{n}.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    {
                        "timestamp": r.timestamp_ms,
                        "input_length": r.input_length,
                        "output_length": r.output_length,
                        "hash_ids": list(r.hash_ids),
                    }
                )
                + "\n"
                for r in generate(n, seed, mix)
            )
        )
        out.append((name, path))
    return out


def measure(path: Path, trees: list[str]) -> dict[int, dict[str, tuple[float, str, int]]]:
    from cpkv.hitrate import grid_capacities
    from cpkv.traces import load_trace

    distinct = len({b for r in load_trace(path) for b in r.hash_ids})
    capacities = ",".join(str(c) for c in grid_capacities(distinct))
    run = subprocess.run(
        [str(example()), str(path), capacities, ",".join([*CLASSIC, "exact", *trees])],
        check=True,
        capture_output=True,
        text=True,
    )
    rows: dict[int, dict[str, tuple[float, str, int]]] = {}
    for line in run.stdout.splitlines():
        capacity, tree, hits, total, agree, switches = line.split()
        rows.setdefault(int(capacity), {})[tree] = (int(hits) / max(1, int(total)), agree, int(switches))
    return rows


def summary(rows: dict[int, dict[str, tuple[float, str, int]]], tree: str) -> str:
    diffs = [r[tree][0] - r["exact"][0] for r in rows.values()]
    misses = []
    for capacity, r in rows.items():
        best = max(r[p][0] for p in CLASSIC)
        if r[tree][0] < best - 0.001 and r["exact"][0] >= best - 0.001:
            misses.append(f"{capacity} ({r[tree][0] - best:+.4f})")
    agree = [float(r[tree][1]) for r in rows.values() if r[tree][1] != "-"]
    switches = sum(r[tree][2] for r in rows.values())
    exact_switches = sum(r["exact"][2] for r in rows.values())
    return (
        f"worst {min(diffs):+.4f} median {statistics.median(diffs):+.4f} | "
        f"agreement median {statistics.median(agree) if agree else float('nan'):.3f} "
        f"min {min(agree) if agree else float('nan'):.3f} | switches {switches} (exact {exact_switches}) | "
        f"new misses: {', '.join(misses) or 'none'}"
    )


def main() -> int:
    out = Path(sys.argv[1])
    trees = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ghost"]
    with tempfile.TemporaryDirectory() as directory, out.open("w") as report:
        for name, path in workloads(Path(directory)):
            rows = measure(path, trees)
            report.write(f"## {name}\n")
            for capacity, r in rows.items():
                cells = " ".join(
                    f"{t}={v[0]:.4f}" + ("" if v[1] == "-" else f"/{v[1]}/{v[2]}") for t, v in r.items()
                )
                report.write(f"{capacity} {cells}\n")
            for tree in trees:
                line = f"{name} | {tree} | {summary(rows, tree)}"
                report.write(line + "\n")
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
