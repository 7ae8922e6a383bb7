"""L3 after kill -9: real processes SIGKILLed at random points while they write, evict and compact
(>= 200 kills in this file), each restart checked against the log of what was acknowledged: every
acknowledged page that no later placement evicted is found with exact bytes (acknowledged: per
batch, or at a group commit for batches written with ``durable=False``), nothing found is
wrong, and the disk holds at most the cap plus one batch. A clean stop keeps every page.

The writer reports each batch's evictions before writing it and its keys once :meth:`put`
returned (acknowledged durable), through a pipe; the test waits on that pipe and on process exit,
never on the clock.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

from cpkv.tier.l3 import L3Store, disk_bytes
from l3_pages import namespace, page

CAP = 16 * 4096 + 64 * 1024  # 25 slots: evictions and log compactions in every few batches
MAX_BATCH = 6


def _writer(directory: str, first_key: int, seed: int, batches: int, conn) -> None:
    rng = np.random.default_rng(seed)
    store = L3Store(directory, CAP, namespace())
    key = first_key
    unacked: list[int] = []
    for _ in range(batches):
        n = int(rng.integers(1, MAX_BATCH + 1))
        keys = list(range(key, key + n))
        key += n
        # What this batch will evict is decided before any byte is written: say it first.
        victims = _victims(store.index, store.slots, len(keys))
        conn.send(("evicts", victims))
        unacked = [k for k in unacked if k not in victims]  # written, then evicted before its commit
        # Half the batches wait for a later group commit (put(durable=False), then flush).
        durable = bool(rng.random() < 0.5)
        store.put([(k, page(k)) for k in keys], durable=durable)
        unacked += keys
        if durable:
            conn.send(("acked", unacked))
            unacked = []
    store.close()
    conn.send(("acked", unacked))
    conn.send(("closed", []))


def _victims(index, slots: int, new: int) -> list[int]:
    """The keys a batch of ``new`` new pages evicts: the least recently used beyond the free slots."""
    free = slots - len(index)
    if new <= free:
        return []
    return _oldest(index, new - free)


def _oldest(index, n: int) -> list[int]:
    # entries() is in sequence order; with no lookups in the writer, that is the eviction order.
    return [k for k, _, _ in index.entries()[:n]]


def _check_restart(directory: str, present: set[int], batch_bytes: int) -> tuple[int, int]:
    """Opens the store as a restart does; returns (acknowledged pages found, pages found)."""
    assert disk_bytes(directory) <= CAP + batch_bytes
    with L3Store(directory, CAP, namespace()) as store:
        assert disk_bytes(directory) <= CAP + batch_bytes
        store.index.check_invariants()
        found = 0
        for key, slot, sequence in store.index.entries():
            got = store.read(key, slot, sequence)
            if got is not None:
                assert np.array_equal(got, page(key)), f"wrong bytes served for key {key}"
                found += 1
            else:  # a record whose write the kill cut short: a counted miss, never a wrong page
                assert key not in present, f"acknowledged key {key} failed its check: {store.last_reject}"
        keys = {k for k, _, _ in store.index.entries()}
        missing = present - keys
        assert not missing, f"acknowledged pages lost: {sorted(missing)[:10]}"
        return len(present), found


def _run_cycles(directory: str, cycles: int, seed: int) -> tuple[int, int]:
    ctx = mp.get_context("fork")
    rng = np.random.default_rng(seed)
    present: set[int] = set()
    kills = 0
    batch_bytes = MAX_BATCH * 4096
    for cycle in range(cycles):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_writer, args=(directory, cycle * 1000 + 1, seed * 7919 + cycle, 40, writer))
        proc.start()
        writer.close()
        acks_before_kill = int(rng.integers(0, 12))
        acks = 0
        messages = []
        while acks < acks_before_kill:
            try:
                message = reader.recv()
            except EOFError:
                break
            messages.append(message)
            acks += message[0] == "acked"
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        kills += proc.exitcode == -signal.SIGKILL
        while True:  # what the writer said before it died
            try:
                messages.append(reader.recv())
            except EOFError:
                break
        reader.close()
        for kind, keys in messages:
            if kind == "evicts":
                present.difference_update(keys)
            elif kind == "acked":
                present.update(keys)
        _check_restart(directory, present, batch_bytes)
    return kills, len(present)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [1, 2])
def test_every_acknowledged_page_survives_kill_9(tmp_path, seed):
    kills, present = _run_cycles(str(tmp_path), 110, seed)
    assert kills >= 100  # the few that finished their 40 batches first were killed after exiting
    assert present > 0


def test_a_clean_stop_keeps_every_page(tmp_path):
    ctx = mp.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_writer, args=(str(tmp_path), 1, 3, 30, writer))
    proc.start()
    writer.close()
    present: set[int] = set()
    while True:
        try:
            kind, keys = reader.recv()
        except EOFError:
            break
        if kind == "evicts":
            present.difference_update(keys)
        elif kind == "acked":
            present.update(keys)
    proc.join()
    assert proc.exitcode == 0
    with L3Store(tmp_path, CAP, namespace()) as store:
        live = store.index.entries()
        assert {k for k, _, _ in live} == present and len(present) == store.slots
        assert all(np.array_equal(store.read(k, s, q), page(k)) for k, s, q in live)
