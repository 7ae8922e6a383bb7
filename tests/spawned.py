"""Run one function per rank in real (spawned) processes and collect what each returns."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable


def _run_rank(target: Callable[..., Any], rank: int, args: tuple, out: mp.Queue) -> None:
    out.put((rank, target(rank, *args)))


def run_ranks(target: Callable[..., Any], ranks: int, *args: Any, timeout_s: float = 300) -> dict[int, Any]:
    """``{rank: target(rank, *args)}``, each call in its own spawned process; every process must
    exit cleanly. ``target`` must be a module-level function (spawn pickles it by name)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_run_rank, args=(target, r, args, out)) for r in range(ranks)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=timeout_s) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"a rank exited with {p.exitcode}"
    return results
