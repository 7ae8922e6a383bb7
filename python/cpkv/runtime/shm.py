"""Shared-memory hygiene: every /dev/shm name a cpkv process creates is removed, however it ends.

Segments are plain files in /dev/shm, not ``multiprocessing.shared_memory``: its resource tracker
unlinks segments a peer merely attached to when that peer exits, and warns about "leaks" it does
not own. Here exactly one rank creates and unlinks each name; peers only map it. A name lives only
until every rank has mapped it (the mapping outlives the name); this module covers the window
before that: the creator's exit, a dead creator's peers, and the launcher after its ranks.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import threading

SHM_DIR = "/dev/shm"

# Segments this process created and has not unlinked yet, removed when the process exits.
# Callers drop a name as soon as every rank has mapped the segment, so this only matters
# inside that window (a registration cut short); a SIGKILL there leaves the name, which
# the surviving ranks' error path removes (every name of a run is known to every rank).
# Multiprocessing children leave through os._exit, which skips atexit, so the hook is also a
# multiprocessing finalizer, registered per process: a forked child must never unlink its
# parent's segments.
_owned: set[str] = set()
_owner_pid: int | None = None
# Held while a name is created and tracked, and for good by a process that is about to leave
# (:func:`unlink_owned_and_stop`), so no name can appear untracked or after the last cleanup.
# Reentrant: a signal handler may leave while its own thread is creating a name.
_creating = threading.RLock()


def _track(path: str) -> None:
    global _owned, _owner_pid
    if _owner_pid != os.getpid():
        _owned, _owner_pid = set(), os.getpid()
        atexit.register(_unlink_owned)
        multiprocessing.util.Finalize(None, _unlink_owned, exitpriority=100)
    _owned.add(path)


def _unlink_owned() -> None:
    if _owner_pid != os.getpid():
        return
    for path in sorted(_owned):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    _owned.clear()


def create_owned(path: str) -> int:
    """Creates the file ``path`` (it must not exist) and returns its fd, read-write. This process
    owns the name until :func:`unlink_now`: a normal exit (atexit or a multiprocessing child's
    finalizers) and :func:`unlink_owned_and_stop` remove it. The name is tracked before it exists,
    so no moment leaves it untracked."""
    with _creating:
        _track(path)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except BaseException:
            _owned.discard(path)  # not created: the name may be someone else's
            raise


def unlink_owned_and_stop() -> None:
    """For a process about to ``os._exit``: removes every name it created and still owns, and
    blocks its other threads from creating any more (a thread mid-creation finishes first)."""
    _creating.acquire()  # never released: the caller exits
    _unlink_owned()


def unlink_now(path: str) -> None:
    """Removes the name now and forgets it (idempotent; mappings of the file stay valid)."""
    _owned.discard(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def unlink_created_by(pids: list[int]) -> None:
    """Removes the names that processes ``pids`` (now dead) created and had no chance to remove:
    every cpkv name carries its run id, which starts with the creating rank's pid."""
    prefixes = tuple(f"{stem}{pid}-" for pid in pids for stem in ("cpkv-", "cpkv-slab-"))
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefixes):
            unlink_now(os.path.join(SHM_DIR, name))


def shm_room(smaller_request: str) -> str:
    """How much room /dev/shm has, and what to do about it (for error messages); ``smaller_request``
    says how the caller asks for less ("use fewer pages")."""
    try:
        st = os.statvfs(SHM_DIR)
        return (f"{SHM_DIR} has {st.f_bavail * st.f_frsize} of {st.f_blocks * st.f_frsize} bytes free; "
                f"enlarge it (e.g. docker run --shm-size) or {smaller_request}")
    except OSError:
        return f"{SHM_DIR} cannot be inspected"
