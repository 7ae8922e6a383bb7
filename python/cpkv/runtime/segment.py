"""A POSIX shared-memory segment (a file in /dev/shm) mapped as a torch uint8 tensor.

Plain files instead of ``multiprocessing.shared_memory``: its resource tracker
unlinks segments a peer merely attached to when that peer exits, and warns
about "leaks" it does not own. Here exactly one rank creates and unlinks each
segment; peers only map it.
"""

from __future__ import annotations

import atexit
import mmap
import multiprocessing.util
import os
from typing import Any

SHM_DIR = "/dev/shm"

# Segments this process created and has not unlinked yet, removed when the process exits.
# Callers drop a name as soon as every rank has mapped the segment, so this only matters
# inside that window (a registration cut short); a SIGKILL there leaves the name, which
# the surviving ranks' error path removes (every name of a run is known to every rank).
# Multiprocessing children leave
# through os._exit, which skips atexit, so the hook is also a multiprocessing finalizer,
# registered per process: a forked child must never unlink its parent's segments.
_owned: set[str] = set()
_fallocate = os.posix_fallocate  # a module global, so a test can make reservation fail
_owner_pid: int | None = None


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


def unlink_at_exit(path: str) -> None:
    """Remembers a file this process just created, so that a normal exit (atexit or a
    multiprocessing child's finalizers) unlinks it if :func:`unlink_now` never ran."""
    _track(path)


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


def shm_room() -> str:
    """How much room /dev/shm has, and what to do about it (for error messages)."""
    try:
        st = os.statvfs(SHM_DIR)
        return (f"{SHM_DIR} has {st.f_bavail * st.f_frsize} of {st.f_blocks * st.f_frsize} bytes free; "
                "enlarge it (e.g. docker run --shm-size) or ask for less")
    except OSError:
        return f"{SHM_DIR} cannot be inspected"


class SharedSegment:
    """One /dev/shm file mapped shared. The creator reserves all of its memory at creation
    (``posix_fallocate``), so a /dev/shm too small fails here, not with a SIGBUS at first touch;
    a failed creation leaves no file. Callers drop the name (:meth:`unlink`) as soon as every
    process that needs the segment has mapped it: the mapping outlives the name."""

    def __init__(self, name: str, nbytes: int, *, create: bool) -> None:
        if "/" in name or not name:
            raise ValueError(f"bad segment name {name!r}")
        self.name = name
        self.path = os.path.join(SHM_DIR, name)
        self.nbytes = nbytes
        self.owner = create
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                unlink_at_exit(self.path)
                try:
                    # Zero-filled, and every byte reserved now: staging dummy rows start (and stay) zero.
                    _fallocate(fd, 0, max(nbytes, 1))
                except OSError as err:
                    unlink_now(self.path)
                    raise OSError(err.errno, f"cannot reserve {nbytes} bytes at {self.path}: "
                                             f"{err.strerror or err} ({shm_room()})") from err
            elif os.fstat(fd).st_size != nbytes:
                raise ValueError(f"segment {name} has {os.fstat(fd).st_size} bytes, expected {nbytes}")
            self._map = mmap.mmap(fd, max(nbytes, 1))
        except BaseException:
            if create:
                unlink_now(self.path)
            raise
        finally:
            os.close(fd)
        self._tensor: Any = None

    @property
    def tensor(self) -> Any:
        """The whole segment as a uint8 tensor (one view, created on first use)."""
        if self._tensor is None:
            import torch

            self._tensor = torch.frombuffer(self._map, dtype=torch.uint8, count=self.nbytes)
        return self._tensor

    def unlink(self) -> None:
        """Removes the name (idempotent); existing mappings stay valid until closed."""
        unlink_now(self.path)

    def close(self) -> None:
        self._tensor = None
        try:
            self._map.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with the last reference
