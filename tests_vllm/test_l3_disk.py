"""The vLLM adapter's L3 directory: a cap beyond the free space is refused by name before anything
is created (on a small tmpfs), and one engine per directory: an engine of another model is refused
while the first one's processes live, and takes the directory once they are gone (closed or
killed)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cpkv.errors import InvalidArgumentError
from cpkv.integrations.vllm.l3 import CATALOG_LOG, L3Catalog, L3Shard
from cpkv.tier.l3.directory import tree_bytes
from test_l3_shards import geometry


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 16 MiB tmpfs, unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_cap_beyond_the_free_space_is_refused_by_name_and_leaves_nothing(small_disk: Path) -> None:
    g = geometry(small_disk, cap=64 << 20)
    for open_side in (lambda: L3Shard(g, 0), lambda: L3Catalog(g)):
        with pytest.raises(InvalidArgumentError, match=r"^kv_connector_extra_config\['cpkv_l3_bytes'\] 67108864 is more"):
            open_side()
    assert not (small_disk / CATALOG_LOG).exists() and not list(small_disk.glob("shard-*"))
    assert tree_bytes(small_disk) == 0  # the lock files are empty
    statvfs = os.statvfs(small_disk)
    assert statvfs.f_bfree == statvfs.f_blocks


HOLDER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_l3_shards import geometry
from cpkv.integrations.vllm.l3 import L3Catalog, L3Shard
g = geometry(Path({directory!r}))
catalog, shard = L3Catalog(g), L3Shard(g, 0)
print("holding", flush=True)
sys.stdin.read()
"""


def test_an_engine_of_another_model_is_refused_while_the_first_lives_and_a_killed_one_blocks_nothing(
        tmp_path: Path) -> None:
    first = geometry(tmp_path)
    other = dataclasses.replace(first, model="another-model")
    catalog, shard = L3Catalog(first), L3Shard(first, 0)
    log = (tmp_path / CATALOG_LOG).read_bytes()
    for open_side in (lambda: L3Catalog(other), lambda: L3Shard(other, 1)):
        with pytest.raises(InvalidArgumentError, match=r"cpkv_l3_dir'\] .* is in use by another engine"):
            open_side()
    assert (tmp_path / CATALOG_LOG).read_bytes() == log, "the live engine's log is untouched"
    # The same engine's other processes join it (a second worker's shard).
    L3Shard(first, 1).close()
    shard.close()
    catalog.close()
    L3Catalog(other).close()  # closed: the directory is free
    # A holder killed with SIGKILL leaves a lock the kernel has released.
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(tests=str(Path(__file__).parent),
                                                                   directory=str(tmp_path))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(InvalidArgumentError, match="is in use by another engine"):
            L3Catalog(other)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    L3Catalog(other).close()
