"""Restart-warm hits of cpkv's L3 under vLLM (the README's table), through the same real Scheduler
and worker-side OffloadingConnector as the tests: P distinct prompts of 5 blocks on a small host,
then a second engine on the same directory replays them. Prints the hits of each run, what the
first spilled (on eviction, and at its clean stop, with the stop's time) and what the second
recovered and promoted from disk; ``--no-l3`` for the baseline, ``--no-stop`` to end the first run
without its clean stop (the disk as a kill -9 after its last acknowledged spill leaves it).

    .venv-vllm/bin/python tests_vllm/restart_hits.py --prompts 20 --host-blocks 8
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import BLOCK_TOKENS, Engine, cpkv_extra, prompt  # noqa: E402

BLOCKS = 5
CHECK_TIMEOUT_S = 60.0


def one_life(extra: dict[str, Any], prompts: int, tag: str, stop: bool = True) -> tuple[int, dict[str, Any]]:
    eng = Engine(extra)
    hits = 0
    for i in range(prompts):
        req_id = f"{tag}{i}"
        eng.add(req_id, prompt(i, blocks=BLOCKS))
        for _ in range(100):
            if req_id in eng.step().num_scheduled_tokens:
                break
            l3 = getattr(eng.manager, "l3", None)
            if l3 is not None and not l3.wait_idle(CHECK_TIMEOUT_S):
                raise SystemExit("an L3 record check did not finish")
        hits += eng.started_at[req_id] // BLOCK_TOKENS
        eng.run()
    if not stop:
        return hits, eng.manager.stats()
    started = time.perf_counter()
    eng.close()
    stats = eng.manager.stats()
    stats["stop_s"] = time.perf_counter() - started
    return hits, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--host-blocks", type=int, default=8)
    parser.add_argument("--no-l3", action="store_true")
    parser.add_argument("--no-stop", action="store_true", help="end the first run without its clean stop")
    args = parser.parse_args()
    if args.prompts < 1 or args.host_blocks < 1:
        parser.error("--prompts and --host-blocks must be >= 1")
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as directory:
        l3 = {} if args.no_l3 else {"cpkv_l3_dir": directory, "cpkv_l3_bytes": 1 << 28}
        extra = cpkv_extra(cpkv_host_blocks=args.host_blocks, **l3)
        first, s1 = one_life(extra, args.prompts, "a", stop=not args.no_stop)
        second, s2 = one_life(extra, args.prompts, "b")
    total = args.prompts * BLOCKS
    print(f"{args.prompts} prompts x {BLOCKS} blocks, host {args.host_blocks} blocks, L3 {'off' if args.no_l3 else 'on'}")
    at_stop = s1.get("l3_stop_spilled", 0)
    print(f"first run:  hits {first}/{total}, evicted {s1['evicted']}, spilled to L3 "
          f"{s1.get('l3_spilled', 0) - at_stop} on eviction + {at_stop} at the clean stop"
          + (" (no clean stop)" if args.no_stop else f" ({1e3 * s1['stop_s']:.0f} ms)"))
    print(f"restart:    hits {second}/{total}, recovered {s2.get('l3_recovered', 0)}, "
          f"promoted from L3 {s2.get('l3_promoted', 0)}, corrupt dropped {s2.get('l3_corrupt_dropped', 0)}")


if __name__ == "__main__":
    main()
