"""The L3 directory and its file system: a cap beyond the free space is refused before anything is
allocated, a full disk at run time stops the tier on every rank (never a false divergence, never a
wrong page), one replay per directory (a killed one never blocks a restart), and a read-only
directory is one line, exit 2. Every disk here is a small tmpfs mounted for the test."""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpkv.errors import InvalidArgumentError
from cpkv.replay import ReplayOptions
from cpkv.replay.options import parse_payloads
from cpkv.runtime.launch import run_ranks
from cpkv.tier.l3.directory import LOCK_FILE
from cpkv.tier.l3.log import LOG_ENTRY, LOG_HEADER
from cpkv.tier.l3.store import L3Namespace, L3Store
from cpkv.workload import generate
from small_fs import fill_disk, mount_tmpfs, unmount

NAMESPACE = L3Namespace(model="m", dtype="uint8", kv_layout="test", page_size=16, cp_size=1, tp_size=1,
                        page_bytes=4096)
PAYLOADS = "kv:4x8:float8_e4m3fn,index:16:bfloat16"


def _used(disk: Path) -> int:
    st = os.statvfs(disk)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_a_cap_beyond_the_free_space_is_refused_by_name_and_leaves_nothing(small_disk: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^--l3-bytes 67108864 is more than the file system"):
        L3Store(small_disk, 64 << 20, NAMESPACE, cap_setting="--l3-bytes")
    assert os.listdir(small_disk) == [] and _used(small_disk) == 0
    # The store's own files are room a reopen reuses: 12 MiB of 16 reopens at 14 MiB.
    with L3Store(small_disk, 12 << 20, NAMESPACE):
        pass
    with L3Store(small_disk, 14 << 20, NAMESPACE) as store:
        assert store.slots > 0
    # Someone else's file is not: 10 MiB of it leaves no room for 12 MiB more.
    for name in os.listdir(small_disk):
        os.unlink(small_disk / name)
    (small_disk / "other").write_bytes(b"\1" * (10 << 20))
    with pytest.raises(InvalidArgumentError, match="cap_bytes 12582912 is more than"):
        L3Store(small_disk, 12 << 20, NAMESPACE)
    assert os.listdir(small_disk) == ["other"]


def test_an_open_that_fails_part_way_removes_what_it_created(small_disk: Path, monkeypatch) -> None:
    from cpkv.tier.l3 import store as store_module

    def enospc(*_args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_module.os, "fdatasync", enospc)  # the log header's sync, the open's last step
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        L3Store(small_disk, 4 << 20, NAMESPACE)
    assert os.listdir(small_disk) == [] and _used(small_disk) == 0
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_store_dropped_without_close_keeps_no_descriptor(small_disk: Path) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    store = L3Store(small_disk, 4 << 20, NAMESPACE)
    assert len(os.listdir("/proc/self/fd")) > fds
    del store
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_reopening_with_fewer_ranks_keeps_no_old_rank_log(small_disk: Path) -> None:
    namespace = L3Namespace(model="m", dtype="uint8", kv_layout="test", page_size=16, cp_size=4, tp_size=1,
                            page_bytes=4096)
    stores = [L3Store(small_disk, 4 << 20, namespace, rank=r, ranks_on_node=4) for r in range(4)]
    for s in stores:
        s.close()
    assert sorted(p.name for p in small_disk.glob("index-r*.log")) == [f"index-r{r}.log" for r in range(4)]
    two = L3Namespace(model="m", dtype="uint8", kv_layout="test", page_size=16, cp_size=2, tp_size=1, page_bytes=4096)
    with L3Store(small_disk, 4 << 20, two, rank=0, ranks_on_node=2):
        assert sorted(p.name for p in small_disk.glob("index-r*.log")) == ["index-r0.log", "index-r1.log"]


# -- cpkv replay ---------------------------------------------------------------------------------------

def _cli(directory: Path, cap: int, *args: str, json_out: Path | None = None) -> list[str]:
    argv = [sys.executable, "-m", "cpkv", "replay", "--quiet", "--l3-dir", str(directory), "--l3-bytes", str(cap),
            "--payloads", PAYLOADS, "--device-pages", "48", "--host-pages", "96", *args]
    if json_out is not None:
        argv += ["--json", str(json_out)]
    return argv


def test_replay_refuses_a_cap_beyond_the_free_space_in_one_line(small_disk: Path) -> None:
    done = subprocess.run(_cli(small_disk, 1 << 30, "--limit", "4"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("cpkv: error: --l3-bytes 1073741824 is more than")
    assert [p for p in os.listdir(small_disk) if p != LOCK_FILE] == [] and _used(small_disk) == 0


def test_replay_on_a_read_only_directory_is_one_line_exit_2(tmp_path: Path) -> None:
    disk = tmp_path / "ro"
    mount_tmpfs(disk, "4m", "ro")
    try:
        done = subprocess.run(_cli(disk, 2 << 20, "--limit", "4"), capture_output=True, text=True, timeout=120)
    finally:
        unmount(disk)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"cpkv: error: --l3-dir {disk}: cannot create its lock file") and "EROFS" in done.stderr


def test_a_second_replay_on_one_directory_is_refused_and_a_killed_holder_blocks_no_restart(small_disk: Path) -> None:
    # The holder: a long run (it is killed once the second has been refused).
    holder = subprocess.Popen(_cli(small_disk, 4 << 20, "--requests", "100000"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # It holds the directory once its ranks have opened the store (their files are there).
        deadline = 120.0
        start = time.monotonic()
        while not (small_disk / "index-r1.log").exists():
            assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""
            assert time.monotonic() - start < deadline
            time.sleep(0.05)
        second = subprocess.run(_cli(small_disk, 4 << 20, "--limit", "4"), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1
        assert second.stderr.startswith(f"cpkv: error: --l3-dir {small_disk} is in use by another process")
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    out = small_disk.parent / "restart.json"
    restart = subprocess.run(_cli(small_disk, 4 << 20, "--limit", "30", json_out=out), capture_output=True,
                             text=True, timeout=300)
    assert restart.returncode == 0, restart.stderr
    report = json.loads(out.read_text())["report"]
    assert report["verification failures (pages)"] == 0


def _filling_rank(rank: int, world: int, options: ReplayOptions, requests: list, fill_at: int) -> dict:
    """A replay rank on which the disk becomes full at forward ``fill_at``: rank ``world - 1`` fills the
    tmpfs with a file of its own, so the next L3 log append on a rank fails with ENOSPC."""
    from cpkv.replay.rank import replay_rank
    from cpkv.tier import CacheController

    end_forward = CacheController.end_forward

    def filling(self: CacheController) -> None:
        if rank == world - 1 and self.forwards == fill_at:
            with open(Path(options.l3_dir or "") / "filler", "wb") as f:
                try:
                    while True:
                        f.write(b"\1" * (1 << 16))
                        f.flush()
                except OSError as err:
                    assert err.errno == errno.ENOSPC
        end_forward(self)

    CacheController.end_forward = filling  # type: ignore[method-assign]
    return replay_rank(rank, world, options, requests)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_full_disk_mid_run_stops_l3_on_every_rank_with_no_divergence_and_no_wrong_page(small_disk: Path,
                                                                                          ranks: int) -> None:
    requests = [r.hash_ids for r in generate(200, 3)]
    options = ReplayOptions(ranks=ranks, payloads=parse_payloads(PAYLOADS), device_pages=48, host_pages=96,
                            check_every=1, progress=False, timeout_s=20.0, l3_dir=str(small_disk),
                            l3_bytes=6 << 20)
    results = run_ranks(_filling_rank, ranks, options, requests, 2, timeout_s=180, expect_failures=True)
    assert all(isinstance(r, dict) for r in results), results
    assert [r["verification_failures"] for r in results] == [0] * ranks
    assert len({r["digest"] for r in results}) == 1 and len({r["l3_digest"] for r in results}) == 1
    stopped = [r["l3_stopped"] for r in results]
    assert all(stopped), stopped  # every rank stopped taking pages
    assert any("ENOSPC" in s for s in stopped), stopped
    assert len({r["l3_pages_spilled"] for r in results}) == 1, "every rank placed the same pages, then none"
    assert results[0]["agreement_checks"] > 2


# -- run-time I/O errors in the store ---------------------------------------------------------------

def _pages(keys: range) -> list[tuple[int, bytes]]:
    return [(key, bytes([key % 251]) * NAMESPACE.page_bytes) for key in keys]


def test_a_log_filling_the_disk_part_way_through_a_flush_keeps_every_acknowledged_page(small_disk: Path) -> None:
    """The disk fills while a flush appends its log entries: the write stops part way (5 entries per
    flush do not divide a block's). The log is cut back to where it ended and the flush raises (none
    of its pages acknowledged); once there is room again, later pages are acknowledged, and every
    acknowledged page is recovered."""
    per_put = 5
    store = L3Store(small_disk, 4 << 20, NAMESPACE)
    filler = fill_disk(small_disk)
    acknowledged: list[int] = []
    key = 0
    while True:  # the log's last block fills, flush by flush, then one append is cut short
        try:
            store.put(_pages(range(key, key + per_put)))
        except OSError as err:
            assert err.errno == errno.ENOSPC
            break
        acknowledged += range(key, key + per_put)
        key += per_put
    refused = range(key, key + per_put)
    log = small_disk / "index-r0.log"
    assert log.stat().st_size == LOG_HEADER + len(acknowledged) * LOG_ENTRY, "the log names exactly the acknowledged"
    filler.unlink()
    store.put(_pages(range(key + per_put, key + 2 * per_put)))
    acknowledged += range(key + per_put, key + 2 * per_put)
    store.close()
    with L3Store(small_disk, 4 << 20, NAMESPACE) as again:
        lost = [k for k in acknowledged if again.get(k) is None]
        assert lost == [], f"{len(lost)} acknowledged pages lost: {lost[:5]}"
        assert all(again.get(k) is None for k in refused), "the refused flush was acknowledged"


def test_a_failed_sync_acknowledges_its_records_neither_then_nor_later(small_disk: Path, monkeypatch) -> None:
    """A data sync that fails leaves the records' bytes on disk unknown: no later flush (which may
    sync without an error: the kernel reports one once) nor the close may log them."""
    from cpkv.tier.l3 import store as store_module

    store = L3Store(small_disk, 4 << 20, NAMESPACE)
    store.put(_pages(range(0, 4)))
    store.put(_pages(range(4, 8)), durable=False)
    real = os.fdatasync

    def fails_once(fd: int) -> None:
        monkeypatch.setattr(store_module.os, "fdatasync", real)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(store_module.os, "fdatasync", fails_once)
    with pytest.raises(OSError):
        store.flush()
    store.put(_pages(range(8, 12)))  # syncs fine now
    store.close()
    with L3Store(small_disk, 4 << 20, NAMESPACE) as again:
        assert [k for k in range(12) if again.get(k) is not None] == [*range(0, 4), *range(8, 12)]
