"""An L3 directory's room and its holder: the checks before an L3 store allocates anything.

- **The setting** (:func:`check_l3_pair`): a directory and a cap, both or neither, the one rule for
  the main job's ``--l3-dir``/``--l3-bytes`` and every engine's ``cpkv_l3_dir``/``cpkv_l3_bytes``.
- **Room** (:func:`check_room`): a cap larger than what the file system can give (its free space
  less a margin, :func:`margin_bytes`, plus what the directory's own L3 files already hold and a
  reopen reuses) is refused by name before a byte is allocated. Preallocating past the free space
  would fill the disk (every other user of it fails) and still not give the tier its cap.
- **Holder** (:class:`DirectoryLock`): one process, or one engine's rank group, per L3 directory.
  Two writers of one directory clobber each other's records and truncate each other's logs. The
  holder takes an advisory ``flock`` on ``cpkv-l3.lock`` in the directory; the kernel releases it
  when the holder exits or dies, so a crashed holder never blocks a restart. The lock file stays
  empty (no block on disk, nothing against the cap). A rank group's leader takes it before any of
  the group's ranks opens a store, and the others learn the outcome from the leader.
- **An instance's holders** (:class:`InstanceLock`): where an engine's processes open the directory
  in no fixed order (vLLM's scheduler and workers), each holds a shared lock on a file naming the
  engine instance; another instance's process is refused while any holder lives.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from cpkv.errors import InvalidArgumentError
from cpkv.tier.l3.direct import errno_name

# An L3 cap is a byte count the disk APIs take (off_t).
MAX_L3_BYTES = (1 << 63) - 1
LOCK_FILE = "cpkv-l3.lock"
LIVE_PREFIX = "cpkv-l3.live-"
# The room a cap must leave free on the file system: 2 % of it, at most 256 MiB.
MARGIN_SHARE = 50
MARGIN_MAX = 256 << 20


def check_l3_pair(directory: Any, cap_bytes: Any, dir_name: str, bytes_name: str,
                  label: Callable[[str], str] = str, spell: Callable[[str], str] = str) -> tuple[str | None, int | None]:
    """The L3 setting: ``directory`` (an existing one) and ``cap_bytes`` (an int in ``[1,
    MAX_L3_BYTES]``), both or neither; ``(None, None)`` when neither. ``dir_name``/``bytes_name``
    are the two settings' names; in errors ``label`` spells a setting's place, ``spell`` its bare
    name (a command line's flag as it is, an engine's key quoted)."""
    if (directory is None) != (cap_bytes is None):
        given, missing = (dir_name, bytes_name) if directory is not None else (bytes_name, dir_name)
        raise InvalidArgumentError(f"{label(given)} needs {spell(missing)} too (both or neither)")
    if directory is None:
        return None, None
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory) or not os.path.isdir(directory):
        raise InvalidArgumentError(f"{label(dir_name)}: {directory!r} is not an existing directory")
    if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or not 1 <= cap_bytes <= MAX_L3_BYTES:
        raise InvalidArgumentError(f"{label(bytes_name)} must be an int in [1, 2**63) (bytes), got {cap_bytes!r}")
    return os.fspath(directory), cap_bytes


def file_bytes(path: str | os.PathLike) -> int:
    """Bytes on disk (allocated blocks) of one file; 0 once it is gone (another rank removed it)."""
    try:
        return os.lstat(os.fspath(path)).st_blocks * 512
    except FileNotFoundError:
        return 0


def tree_bytes(path: str | os.PathLike) -> int:
    """Bytes on disk (allocated blocks) of every file under ``path``, subdirectories included."""
    return sum(file_bytes(os.path.join(root, name)) for root, _dirs, files in os.walk(os.fspath(path))
               for name in files)


def margin_bytes(directory: str | os.PathLike) -> int:
    st = os.statvfs(os.fspath(directory))
    return min(st.f_blocks * st.f_frsize // MARGIN_SHARE, MARGIN_MAX)


def room_bytes(directory: str | os.PathLike, reusable_bytes: int) -> int:
    """The most bytes L3 may hold in ``directory``: the free space less the margin, plus
    ``reusable_bytes`` (what its own files hold now: a reopen reuses or frees those blocks)."""
    st = os.statvfs(os.fspath(directory))
    return st.f_bavail * st.f_frsize - margin_bytes(directory) + reusable_bytes


def check_room(directory: str | os.PathLike, cap_bytes: int, setting: str, reusable_bytes: int) -> None:
    """Raises :class:`InvalidArgumentError` naming ``setting`` when ``cap_bytes`` does not fit."""
    room = room_bytes(directory, reusable_bytes)
    if cap_bytes > room:
        st = os.statvfs(os.fspath(directory))
        raise InvalidArgumentError(
            f"{setting} {cap_bytes} is more than the file system of {os.fspath(directory)} can give: "
            f"{st.f_bavail * st.f_frsize} bytes free, less a margin of {margin_bytes(directory)}, plus "
            f"{reusable_bytes} its L3 files already hold: at most {max(0, room)}")


class DirectoryLock:
    """The advisory lock naming this process the holder of L3 ``directory``; ``setting`` names the
    directory's setting in the refusal (``--l3-dir``, ``extra config key 'cpkv_l3_dir'``). With
    ``wait_s``, the lock is waited for that long (one only ever held briefly: a reclaim, a join)."""

    def __init__(self, directory: str | os.PathLike, setting: str, *, wait_s: float = 0.0) -> None:
        self.path = Path(directory) / LOCK_FILE
        self._fd = -1
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise InvalidArgumentError(f"{setting} {os.fspath(directory)}: cannot create its lock file "
                                       f"{LOCK_FILE}: {errno_name(err)} ({err.strerror})") from None
        try:
            _flock_within(self._fd, fcntl.LOCK_EX, wait_s)
        except OSError as err:
            self.release()
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise InvalidArgumentError(
                    f"{setting} {os.fspath(directory)} is in use by another process (it holds the lock "
                    f"{self.path}): one cpkv process, or one engine's ranks, per L3 directory") from None
            raise InvalidArgumentError(f"{setting} {os.fspath(directory)}: cannot lock {self.path}: "
                                       f"{errno_name(err)} ({err.strerror})") from None

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = -1

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _flock_within(fd: int, operation: int, wait_s: float) -> None:
    """``flock`` without blocking, retried for up to ``wait_s`` (the kernel has no timed flock)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class InstanceLock:
    """One engine instance's hold on an L3 directory, shared by all of that instance's processes
    (vLLM's scheduler and workers, which open the directory in no fixed order): each holds a shared
    ``flock`` on ``cpkv-l3.live-<instance>``. A process of another instance finds a live file it
    cannot lock exclusively (a live holder) and is refused by name; one it can (every holder exited
    or died) is stale and removed. Joins are serialized by the directory's :class:`DirectoryLock`."""

    def __init__(self, directory: str | os.PathLike, instance: str, setting: str, *, wait_s: float = 30.0) -> None:
        directory = Path(directory)
        mine = LIVE_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", instance)
        self._fd = -1
        with DirectoryLock(directory, setting, wait_s=wait_s):
            for other in sorted(directory.glob(LIVE_PREFIX + "*")):
                if other.name != mine and _held(other):
                    raise InvalidArgumentError(
                        f"{setting} {os.fspath(directory)} is in use by another engine (instance "
                        f"{other.name.removeprefix(LIVE_PREFIX)!r} holds {other.name}): one engine per L3 directory")
                if other.name != mine:
                    other.unlink(missing_ok=True)  # every holder of that instance is gone
            self._fd = os.open(directory / mine, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.release()


def _held(path: Path) -> bool:
    """Whether a live process holds a lock on ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def try_lock(directory: str | os.PathLike) -> DirectoryLock | None:
    """The lock of ``directory`` when no live process holds it (None when one does)."""
    try:
        return DirectoryLock(directory, "")
    except InvalidArgumentError:
        return None
