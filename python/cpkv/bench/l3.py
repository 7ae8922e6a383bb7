"""``cpkv bench l3``: the L3 store's write and read throughput against plain O_DIRECT I/O of the
same bytes in the same directory, and its recovery time at a million pages.

Per page size (64 KiB and 1 MiB): the store takes ``--mib`` MiB of pages in batches of
``--batch-mib`` MiB, as the tier issues them when the host slab evicts (each batch: records
written, data files fdatasync'd, log entries appended and fdatasync'd, then acknowledged), then
reads every page back (lookup, one read per page, record check). The baseline is the plain way to
move the same bytes durably: one file, the same batch-sized O_DIRECT writes (buffered where the
file system refuses O_DIRECT, as the store does) and one fdatasync at the end; then the same reads.
This is what ``dd oflag=direct conv=fdatasync`` and ``dd iflag=direct`` do, here with the same
syscalls in-process, so no process start is timed. Ratios: ``write_ratio`` = L3 write rate /
plain write rate with every batch acknowledged durable before the next (two syncs per batch: data,
then log); ``group_write_ratio`` with one acknowledgement per ``--commit-mib`` MiB
(``put(durable=False)`` then ``flush``); ``read_ratio`` = L3 read rate (lookups, one read per
run of consecutive slots, every record checked) / plain read rate. Best of ``--repeat`` runs.

The floor: the latency of the two syncs an acknowledged batch costs, alone, on the same directory
(median over ``--flush-samples``): ``fdatasync`` of a data file right after a batch-sized O_DIRECT
write, and of a log right after appending one batch's entries; and the CPU the store spends beyond
the plain I/O's own (process CPU, all threads). With the plain I/O's time they bound what the store
can reach: ``write_ratio_ceiling`` = plain write time / (plain write time + both syncs per batch),
``group_write_ratio_ceiling`` with both syncs once per group commit, and the ``*_serial_ceiling``
figures with the extra CPU added in series (what runs between the disk's requests when nothing
overlaps it; ``read_ratio_serial_ceiling`` for reads).

Recovery: the log of a million-slot store holding a million entries is read and the index rebuilt
from it (no page data read, nothing preallocated): wall time and the CPU time of the one thread that
does it.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

PAGE_SIZES = (64 * 1024, 1024 * 1024)


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path

    parser.add_argument("--dir", required=True, metavar="DIR", help="an existing directory on the disk to measure")
    parser.add_argument("--mib", type=integer(8, 1 << 20), default=128,
                        help="MiB written and read per page size (default %(default)s)")
    parser.add_argument("--batch-mib", type=integer(1, 1024), default=4,
                        help="MiB per batch, as the tier hands evicted pages down (default %(default)s)")
    parser.add_argument("--commit-mib", type=integer(1, 1 << 20), default=64,
                        help="MiB per group commit in the second write figure (default %(default)s)")
    parser.add_argument("--recovery-pages", type=integer(1, 1 << 24), default=1_000_000,
                        help="log entries the recovery is timed on (default %(default)s)")
    parser.add_argument("--flush-samples", type=integer(1, 10_000), default=32,
                        help="syncs timed for the flush floor (default %(default)s)")
    parser.add_argument("--repeat", type=integer(1, 100), default=2, help="runs per figure, best kept (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the tables as JSON")


def _pages(count: int, page_bytes: int):
    """``count`` keyed pages, rows of page-aligned memory as the host slab's are (so the store writes
    each from where it lies)."""
    import numpy as np

    from cpkv.tier.l3.direct import aligned_empty

    base = np.random.default_rng(page_bytes).integers(0, 256, size=page_bytes, dtype=np.uint8)
    rows = aligned_empty(64, page_bytes)
    for r in range(len(rows)):
        rows[r] = np.roll(base, r)  # distinct rows: a page served from the wrong record shows
    return [(key, rows[key % len(rows)]) for key in range(1, count + 1)]


def _cpu_s() -> float:
    """CPU seconds of this process so far (every thread, user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _l3_round(directory: Path, page_bytes: int, count: int, per_batch: int,
              commit_every: int) -> tuple[float, float, float, float, str, int]:
    """Wall and CPU seconds of writing then reading ``count`` pages through a fresh store, its I/O
    mode and the pages that did not come back exact."""
    import numpy as np

    from cpkv.tier.l3 import L3Namespace, L3Store
    from cpkv.tier.l3.direct import aligned_empty
    from cpkv.tier.l3.store import slots_for

    ns = L3Namespace("bench", "uint8", "flat", 1, 1, 1, page_bytes)
    slot = -(-(page_bytes + 64) // 4096) * 4096
    cap = slot * count + 8 * 1024 * 1024
    while slots_for(cap, slot, 1) < count:
        cap += slot
    pages = _pages(count, page_bytes)
    with L3Store(directory, cap, ns) as store:
        started, cpu_started = time.perf_counter(), _cpu_s()
        for n, i in enumerate(range(0, count, per_batch)):
            store.put(pages[i:i + per_batch], durable=(n + 1) % commit_every == 0)
        store.flush()
        write_s, write_cpu_s = time.perf_counter() - started, _cpu_s() - cpu_started
        out = aligned_empty(per_batch, page_bytes)  # rows as a promotion's slab rows
        wrong = 0
        started, cpu_started = time.perf_counter(), _cpu_s()
        for i in range(0, count, per_batch):  # promotions come in batches too: a request's prefix
            batch = []
            for key, _ in pages[i:i + per_batch]:
                found = store.lookup(key)
                if found is None:
                    wrong += 1
                else:
                    batch.append((key, *found))
            wrong += sum(reason is not None for reason in store.read_many(batch, out[:len(batch)]))
        read_s, read_cpu_s = time.perf_counter() - started, _cpu_s() - cpu_started
        mode = store.mode
        # The last batch read, byte for byte.
        wrong += sum(not np.array_equal(out[j], data) for j, (_, data) in enumerate(pages[i:i + per_batch]))
    return write_s, read_s, write_cpu_s, read_cpu_s, mode, wrong


def _plain_round(directory: Path, total: int, chunk: int, direct: bool) -> tuple[float, float, float, float]:
    """Batch-sized O_DIRECT writes of ``total`` bytes, one fdatasync, then the same reads: wall and CPU
    seconds of each."""
    path = directory / "plain.bin"
    buf = mmap.mmap(-1, chunk)
    buf.write(os.urandom(chunk))
    extra = os.O_DIRECT if direct else 0
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | extra, 0o644)
    try:
        started, cpu_started = time.perf_counter(), _cpu_s()
        for offset in range(0, total, chunk):
            os.pwrite(fd, buf, offset)
        os.fdatasync(fd)
        write_s, write_cpu_s = time.perf_counter() - started, _cpu_s() - cpu_started
        view = memoryview(buf)
        started, cpu_started = time.perf_counter(), _cpu_s()
        for offset in range(0, total, chunk):
            os.preadv(fd, [view], offset)
        read_s, read_cpu_s = time.perf_counter() - started, _cpu_s() - cpu_started
    finally:
        os.close(fd)
        path.unlink()
    return write_s, read_s, write_cpu_s, read_cpu_s


def _flush_floor(directory: Path, chunk: int, entries: int, samples: int, direct: bool) -> tuple[float, float]:
    """Median seconds of ``fdatasync`` on a data file right after a ``chunk``-byte write (O_DIRECT when
    ``direct``) at a new offset, and on a log right after appending ``entries`` 32-byte entries."""
    import statistics

    buf = mmap.mmap(-1, chunk)
    buf.write(os.urandom(chunk))
    data_path, log_path = directory / "flush.bin", directory / "flush.log"
    data = os.open(data_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o644)
    log = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    data_s, log_s = [], []
    try:
        os.posix_fallocate(data, 0, chunk * samples)  # as the store's data files are
        for i in range(samples):
            os.pwrite(data, buf, i * chunk)
            started = time.perf_counter()
            os.fdatasync(data)
            data_s.append(time.perf_counter() - started)
            os.write(log, bytes(32 * entries))
            started = time.perf_counter()
            os.fdatasync(log)
            log_s.append(time.perf_counter() - started)
    finally:
        os.close(data)
        os.close(log)
        data_path.unlink()
        log_path.unlink()
    return statistics.median(data_s), statistics.median(log_s)


def _recovery(directory: Path, entries: int) -> tuple[float, float, int]:
    """Wall and CPU seconds (this thread: the rebuild runs in it) to read a log of ``entries`` entries
    and rebuild the index from it, and the pages kept. The CPU figure is what one core costs; the wall
    figure also holds whatever else the machine was doing."""
    import numpy as np

    from cpkv import _cpkv

    keys = np.random.default_rng(1).integers(1, 2**63, size=entries, dtype=np.uint64)
    slot_bytes, namespace = 69632, 12345
    log = directory / "index-r0.log"
    with open(log, "wb") as f:
        f.write(_cpkv.l3_log_header(namespace, slot_bytes, entries))
        step = 1 << 16
        for start in range(0, entries, step):
            f.write(_cpkv.l3_log_entries([(int(k), start + i + 1, start + i, 65536)
                                          for i, k in enumerate(keys[start:start + step])]))
    started, cpu_started = time.perf_counter(), time.thread_time()
    index, report, _ = _cpkv.L3Index.recover(entries, 1, [log.read_bytes()], namespace, slot_bytes)
    seconds, cpu_seconds = time.perf_counter() - started, time.thread_time() - cpu_started
    log.unlink()
    return seconds, cpu_seconds, int(report["kept"])


def run(args: argparse.Namespace) -> int:
    from cpkv._report import Table, emit
    from cpkv.errors import InvalidArgumentError

    root = Path(args.dir)
    if not root.is_dir():
        raise InvalidArgumentError(f"--dir {args.dir}: not an existing directory")
    work = Path(tempfile.mkdtemp(prefix="cpkv-bench-l3-", dir=root))
    rows, figures = [], {}
    try:
        for page_bytes in PAGE_SIZES:
            count = args.mib * 1024 * 1024 // page_bytes
            per_batch = max(1, args.batch_mib * 1024 * 1024 // page_bytes)
            group = max(1, args.commit_mib // args.batch_mib)
            best = dict.fromkeys(("l3_w", "l3_wg", "l3_r", "plain_w", "plain_r", "cpu_l3_wg", "cpu_l3_r",
                                  "cpu_plain_w", "cpu_plain_r"), float("inf"))
            mode, wrong = "", 0
            for _ in range(args.repeat):
                for commit_every, w_key in ((1, "l3_w"), (group, "l3_wg")):
                    store_dir = work / f"store-{page_bytes}"
                    store_dir.mkdir()
                    w, r, cpu_w, cpu_r, mode, bad = _l3_round(store_dir, page_bytes, count, per_batch, commit_every)
                    shutil.rmtree(store_dir)
                    wrong += bad
                    best[w_key] = min(best[w_key], w)
                    best["l3_r"] = min(best["l3_r"], r)
                    best["cpu_l3_r"] = min(best["cpu_l3_r"], cpu_r)
                    if w_key == "l3_wg":
                        best["cpu_l3_wg"] = min(best["cpu_l3_wg"], cpu_w)
                pw, pr, cpu_w, cpu_r = _plain_round(work, count * page_bytes, per_batch * page_bytes,
                                                    mode == "o_direct")
                best["plain_w"] = min(best["plain_w"], pw)
                best["plain_r"] = min(best["plain_r"], pr)
                best["cpu_plain_w"] = min(best["cpu_plain_w"], cpu_w)
                best["cpu_plain_r"] = min(best["cpu_plain_r"], cpu_r)
            gib = count * page_bytes / 2**30
            name = f"{page_bytes // 1024}KiB"
            figures[name] = {
                "pages": count, "page_bytes": page_bytes, "batch_pages": per_batch, "mode": mode, "wrong_pages": wrong,
                "l3_write_gib_s": gib / best["l3_w"], "plain_write_gib_s": gib / best["plain_w"],
                "l3_group_write_gib_s": gib / best["l3_wg"], "group_commit_batches": group,
                "group_write_ratio": best["plain_w"] / best["l3_wg"],
                "l3_read_gib_s": gib / best["l3_r"], "plain_read_gib_s": gib / best["plain_r"],
                "write_ratio": best["plain_w"] / best["l3_w"], "read_ratio": best["plain_r"] / best["l3_r"],
                "plain_write_ms": best["plain_w"] * 1e3, "plain_read_ms": best["plain_r"] * 1e3,
                "l3_write_cpu_ms": best["cpu_l3_wg"] * 1e3, "l3_read_cpu_ms": best["cpu_l3_r"] * 1e3,
                "plain_write_cpu_ms": best["cpu_plain_w"] * 1e3, "plain_read_cpu_ms": best["cpu_plain_r"] * 1e3,
            }
            f = figures[name]
            rows.append([name, count, per_batch, mode, f["plain_write_gib_s"], f["l3_write_gib_s"], f["write_ratio"],
                         f["l3_group_write_gib_s"], f["group_write_ratio"], f["plain_read_gib_s"], f["l3_read_gib_s"],
                         f["read_ratio"], wrong])
        batch_bytes = args.batch_mib * 1024 * 1024
        data_sync_s, log_sync_s = _flush_floor(work, batch_bytes, batch_bytes // PAGE_SIZES[0], args.flush_samples,
                                               any(f["mode"] == "o_direct" for f in figures.values()))
        recovery_s, recovery_cpu_s, kept = _recovery(work, args.recovery_pages)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    io = Table(f"L3 store vs plain sequential I/O of the same bytes in {root} ({args.mib} MiB per page size, "
               f"best of {args.repeat})",
               ["page", "pages", "batch", "mode", "plain write GiB/s", "L3 write GiB/s (ack/batch)", "write_ratio",
                f"L3 write GiB/s (ack/{args.commit_mib} MiB)", "group_write_ratio", "plain read GiB/s",
                "L3 read GiB/s", "read_ratio", "wrong pages"])
    for row in rows:
        io.add(*row)
    floor = Table(f"The floor, per {args.mib} MiB: plain I/O time, the store's CPU beyond plain I/O's (process CPU, "
                  f"least of {args.repeat}), the two syncs of an acknowledged batch timed alone (median of "
                  f"{args.flush_samples}), and the ratios they leave at most: syncs alone, then with the CPU in series",
                  ["page", "plain write ms", "L3 write CPU ms over plain", "data + log fdatasync ms",
                   "write_ratio ceiling: syncs", "write_ratio ceiling: syncs + CPU",
                   "group_write_ratio ceiling: syncs", "group_write_ratio ceiling: syncs + CPU", "plain read ms",
                   "L3 read CPU ms over plain", "read_ratio ceiling: CPU"])
    syncs_s = data_sync_s + log_sync_s
    for name, f in figures.items():
        batches = -(-f["pages"] // f["batch_pages"])
        groups = -(-batches // f["group_commit_batches"])
        plain_w, plain_r = f["plain_write_ms"] / 1e3, f["plain_read_ms"] / 1e3
        cpu_w = max(0.0, f["l3_write_cpu_ms"] - f["plain_write_cpu_ms"]) / 1e3
        cpu_r = max(0.0, f["l3_read_cpu_ms"] - f["plain_read_cpu_ms"]) / 1e3
        f.update({"data_fdatasync_ms": data_sync_s * 1e3, "log_fdatasync_ms": log_sync_s * 1e3,
                  "write_ratio_ceiling": plain_w / (plain_w + batches * syncs_s),
                  "write_ratio_serial_ceiling": plain_w / (plain_w + cpu_w + batches * syncs_s),
                  "group_write_ratio_ceiling": plain_w / (plain_w + groups * syncs_s),
                  "group_write_ratio_serial_ceiling": plain_w / (plain_w + cpu_w + groups * syncs_s),
                  "read_ratio_serial_ceiling": plain_r / (plain_r + cpu_r)})
        floor.add(name, f["plain_write_ms"], cpu_w * 1e3, syncs_s * 1e3, f["write_ratio_ceiling"],
                  f["write_ratio_serial_ceiling"], f["group_write_ratio_ceiling"],
                  f["group_write_ratio_serial_ceiling"], f["plain_read_ms"], cpu_r * 1e3, f["read_ratio_serial_ceiling"])
    rec = Table("L3 recovery: log read + index rebuilt, no page data read (one core)",
                ["log entries", "pages kept", "wall s", "CPU s", "CPU s per million pages"])
    per_million = recovery_cpu_s * 1_000_000 / args.recovery_pages
    rec.add(args.recovery_pages, kept, recovery_s, recovery_cpu_s, per_million)
    emit("bench l3", [io, floor, rec], args.json, dir=str(root), sizes=figures,
         recovery={"entries": args.recovery_pages, "kept": kept, "seconds": recovery_s,
                   "cpu_seconds": recovery_cpu_s, "cpu_seconds_per_million": per_million})
    bad = sum(f["wrong_pages"] for f in figures.values())
    return 1 if bad or kept != args.recovery_pages else 0
