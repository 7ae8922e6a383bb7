"""Where an L3 store's slots live on disk: preallocated data files of whole slots, slot ``s`` in
file ``s // per_file`` at byte ``(s % per_file) * slot_bytes``. The main job's store and each vLLM
worker's shard lay out their data files by this one rule."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The largest data file; a store of more slots uses several.
DATA_FILE_BYTES = 1 << 30


@dataclass(frozen=True)
class DataFiles:
    """The data files of ``slots`` records of ``slot_bytes`` each in ``directory``."""

    directory: Path
    slots: int
    slot_bytes: int

    @property
    def per_file(self) -> int:
        return max(1, min(self.slots, DATA_FILE_BYTES // self.slot_bytes))

    @property
    def count(self) -> int:
        return -(-self.slots // self.per_file)

    def path(self, file: int) -> Path:
        return self.directory / f"data-{file}.bin"

    def where(self, slot: int) -> tuple[int, int]:
        """(data file index, byte offset) of ``slot``."""
        return slot // self.per_file, (slot % self.per_file) * self.slot_bytes

    def allocate(self, created: list[Path]) -> None:
        """Creates (noting each new file in ``created``) and preallocates every data file at its size;
        a file reopened smaller gives its blocks back."""
        for i in range(self.count):
            size = min(self.per_file, self.slots - i * self.per_file) * self.slot_bytes
            path = self.path(i)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                created.append(path)
            except FileExistsError:
                fd = os.open(path, os.O_RDWR)
            try:
                if os.fstat(fd).st_size > size:
                    os.ftruncate(fd, size)
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)

    def stale(self) -> list[Path]:
        """Data files in the directory beyond this layout's (of a store of more slots)."""
        out = []
        for path in self.directory.glob("data-*.bin"):
            index = path.stem.removeprefix("data-")
            if index.isdigit() and int(index) >= self.count:
                out.append(path)
        return out
