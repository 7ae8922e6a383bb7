"""A small tmpfs for the disk tests of every suite (core, vLLM, SGLang): L3 caps are checked against
a file system that really fills, never against the machine's disk."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


def mount_tmpfs(path: Path, size: str, *options: str) -> None:
    """Mounts a tmpfs of ``size`` (mount's notation, e.g. ``16m``) on ``path`` (made if absent);
    skips the test where this process may not mount."""
    path.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join((f"size={size}", *options)), "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def fill_disk(directory: Path, name: str = "filler") -> Path:
    """Another user of the file system takes every free byte: a file of its own in ``directory``,
    written until ENOSPC. Returns its path (remove it to give the room back)."""
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            os.write(fd, b"\1" * (1 << 16))
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0, "the file system still has room"
    return path


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs, unmounted after the test."""
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "16m")
    yield disk
    unmount(disk)
