"""Bytes a promotion reads from disk per chunk under vLLM's L3 (the README's table): the catalog's
check of a record, then the worker's fill from the same record, with each read buffered or O_DIRECT.
Records are written by the real L3Shard, synced and dropped from the page cache
(POSIX_FADV_DONTNEED), then a seeded random half of the chunks, in random order, is checked and
filled; the disk bytes are this process's ``read_bytes`` in /proc/self/io (the block layer's count:
page-cache hits are not in it), per promoted chunk's record.

    .venv-vllm/bin/python tests_vllm/l3_read_io.py --dir DIR --chunks 256 --page-kib 256
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cpkv import _cpkv
from cpkv.integrations.vllm.l3 import STOP_SHARE, Fill, L3Catalog, L3Geometry, L3Shard
from cpkv.tier.l3.direct import AlignedScratch, probe_direct


def disk_read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise SystemExit("/proc/self/io has no read_bytes (no task I/O accounting)")


def drop_cache(shard: L3Shard) -> None:
    for fd in shard._fds:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def direct_read(g: L3Geometry, rank: int, slot: int, scratch: AlignedScratch) -> np.ndarray:
    file, offset = g.where(slot)
    fd = os.open(g.shard_dir(rank) / f"data-{file}.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        scratch.take(g.slot_bytes)
        got = os.preadv(fd, [scratch.view(0, g.slot_bytes)], offset)
    finally:
        os.close(fd)
    return scratch.array[:got]


def run(directory: Path, chunks: int, page_bytes: int, check: str, fill: str) -> tuple[float, float]:
    # Room for every chunk besides the stop copy's reserve (1/STOP_SHARE of the cap).
    cap = (chunks + 8) * (page_bytes + 8192) * STOP_SHARE // (STOP_SHARE - 1) + (1 << 20)
    g = L3Geometry(directory=directory, cap_bytes=cap, model="m",
                   dtype="bf16", layout="io", tokens_per_chunk=16, world=1, page_bytes=page_bytes)
    catalog = L3Catalog(g)
    shard = L3Shard(g, 0)
    pages = np.random.default_rng(0).integers(0, 256, (chunks, page_bytes), dtype=np.uint8)
    keys = list(range(1, chunks + 1))
    batch = catalog.spill(keys, list(range(chunks)))
    assert batch is not None
    shard.write([batch], lambda rows: pages[rows])
    catalog.commit([batch.id])
    drop_cache(shard)
    scratch = AlignedScratch()
    before = disk_read_bytes()
    started = time.perf_counter()
    placed = list(zip(batch.keys, batch.slots, batch.sequences))
    promoted = [placed[i] for i in np.random.default_rng(1).permutation(chunks)[: max(1, chunks // 2)]]
    for key, slot, sequence in promoted:
        if check == "buffered":
            catalog.start_check(key, slot, sequence)
            assert catalog.wait_idle(60)
            ((_, _, reason),) = catalog.checked()
        else:
            reason = _cpkv.l3_check(direct_read(g, 0, slot, scratch), g.namespace(0), key, sequence, page_bytes)
        assert reason is None, reason
        if fill == "buffered":
            payload = shard.read(Fill(0, key, slot, sequence))
        else:
            record = direct_read(g, 0, slot, scratch)
            assert _cpkv.l3_check(record, g.namespace(0), key, sequence, page_bytes) is None
            payload = record[:page_bytes]
        assert np.array_equal(payload, pages[key - 1])
    elapsed = time.perf_counter() - started
    read = disk_read_bytes() - before
    shard.close()
    catalog.close()
    return read / (len(promoted) * g.slot_bytes), len(promoted) * page_bytes / elapsed / 1e6


def write_rate(directory: Path, chunks: int, page_bytes: int, direct: bool) -> float:
    """MB/s of one spill batch of ``chunks`` written by L3Shard.write (sealed, written, fdatasync'd),
    O_DIRECT or buffered."""
    # Room for every chunk besides the stop copy's reserve (1/STOP_SHARE of the cap).
    cap = (chunks + 8) * (page_bytes + 8192) * STOP_SHARE // (STOP_SHARE - 1) + (1 << 20)
    g = L3Geometry(directory=directory, cap_bytes=cap, model="m",
                   dtype="bf16", layout="io", tokens_per_chunk=16, world=1, page_bytes=page_bytes)
    catalog = L3Catalog(g)
    shard = L3Shard(g, 0)
    if not direct:  # the same files, reopened without O_DIRECT
        for i, fd in enumerate(shard._fds):
            os.close(fd)
            shard._fds[i] = os.open(g.shard_dir(0) / f"data-{i}.bin", os.O_RDWR)
    pages = np.random.default_rng(0).integers(0, 256, (chunks, page_bytes), dtype=np.uint8)
    batch = catalog.spill(list(range(1, chunks + 1)), list(range(chunks)))
    assert batch is not None
    started = time.perf_counter()
    shard.write([batch], lambda rows: pages[rows])
    elapsed = time.perf_counter() - started
    shard.close()
    catalog.close()
    return chunks * page_bytes / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="a directory on the disk to measure (default: a temporary one)")
    parser.add_argument("--chunks", type=int, default=256)
    parser.add_argument("--page-kib", type=int, default=256)
    args = parser.parse_args()
    if args.chunks < 1 or args.page_kib < 1:
        parser.error("--chunks and --page-kib must be >= 1")
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        probe = Path(directory) / "probe"
        probe.write_bytes(b"\0" * 4096)
        mode, why = probe_direct(probe)
        print(f"{args.chunks} chunks of {args.page_kib} KiB in {directory}: {mode} {why}")
        if mode != "o_direct":
            sys.exit("this file system takes no O_DIRECT")
        for check, fill in (("buffered", "buffered"), ("buffered", "o_direct"), ("o_direct", "o_direct")):
            sub = Path(directory) / f"{check}-{fill}"
            sub.mkdir()
            per_record, mb_s = run(sub, args.chunks, args.page_kib * 1024, check, fill)
            print(f"check {check:8s} fill {fill:8s}: {per_record:.2f} records read from disk per promoted chunk, "
                  f"{mb_s:.0f} MB/s check + fill")
        for direct in (True, False):
            sub = Path(directory) / f"write-{direct}"
            sub.mkdir()
            print(f"spill write {'o_direct' if direct else 'buffered'}: "
                  f"{write_rate(sub, args.chunks, args.page_kib * 1024, direct):.0f} MB/s (one batch, synced)")


if __name__ == "__main__":
    main()
