"""The node's L3 read-staging area (``cpkv.tier.l3.staging``) over a real store, in real gloo
processes: each record is read from disk once per node, a late rank is served from shared memory,
a failed record is the same miss on every rank and read once, a claimant killed mid-read costs the
others one wait and never a wrong byte, a copy overwritten under its reader is not used, and no
name is left in /dev/shm. Pages name their key (``l3_pages.page``), so a wrong byte is caught by a
check that shares no code with the store."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cpkv._cpkv import L3Staging
from cpkv.errors import InvalidArgumentError
from cpkv.runtime.launch import run_ranks
from cpkv.tier.l3 import L3Store
from cpkv.tier.l3.staging import L3ReadStaging, default_entries
from l3_pages import PAGE_BYTES, namespace, page

CAP = 200 * 4096 + 64 * 1024
KEYS = list(range(1, 41))


def _fill(directory: str, world: int = 1) -> None:
    """Every key on disk, written by rank 0 of a node of ``world`` ranks (the shape the readers open)."""
    with L3Store(directory, CAP, namespace(), rank=0, ranks_on_node=world) as store:
        store.put([(k, page(k)) for k in KEYS], writers=[0] * len(KEYS))


def _open(directory: str, rank: int, world: int, entries: int = 64, wait_s: float = 20.0):
    import torch.distributed as dist

    store = L3Store(directory, CAP, namespace(), rank=rank, ranks_on_node=world)
    group = dist.new_group(list(range(world)), backend="gloo") if dist.is_initialized() else None
    staging = L3ReadStaging(store, entries, lock=threading.Lock(), process_group=group, wait_s=wait_s,
                            timeout_s=30.0)
    return store, staging


def _read(store: L3Store, staging: L3ReadStaging, keys: list[int]) -> tuple[list, int]:
    """Reads ``keys`` through the area; returns the reasons and the count of wrong pages served."""
    found = [(k, *store.index.peek(k)) for k in keys]
    out = np.empty((len(found), PAGE_BYTES), dtype=np.uint8)
    reasons = staging.read(found, out)
    wrong = sum(int(not np.array_equal(out[i], page(k))) for i, k in enumerate(keys) if reasons[i] is None)
    return reasons, wrong


def _in_turn(rank: int, world: int, directory: str) -> dict:
    """Rank 0 reads every key, then (barrier) each other rank in turn: only rank 0 touches the disk."""
    import torch.distributed as dist

    store, staging = _open(directory, rank, world)
    results = {}
    for turn in range(world):
        if turn == rank:
            results["reasons"], results["wrong"] = _read(store, staging, KEYS)
            # Again: the area still holds every record (64 entries, 40 records), no disk read.
            again, wrong_again = _read(store, staging, KEYS)
            results["wrong"] += wrong_again
            assert again == results["reasons"]
        dist.barrier()
    results.update(stats=staging.stats(), run_id=staging.run_id)
    staging.close()
    store.close()
    return results


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_each_record_is_read_from_disk_once_per_node(tmp_path: Path, world: int) -> None:
    _fill(str(tmp_path), world)
    results = run_ranks(_in_turn, world, str(tmp_path))
    assert all(r["wrong"] == 0 and r["reasons"] == [None] * len(KEYS) for r in results)
    reads = [r["stats"]["l3_disk_reads"] for r in results]
    assert reads == [len(KEYS)] + [0] * (world - 1), reads  # not world x
    for r in results[1:]:
        assert r["stats"]["l3_staging_hits"] == 2 * len(KEYS)
    assert results[0]["stats"]["l3_staging_hits"] == len(KEYS)  # its second pass
    assert [n for n in os.listdir("/dev/shm") if results[0]["run_id"] in n] == []


def _damage(directory: Path, keys: list[int], world: int) -> None:
    with L3Store(str(directory), CAP, namespace(), rank=0, ranks_on_node=world) as store:
        where = {k: store.index.peek(k) for k in keys}
        slot_bytes, per_file = store.slot_bytes, store.slots_per_file
    for slot, _ in where.values():
        with open(directory / f"data-{slot // per_file}.bin", "r+b") as f:
            at = (slot % per_file) * slot_bytes + 9
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x5A]))


@pytest.mark.timeout(300)
def test_a_damaged_record_is_the_same_miss_on_every_rank_read_once(tmp_path: Path) -> None:
    _fill(str(tmp_path), 2)
    damaged = [3, 17, 29]
    _damage(tmp_path, damaged, 2)
    results = run_ranks(_in_turn, 2, str(tmp_path))
    expected = ["checksum" if k in damaged else None for k in KEYS]
    assert [r["reasons"] for r in results] == [expected, expected]
    assert all(r["wrong"] == 0 for r in results)
    a, b = (r["stats"] for r in results)
    assert a["l3_disk_read_failures"] == len(damaged) and a["l3_disk_reads"] == len(KEYS)
    assert b["l3_disk_reads"] == 0 and b["l3_staging_failures_seen"] == 2 * len(damaged)


def _killed_claimant(rank: int, world: int, directory: str, marker: str, wait_s: float) -> dict:
    """Rank 1 claims every entry, then dies (SIGKILL) before reading; the others, once it has
    claimed, read the same keys: they wait ``wait_s``, one takes the claims over, all get every
    byte right."""
    store, staging = _open(directory, rank, world, wait_s=wait_s)
    if rank == 1:
        def die() -> None:
            Path(marker).write_text("claimed")
            os.kill(os.getpid(), signal.SIGKILL)

        staging.after_claim = die
        _read(store, staging, KEYS)
        raise AssertionError("the claimant should be dead")
    deadline = time.monotonic() + 60
    while not Path(marker).exists():  # a condition, not the clock
        assert time.monotonic() < deadline, "rank 1 never claimed"
        time.sleep(0.01)
    states = {staging.native.entry_state(store.index.peek(k)[0])[2] for k in KEYS}
    started = time.monotonic()
    reasons, wrong = _read(store, staging, KEYS)
    return {"reasons": reasons, "wrong": wrong, "seconds": time.monotonic() - started, "states": sorted(states),
            "stats": staging.stats(), "run_id": staging.run_id}


@pytest.mark.timeout(300)
def test_a_claimant_killed_mid_read_hangs_no_one(tmp_path: Path) -> None:
    _fill(str(tmp_path), 3)
    wait_s = 2.0
    marker = str(tmp_path / "claimed")
    results = run_ranks(_killed_claimant, 3, str(tmp_path), marker, wait_s, collective_timeout_s=10,
                        expect_failures=True)
    survivors = [results[0], results[2]]
    assert all(isinstance(r, dict) for r in survivors), results
    for r in survivors:
        assert r["states"] == [1]  # every entry was left "reading" by the dead claimant
        assert r["reasons"] == [None] * len(KEYS) and r["wrong"] == 0
        assert r["seconds"] < wait_s + 10, r["seconds"]
        assert r["stats"]["l3_staging_waits"] == len(KEYS)
    # One survivor takes each claim over and reads it; the other is served from the area (or
    # takes over too if both timed out at once): never more than one disk read per survivor.
    takeovers = sum(r["stats"]["l3_staging_takeovers"] for r in survivors)
    reads = sum(r["stats"]["l3_disk_reads"] for r in survivors)
    assert takeovers == reads and len(KEYS) <= reads <= 2 * len(KEYS)
    assert [n for n in os.listdir("/dev/shm") if survivors[0]["run_id"] in n] == []


def test_a_copy_reused_under_its_reader_is_not_served(tmp_path: Path) -> None:
    """Between a reader's copy and its re-check, another rank claims the entry for another record:
    the copy is dropped, the page read from disk (counted), the bytes right."""
    _fill(str(tmp_path))
    store, staging = _open(str(tmp_path), 0, 1, entries=8)
    reasons, wrong = _read(store, staging, [5])  # claimed, read, published
    assert reasons == [None] and wrong == 0 and staging.counters["l3_disk_reads"] == 1
    slot, sequence = store.index.peek(5)
    scratch = np.empty((1, PAGE_BYTES), dtype=np.uint8)

    def another_rank_claims() -> None:
        staging.native.set_copy_hook(None)
        codes, _, _ = staging.native.take([99], [slot + 8], [sequence + 1000], scratch)  # same entry
        assert codes == [L3Staging.CLAIMED]

    staging.native.set_copy_hook(another_rank_claims)
    reasons, wrong = _read(store, staging, [5])
    assert reasons == [None] and wrong == 0
    assert staging.counters["l3_staging_reused"] == 1 and staging.counters["l3_disk_reads"] == 2
    assert staging.counters["l3_staging_hits"] == 0
    # The entry is another record's now (being read): a third read of key 5 is busy, read privately.
    reasons, wrong = _read(store, staging, [5])
    assert reasons == [None] and wrong == 0 and staging.counters["l3_staging_busy"] == 1
    staging.close()
    store.close()


def test_bad_arguments_are_typed_errors(tmp_path: Path) -> None:
    _fill(str(tmp_path))
    store = L3Store(str(tmp_path), CAP, namespace())
    for entries in (0, -1, True, 2.0, L3Staging.MAX_ENTRIES + 1):
        with pytest.raises(InvalidArgumentError, match="entries"):
            L3ReadStaging(store, entries, lock=threading.Lock(), process_group=None, wait_s=1, timeout_s=5)
    staging = L3ReadStaging(store, 1 << 20, lock=threading.Lock(), process_group=None, wait_s=1, timeout_s=5)
    assert staging.entries == store.slots  # more entries than slots are never used
    found = [(1, *store.index.peek(1))]
    with pytest.raises(InvalidArgumentError, match="out must be uint8"):
        staging.read(found, np.empty((1, PAGE_BYTES - 1), dtype=np.uint8))
    with pytest.raises(InvalidArgumentError, match="reason"):
        staging.native.publish([found[0][1]], [(found[0][2] << 20) | 1], np.zeros(4096, np.uint8), [0], ["nope"])
    with pytest.raises(InvalidArgumentError, match="not a claim"):
        staging.native.publish([found[0][1]], [found[0][2] << 20 | 2], np.zeros(4096, np.uint8), [0], [None])
    slot, claim = found[0][1], (found[0][2] << 20) | 1
    before = staging.native.entry_state(slot)
    for slots, claims, named in (([slot], [claim, claim], "1 slots for 2 claims"), ([slot], [claim + 1], "not a claim")):
        with pytest.raises(InvalidArgumentError, match=named):
            staging.native.abandon(slots, claims)
    assert staging.native.entry_state(slot) == before
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        staging.native.wait([1], [0], [1], [0], np.empty((1, PAGE_BYTES), np.uint8), float("nan"))
    staging.close()
    with pytest.raises(InvalidArgumentError, match="closed"):
        staging.read(found, np.empty((1, PAGE_BYTES), dtype=np.uint8))
    store.close()
    assert 64 <= default_entries(PAGE_BYTES, 1 << 30) <= L3Staging.MAX_ENTRIES
    assert default_entries(PAGE_BYTES, 10) == 10
