"""A POSIX shared-memory segment (a file in /dev/shm) mapped as a torch uint8 tensor.

Exactly one rank creates each segment and removes its name (:mod:`cpkv.runtime.shm`); peers only
map it.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from cpkv.runtime.shm import SHM_DIR, create_owned, shm_room, unlink_now

_fallocate = os.posix_fallocate  # a module global, so a test can make reservation fail


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
        fd = create_owned(self.path) if create else os.open(self.path, os.O_RDWR)
        try:
            if create:
                try:
                    # Zero-filled, and every byte reserved now: staging dummy rows start (and stay) zero.
                    _fallocate(fd, 0, max(nbytes, 1))
                except OSError as err:
                    unlink_now(self.path)
                    raise OSError(err.errno, f"cannot reserve {nbytes} bytes at {self.path}: "
                                             f"{err.strerror or err} ({shm_room('ask for less')})") from err
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
