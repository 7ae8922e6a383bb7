"""Starting cp real processes joined in a gloo group (tests, benchmarks, ``cpkv replay``).

Children come from a forkserver that imported torch once, so a launch costs
process creation, not cp torch imports. Every launch has a hard deadline:
processes still alive after it are killed and the launch fails.

Results come back through one pipe per rank, not a ``multiprocessing.Queue``:
a queue's lock is a named POSIX semaphore (/dev/shm/sem.*) that a SIGKILL of
the whole process group would leave behind; a pipe leaves nothing.

Ranks die with their launcher, quietly. A parent-death signal (``PR_SET_PDEATHSIG``)
cannot do it here: a rank's parent is the forkserver, which lives as long as any rank
holds its alive fd, so it outlives a killed launcher. Instead each rank holds the
read end of a lifeline pipe whose only write end is the launcher's; the kernel closes
it however the launcher ends (SIGKILL included), and a thread in the rank, blocked on
it, then removes the names the rank still owns in /dev/shm and exits at once, with
nothing printed. It runs beside a main thread stuck in a collective, and works on any
platform with pipes.

An interrupted launch (Ctrl-C) ends its ranks silently: all are frozen, then killed, so
none can log a peer's end first.

A rank that dies is named as such ("rank 2 died: killed by SIGKILL") as soon as its
pipe closes; its peers get a short grace to report their own errors, then are stopped.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import multiprocessing.forkserver
import os
import signal
import socket
import threading
import time
import traceback
from typing import Any, Callable, Iterator, cast

from cpkv.runtime.shm import unlink_created_by, unlink_owned_and_stop
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, as_timedelta

_context: Any = None
_preload = ["torch", "torch.distributed", "cpkv"]


def _ctx() -> Any:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(list(_preload))
    return _context


def preload(*modules: str) -> None:
    """Modules the forkserver imports once, for every later launch of this process (an engine's
    test harness: SGLang's imports take tens of seconds per process otherwise). Takes effect only
    before the forkserver starts, at this process's first launch."""
    for module in modules:
        if module not in _preload:
            _preload.append(module)
    if _context is not None:
        _context.set_forkserver_preload(list(_preload))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchError(RuntimeError):
    """A rank raised or died, or the launch ran past its deadline."""


def death_text(rank: int, exitcode: int | None) -> str:
    """What a rank's end without a result was: ``rank 2 died: killed by SIGKILL``."""
    if exitcode is None:
        return f"rank {rank} died: still running after its result pipe closed (killed)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"rank {rank} died: killed by {name}"
    return f"rank {rank} died: exited with status {exitcode} before reporting a result"


def _grace_s(collective_timeout_s: float) -> float:
    """How long the peers of a dead rank get to report their own errors: a peer blocked on the
    dead rank's socket fails at once; one waiting on a timeout gets it, up to 10 s, then is stopped."""
    return min(collective_timeout_s, 10.0) + 2.0


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 300.0,
    collective_timeout_s: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
    expect_failures: bool = False,
    deaths_as_text: bool = False,
) -> list[Any]:
    """Runs ``fn(rank, world_size, *args)`` in ``world_size`` processes; returns their results by rank.

    With ``expect_failures`` a rank that raises or dies yields its exception
    text (or, when it died, ``None``, or with ``deaths_as_text`` :func:`death_text`)
    instead of failing the launch. Once a rank has died, the others get a short
    grace (:func:`_grace_s`) to report, then are stopped.
    """
    ctx = _ctx()
    port = free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (parent's reader, child's writer)
    lifeline, lifeline_end = ctx.Pipe(duplex=False)  # the ranks read; only this process may write
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(fn, rank, world_size, port, collective_timeout_s, env or {}, pipes[rank][1], lifeline, args),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    readers = {reader: rank for rank, (reader, _) in enumerate(pipes)}
    results: dict[int, tuple[bool, Any]] = {}
    deaths: dict[int, str] = {}
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
        lifeline.close()
        while readers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for ready in mp_connection.wait(list(readers), timeout=min(remaining, 1.0)):
                reader = cast(mp_connection.Connection, ready)  # wait() returns what it was given
                rank = readers.pop(reader)
                try:
                    _, ok, value = reader.recv()
                    results[rank] = (ok, value)
                except (EOFError, OSError):  # the rank died before reporting: say how
                    procs[rank].join(timeout=5)
                    deaths[rank] = death_text(rank, procs[rank].exitcode)
                    deadline = min(deadline, time.monotonic() + _grace_s(collective_timeout_s))
    except BaseException:
        _end_silently(procs)  # interrupted (Ctrl-C) or failed here: the ranks' outcome no longer matters
        raise
    finally:
        started = [p for p in procs if p.pid is not None]  # the others never started
        for p in started:
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        # Past the deadline (or a peer's grace): a stop first, so a rank can clean up, then a kill.
        late = [p for p in started if p.is_alive()]
        for p in late:
            p.terminate()
        stop_by = time.monotonic() + 5.0
        for p in late:
            p.join(timeout=max(0.0, stop_by - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for reader, writer in pipes:
            reader.close()
            writer.close()
        lifeline.close()
        lifeline_end.close()  # after the joins: a rank still finishing must not take it for our death
        unlink_created_by([p.pid for p in procs if p.pid is not None])
    if expect_failures:
        return [results[r][1] if r in results else (deaths.get(r) if deaths_as_text else None)
                for r in range(world_size)]
    missing = [r for r in range(world_size) if r not in results and r not in deaths]
    failed = {r: v for r, (ok, v) in results.items() if not ok}
    if missing or failed or deaths:
        parts = [deaths[r] for r in sorted(deaths)]  # the cause first; the peers' errors follow from it
        if missing and deaths:
            parts.append(f"ranks {missing} stopped {_grace_s(collective_timeout_s):g} s after a peer died, "
                         "without a result")
        elif missing:
            parts.append(f"ranks {missing} gave no result within {timeout_s:g} s")
        parts += [f"rank {r}: {v}" for r, v in sorted(failed.items())]
        raise LaunchError("; ".join(parts))
    return [results[r][1] for r in range(world_size)]


def _end_silently(procs: list[Any]) -> None:
    """Ends every rank at once, printing nothing. A rank stopped one by one could outlive a peer,
    see the peer's socket close inside a collective and log it (gloo writes to stderr from C++), so
    every rank is first frozen (SIGSTOP) and only then killed. The names they still own in /dev/shm
    are removed by the launcher afterwards, as for any rank that died."""
    pids = [p.pid for p in procs if p.pid is not None and p.is_alive()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    frozen_by = time.monotonic() + 2.0  # a signal is queued at once but acted on when the rank next runs
    while not all(_frozen_or_gone(pid) for pid in pids) and time.monotonic() < frozen_by:
        time.sleep(0.001)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _frozen_or_gone(pid: int) -> bool:
    """Whether ``pid`` is stopped or no longer runs (Linux /proc; elsewhere assumed after the wait)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]  # the field after the command name
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t", b"Z", b"X")


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
    if _lifeline is not None and _launcher_gone(_lifeline):
        _leave_quietly()  # the stop came with the launcher's death: nobody to clean up for or report to
    raise SystemExit(128 + signum)


_lifeline: Any = None  # this rank's read end of the launcher's lifeline pipe
_leaving = threading.Lock()


def _launcher_gone(lifeline: Any) -> bool:
    """The launcher never writes: a readable lifeline is its end of file, i.e. the launcher is gone."""
    try:
        return bool(lifeline.poll(0))
    except (OSError, ValueError):
        return True


def _watch_launcher(lifeline: Any) -> None:
    try:
        lifeline.poll(None)  # returns at end of file: every copy of the write end is closed
    except (OSError, ValueError):
        pass
    _leave_quietly()


def _leave_quietly() -> None:
    """Exits this rank now, printing nothing: the launcher is gone, so stdout/stderr may be a closed
    pipe and there is no one to report to. Removes the /dev/shm names this rank created and still
    owns (only inside a registration window; afterwards every name is already gone), and no other
    thread of it can create one after that."""
    _leaving.acquire()  # the watcher and a signal handler may both get here; the first one exits
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        unlink_owned_and_stop()
    finally:
        os._exit(1)


def _report(result_pipe: Any, message: tuple) -> None:
    """Sends this rank's outcome; a launcher that is gone is no error (and no traceback)."""
    try:
        result_pipe.send(message)
    except (OSError, EOFError):  # BrokenPipeError among them
        _leave_quietly()


def _rank_main(fn: Callable[..., Any], rank: int, world: int, port: int, timeout_s: float,
               env: dict[str, str], result_pipe: Any, lifeline: Any, args: tuple) -> None:
    global _lifeline
    _lifeline = lifeline
    threading.Thread(target=_watch_launcher, args=(lifeline,), name="cpkv-lifeline", daemon=True).start()
    import torch
    import torch.distributed as dist

    from cpkv.config import invalidate_config

    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # a stop runs the context managers' cleanup
    # A Ctrl-C at a terminal reaches the whole process group; the launcher alone acts on it (it
    # freezes and ends every rank at once), so a rank never ends on its own before its peers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    invalidate_config()
    torch.set_num_threads(1)  # cp ranks share the cores; one thread each avoids oversubscription
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=as_timedelta(timeout_s))
        try:
            # gloo's init returns on a rank once its own connections are up, not every rank's: a
            # rank whose function makes no collective could finish and close its sockets while a
            # slower peer is still connecting, failing that peer's init ("Connection closed by
            # peer", seen in CI). Past this barrier (under the group's timeout) every mesh is up.
            dist.barrier()
            result = fn(rank, world, *args)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        _report(result_pipe, (rank, True, result))
    except BaseException as err:  # noqa: BLE001 -- reported to the parent, which decides
        _report(result_pipe, (rank, False, f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"))
    finally:
        result_pipe.close()
