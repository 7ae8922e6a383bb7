"""The order of the node's writes into an L3 slot (:mod:`cpkv.tier.l3.order`) under the replay's L3
tier (:class:`~cpkv.tier.l3.tier.L3Tier`, the tier ``cpkv replay`` runs), in real gloo rank
processes sharing a host slab:

- the clean-stop spill (more pages than slots, placed and written in parts with no barrier between
  them) with rank 1 0 to 8 parts behind rank 0: every record the node's logs name checks good and
  holds its page's bytes;
- a page read by its owner before its writer rank has written it is a miss on every rank (one MIN),
  kept, not dropped, and served once written;
- a restart after a record was written but never logged (its sequence is reused by the next run)
  writes that slot again: the table is rewritten from the recovered index at open.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import pytest

from cpkv import _cpkv
from cpkv.runtime.launch import run_ranks
from cpkv.tier.l3 import L3Store
from cpkv.tier.l3.store import slots_for
from l3_pages import namespace, page

LAGS = list(range(9))
PAGES = 64
ROW_BYTES = 2016  # two layers of one payload: 4032-byte pages, one 4 KiB record each
WAIT_S = 60.0


def _cap(slots: int, ranks: int = 2) -> int:
    """The smallest cap that holds ``slots`` slots of this file's records."""
    slot_bytes = int(_cpkv.l3_record_bytes(2 * ROW_BYTES))
    return next(cap for cap in range(0, 1 << 22, 256) if slots_for(cap, slot_bytes, ranks) >= slots)


def _wait_for(path: Path, *alternatives: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not any(p.exists() for p in (path, *alternatives)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.001)


def _tier(rank: int, world: int, directory: Path, cap: int):
    """This rank's L3Tier over a host slab the ranks share (rank 0 fills row r with page(r))."""
    import torch
    import torch.distributed as dist

    from cpkv.tier.l3.tier import L3Tier
    from cpkv.tier.slab import HostSlab, SlabSpec

    def all_reduce_min(values: list[int], what: str) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return t.tolist()

    payloads = {"kv": SlabSpec((ROW_BYTES,), torch.uint8)}
    slab = HostSlab.create(payloads, num_pages=PAGES, num_layers=2, process_group=None, timeout_s=WAIT_S, pin=False)
    if rank == 0:
        rows = slab.rows("kv").numpy()
        for row in range(PAGES):
            rows[:, row, :] = page(row, 2 * ROW_BYTES).reshape(2, ROW_BYTES)
    dist.barrier()
    tier = L3Tier(directory, cap, slab=slab, payloads=payloads, num_layers=2, page_size=16, rank=rank,
                  cp_size=world, model="test-order", all_reduce_min=all_reduce_min)
    return slab, tier


def _behind(tier, rank: int, marks: Path, lag: int) -> None:
    """Rank 1's n-th put starts once rank 0's (n + lag)-th has returned (or rank 0's spill is over);
    rank 0 leaves a file per put in ``marks``. A condition, never a sleep."""
    put = tier.store.put
    calls = [0]

    def ordered(pages, **kwargs):
        n = calls[0]
        calls[0] += 1
        if rank == 1:
            _wait_for(marks / f"put-{n + lag}", marks / "done")
        placed = put(pages, **kwargs)
        if rank == 0:
            (marks / f"put-{n}").write_text("")
        return placed

    tier.store.put = ordered


def _logged_records_checked(directory: Path, world: int, store: L3Store) -> tuple[int, int]:
    """(records the node's logs name, how many fail their check or hold other bytes than their page):
    every record the logs name (recovered as a restart would), read from the data file and checked."""
    logs = [(directory / f"index-r{r}.log").read_bytes() for r in range(world)]
    index, _, valid = _cpkv.L3Index.recover(store.slots, world, logs, store.namespace_id, store.slot_bytes)
    assert valid == [len(log) for log in logs]
    lost = 0
    for key, slot, sequence in index.entries():
        with open(directory / "data-0.bin", "rb") as f:
            f.seek(slot * store.slot_bytes)
            record = np.frombuffer(f.read(store.slot_bytes), dtype=np.uint8)
        good = _cpkv.l3_check(record, store.namespace_id, key, sequence, store.page_bytes) is None
        lost += not (good and np.array_equal(record[:store.page_bytes], page(key - 1000, store.page_bytes)))
    return len(index.entries()), lost


def _clean_stop_spill(rank: int, world: int, root: str, lags: list[int], cap: int) -> dict:
    import torch.distributed as dist

    out = {}
    for lag in lags:
        directory = Path(root) / f"lag{lag}"
        if rank == 0:
            directory.mkdir()
        dist.barrier()
        slab, tier = _tier(rank, world, directory, cap)
        _behind(tier, rank, directory, lag)
        keys = np.arange(1000, 1000 + PAGES, dtype=np.int64)  # page of key k: slab row k - 1000
        placed = tier.spill([(keys, np.arange(PAGES, dtype=np.int64))])
        tier.flush()
        if rank == 0:
            (directory / "done").write_text("")
        dist.barrier()  # every rank's spill returned
        logged, lost = _logged_records_checked(directory, world, tier.store) if rank == 0 else (0, 0)
        out[str(lag)] = {"placed": placed, "slots": tier.store.slots, "logged": logged, "lost": lost,
                         "superseded": tier.store.counters.get("pages_superseded", 0)}
        dist.barrier()
        tier.close()
        slab.close()
    return out


@pytest.mark.timeout(300)
def test_the_clean_stop_spill_from_skewed_ranks_loses_no_logged_record(tmp_path: Path) -> None:
    """64 pages into 6 slots, placed and written in parts of 6, rank 1 ``lag`` parts behind rank 0."""
    results = run_ranks(_clean_stop_spill, 2, str(tmp_path), LAGS, _cap(6), timeout_s=240)
    report = []
    for lag in LAGS:
        a, b = results[0][str(lag)], results[1][str(lag)]
        report.append(f"lag {lag}: {a['lost']} of {a['logged']} logged records lost ({a['slots']} slots, "
                      f"{a['placed']} pages placed; superseded writes {[a['superseded'], b['superseded']]})")
        assert a["slots"] == 6 and a["placed"] == PAGES and a["logged"] == 6
    print("\n".join(report))
    assert all(results[0][str(lag)]["lost"] == 0 for lag in LAGS), "\n".join(report)


def _read_before_write(rank: int, world: int, root: str, cap: int) -> dict:
    """Both ranks spill the same pages; rank 1's writes wait until rank 0, the owner of every device
    page read, has read every one; then both settle (one MIN), and read them all again."""
    import torch.distributed as dist

    directory = Path(root)
    slab, tier = _tier(rank, world, directory, cap)
    put = tier.store.put

    def after_rank0_read(pages, **kwargs):
        if rank == 1:
            _wait_for(directory / "read")
        return put(pages, **kwargs)

    tier.store.put = after_rank0_read
    keys = np.arange(1000, 1016, dtype=np.int64)
    tier.spill([(keys, np.arange(16, dtype=np.int64))])
    tier.flush()
    device_pages = np.arange(0, 2 * len(keys), 2, dtype=np.int64)  # every one rank 0's (p % 2 == 0)
    rounds = []
    for round_ in range(2):
        found = tier.lookup_run(keys.tolist())
        positions, data = tier.read(found, device_pages)
        wrong = sum(not np.array_equal(data[j], page(int(keys[p]) - 1000, tier.page_bytes))
                    for j, p in enumerate(positions.tolist()))
        if rank == 0 and round_ == 0:
            (directory / "read").write_text("")
        dist.barrier()  # rank 1's writes are done (its spill returned before this barrier)
        served = tier.settle()
        rounds.append({"found": len(found), "read": len(positions), "wrong": wrong, "served": served,
                       "held": len(tier.store.index)})
    writers = [tier.store.index.writer(int(k)) for k in keys]
    out = {"rounds": rounds, "written_by_1": writers.count(1), "dropped": tier.store.counters["corrupt_dropped"],
           "digest": tier.digest()}
    dist.barrier()
    tier.close()
    slab.close()
    return out


@pytest.mark.timeout(300)
def test_a_page_read_before_its_writer_wrote_it_is_kept_and_served_once_written(tmp_path: Path) -> None:
    results = run_ranks(_read_before_write, 2, str(tmp_path), _cap(32), timeout_s=240)
    a = results[0]
    first, second = a["rounds"]
    print(f"16 pages, {a['written_by_1']} written by rank 1 after rank 0 read: served {first['served']} "
          f"then {second['served']}; held {first['held']} then {second['held']}, dropped {a['dropped']}")
    assert 0 < a["written_by_1"] < 16
    assert all(r["digest"] == a["digest"] for r in results)
    assert first["found"] == 16 and first["read"] == first["served"] == 16 - a["written_by_1"]
    assert first["held"] == 16 and all(r["dropped"] == 0 for r in results)  # not written yet: kept everywhere
    assert second["found"] == second["read"] == second["served"] == 16
    assert all(r["wrong"] == 0 for res in results for r in res["rounds"])


def _write_unlogged_and_die(directory: str) -> None:
    """Places and writes 4 pages without logging them (a group commit not reached), then dies."""
    store = L3Store(directory, _cap(4, 1), namespace(), rank=0, ranks_on_node=1)
    store.put([(k, page(k)) for k in (1, 2)])  # logged: sequences 1, 2
    store.put([(k, page(k)) for k in (3, 4)], durable=False)  # written, never logged: sequences 3, 4
    os.kill(os.getpid(), 9)


def test_a_restart_writes_over_a_record_that_was_written_but_never_logged(tmp_path: Path) -> None:
    """The next run reuses the unlogged records' sequences (3 and 4, from the log) for other keys in
    the same slots: those writes must land, so the table of the killed run cannot be kept."""
    proc = mp.get_context("spawn").Process(target=_write_unlogged_and_die, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -9
    with L3Store(tmp_path, _cap(4, 1), namespace(), rank=0, ranks_on_node=1) as store:
        assert sorted(k for k, _, _ in store.index.entries()) == [1, 2]
        placed = store.put([(k, page(k)) for k in (5, 6)])
        assert [(slot, sequence) for _, slot, sequence, _, _ in placed] == [(2, 3), (3, 4)]
        assert store.counters["pages_superseded"] == 0
        for key in (1, 2, 5, 6):
            assert np.array_equal(store.get(key), page(key))
