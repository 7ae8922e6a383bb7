"""Starting cp real processes joined in a gloo group (tests and benchmarks).

Children come from a forkserver that imported torch once, so a launch costs
process creation, not cp torch imports. Every launch has a hard deadline:
processes still alive after it are killed and the launch fails.

Results come back through one pipe per rank, not a ``multiprocessing.Queue``:
a queue's lock is a named POSIX semaphore (/dev/shm/sem.*) that a SIGKILL of
the whole process group would leave behind; a pipe leaves nothing.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.forkserver
import multiprocessing.connection as mp_connection
import os
import signal
import socket
import threading
import time
import traceback
from typing import Any, Callable, Iterator

from cpkv.compose.segment import unlink_created_by
from cpkv.compose.timeouts import as_timedelta

_context: Any = None


def _ctx() -> Any:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(["torch", "torch.distributed", "cpkv.compose"])
    return _context


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchError(RuntimeError):
    """A rank raised, or the launch ran past its deadline."""


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 300.0,
    collective_timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
    expect_failures: bool = False,
) -> list[Any]:
    """Runs ``fn(rank, world_size, *args)`` in ``world_size`` processes; returns their results by rank.

    With ``expect_failures`` a rank that raises or dies yields its exception
    text (or ``None`` when it vanished) instead of failing the launch.
    """
    ctx = _ctx()
    port = free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (parent's reader, child's writer)
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(fn, rank, world_size, port, collective_timeout_s, env or {}, pipes[rank][1], args),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    readers = {reader: rank for rank, (reader, _) in enumerate(pipes)}
    results: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        # A Ctrl-C while a rank's start-up data is being written would leave that child unpickling
        # a truncated stream (and printing a traceback): SIGINT waits until every rank has started.
        # The forkserver starts first, outside the block, so neither it nor the ranks it forks
        # inherit the blocked mask.
        mp.forkserver.ensure_running()
        with _sigint_deferred():
            for p in procs:
                p.start()
        for _, writer in pipes:
            writer.close()  # the child holds its copy; a reader then sees EOF when its rank is gone
        while readers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for reader in mp_connection.wait(list(readers), timeout=min(remaining, 1.0)):
                rank = readers.pop(reader)  # type: ignore[call-overload]
                try:
                    _, ok, value = reader.recv()
                    results[rank] = (ok, value)
                except (EOFError, OSError):
                    pass  # the rank died before reporting
    except BaseException:
        # Interrupted (Ctrl-C) or failed here: ask every rank to stop; SIGTERM runs their cleanup.
        for p in procs:
            if p.is_alive():
                p.terminate()
        raise
    finally:
        for p in procs:
            if p.pid is None:
                continue  # never started
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for reader, writer in pipes:
            reader.close()
            writer.close()
        unlink_created_by([p.pid for p in procs if p.pid is not None])
    if expect_failures:
        return [results[r][1] if r in results else None for r in range(world_size)]
    missing = [r for r in range(world_size) if r not in results]
    failed = {r: v for r, (ok, v) in results.items() if not ok}
    if missing or failed:
        detail = "; ".join(f"rank {r}: {v}" for r, v in sorted(failed.items()))
        raise LaunchError(f"ranks {missing} gave no result within {timeout_s:g} s; {detail}".strip("; "))
    return [results[r][1] for r in range(world_size)]


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Blocks SIGINT in this thread for the block; a Ctrl-C in it is delivered right after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _rank_main(fn: Callable[..., Any], rank: int, world: int, port: int, timeout_s: float,
               env: dict[str, str], result_pipe: Any, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    from cpkv.compose.config import invalidate_config

    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # a stop runs the context managers' cleanup
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    invalidate_config()
    torch.set_num_threads(1)  # cp ranks share the cores; one thread each avoids oversubscription
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=as_timedelta(timeout_s))
        try:
            result = fn(rank, world, *args)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        result_pipe.send((rank, True, result))
    except BaseException as err:  # noqa: BLE001 -- reported to the parent, which decides
        result_pipe.send((rank, False, f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"))
    finally:
        result_pipe.close()
