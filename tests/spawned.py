"""Run one function per rank in real (spawned) processes and collect what each returns."""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mp_connection
import time
from typing import Any, Callable


def _run_rank(target: Callable[..., Any], rank: int, args: tuple, out: Any) -> None:
    out.send(target(rank, *args))
    out.close()


def run_ranks(target: Callable[..., Any], ranks: int, *args: Any, timeout_s: float = 300) -> dict[int, Any]:
    """``{rank: target(rank, *args)}``, each call in its own spawned process; every process must
    exit cleanly. ``target`` must be a module-level function (spawn pickles it by name).

    One pipe per rank (a queue's lock would be a named semaphore in /dev/shm): a rank that dies
    closes its pipe, so its death fails the call at once, named, instead of after ``timeout_s``.
    """
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(ranks)]  # (our reader, the rank's writer)
    procs = [ctx.Process(target=_run_rank, args=(target, r, args, pipes[r][1]), daemon=True) for r in range(ranks)]
    results: dict[int, Any] = {}
    try:
        for p in procs:
            p.start()
        for _, writer in pipes:
            writer.close()
        pending = {reader: rank for rank, (reader, _) in enumerate(pipes)}
        deadline = time.monotonic() + timeout_s
        while pending:
            ready = mp_connection.wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"ranks {sorted(pending.values())} gave no result within {timeout_s:g} s")
            for reader in ready:
                rank = pending.pop(reader)  # type: ignore[call-overload]
                try:
                    results[rank] = reader.recv()  # type: ignore[union-attr]
                except EOFError:
                    procs[rank].join(timeout=10)
                    raise AssertionError(f"rank {rank} died before returning: exit code {procs[rank].exitcode}") from None
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0, f"a rank exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.kill()
                p.join(timeout=10)
        for reader, _ in pipes:
            reader.close()
    return results
