"""A clean stop of a vLLM engine with L3 leaves its host copy on disk; a kill -9 instead (or during
the stop) loses only what was never acknowledged and serves no wrong page. Through vLLM's real
Scheduler and worker-side OffloadingConnector (tests_vllm/engine.py), closed in vLLM 0.33's order:
the workers first, then the scheduler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cpkv._cpkv import L3_HEADER_BYTES, L3_RECORD_KEY_AT, l3_check
from cpkv.integrations.vllm.l3 import L3Geometry, l3_key
from engine import Engine, prompt
from test_l3 import assert_exact, disk_bytes, keys_of, l3_extra, serve
from test_l3_kill import LINE_TIMEOUT_S, _readline

BLOCKS = 5  # full blocks per prompt: 15 chunks over the three seeds, every host here holds an offer whole

HERE = Path(__file__).resolve().parent
SEEDS = (1, 2, 3)


def held_keys(eng: Engine) -> set[int]:
    """L3 keys of the chunks whose bytes are in host memory now."""
    return {k for k, _ in eng.manager._held_chunks()}


def durable(eng: Engine) -> set[int]:
    catalog = eng.manager.l3
    return {k for k, _, _ in catalog.index.entries() if k not in catalog._uncommitted}


def l3_keys(request: object) -> list[int]:
    return [l3_key(k) for k in keys_of(request)]


def replay(directory: Path, on_disk: set[int], chunks: dict[int, list[int]], cap: int | None = None) -> dict[str, int]:
    """A restarted engine (empty host, zeroed KV) serves each seed's prompt (``chunks``: seed -> its
    chunks' L3 keys): it recovers exactly ``on_disk``, its hits are exactly the leading chunks on
    disk, every block it has is exact, nothing is dropped; with ``cap``, its disk bytes stay within it."""
    eng = Engine(l3_extra(directory, host_blocks=32, **({} if cap is None else {"cpkv_l3_bytes": cap})))
    if cap is not None:
        assert disk_bytes(directory) <= cap, "the new life removed the stale stop copies before sizing its files"
    assert eng.manager.stats()["l3_recovered"] == len(on_disk)
    assert durable(eng) == on_disk, "the log names exactly the chunks acknowledged before"
    for seed in chunks:
        tokens = prompt(seed, blocks=BLOCKS)
        expected = 0
        while expected < BLOCKS and chunks[seed][expected] in on_disk:
            expected += 1
        hits, blocks = serve(eng, f"again{seed}", tokens)
        assert hits == expected, (seed, hits, expected)
        assert_exact(eng, tokens, blocks, BLOCKS)
    stats = eng.manager.stats()
    assert stats["l3_corrupt_dropped"] == 0 and eng.manager.num_pins == 0, stats
    if cap is not None:
        assert disk_bytes(directory) <= cap
    eng.close()
    return stats


@pytest.mark.parametrize("host_blocks", [16, 8])
def test_a_clean_stop_leaves_the_host_copy_on_disk_and_a_restart_serves_every_chunk(
        tmp_path: Path, host_blocks: int) -> None:
    """16 host blocks hold all 15 chunks (nothing evicted, nothing on disk before the stop); 8 hold
    some, the rest evicted to disk. Either way a restart hits on all 15, byte for byte."""
    eng = Engine(l3_extra(tmp_path, host_blocks=host_blocks))
    keys = {}
    for seed in SEEDS:
        keys[seed] = l3_keys(eng.add(f"r{seed}", prompt(seed, blocks=BLOCKS)))
        eng.run()
    before = eng.manager.stats()
    held = held_keys(eng)
    on_disk_before = durable(eng)
    assert len(held) == min(host_blocks, 15) and len(held | on_disk_before) == 15, before
    assert (before["evicted"] == 0) == (host_blocks == 16), before
    eng.close()
    stats = eng.manager.stats()
    assert stats["l3_stop_spilled"] == len(held - on_disk_before) and stats["l3_stop_unproven"] == 0, stats
    on_disk = durable(eng)
    assert on_disk == on_disk_before | held, "every chunk the host held is durable after the stop"
    assert not list(tmp_path.rglob("stop.bin")), "the catalog removed the stop copies it took in"
    after = replay(tmp_path, on_disk, keys)
    assert after["l3_promoted"] == 15, after


def test_a_stop_in_flight_takes_in_the_unacknowledged_spills_and_not_the_unfinished_store(tmp_path: Path) -> None:
    """The stop comes while a store (and the spill batch it carries) is queued on the worker, never
    run: vLLM's worker drops it at close. The evicted chunks are still in their rows, so the stop
    copies prove them and they reach the disk; the store's own chunks never reached host memory
    and are not logged."""
    eng = Engine(l3_extra(tmp_path, host_blocks=5))
    keys = {1: l3_keys(eng.add("r1", prompt(1, blocks=BLOCKS)))}
    eng.run()
    keys[2] = l3_keys(eng.add("r2", prompt(2, blocks=BLOCKS)))
    catalog = eng.manager.l3
    for _ in range(10):
        eng.step()
        if catalog.pending:
            break
    assert catalog.pending, "a store that evicted chunk(s) is in flight"
    resident = set(eng.manager.resident_keys())
    storing = {l3_key(k) for k in resident if eng.manager.is_storing(k)}
    assert storing, "r2's store has not run"
    spilled = {k for b in catalog.carried() for k in b.keys}
    eng.close()
    stats = eng.manager.stats()
    on_disk = durable(eng)
    assert spilled <= on_disk and not storing & on_disk, (stats, spilled, storing)
    assert storing <= set(keys[2]) and set(keys[1]) <= on_disk, "r1 is whole on disk"
    stats = replay(tmp_path, on_disk, keys)
    assert stats["l3_promoted"] >= BLOCKS


# 16 slots' worth (cpkv.tier.l3.store.slots_for): 14 data slots and 2 reserved for each stop copy, so an
# 8-block host holds more chunks than the stop can keep
SMALL_CAP = 24576 + 16 * 16480 + 100
SMALL_CAP_RESERVE = 2

CHILD = textwrap.dedent("""
    import json, logging, sys
    from pathlib import Path
    logging.disable(logging.WARNING)
    sys.path.insert(0, sys.argv[1])
    from engine import Engine, prompt
    from test_l3 import l3_extra
    from test_l3_stop import BLOCKS, SEEDS, durable, held_keys, l3_keys
    cap = {"cpkv_l3_bytes": int(sys.argv[4])} if len(sys.argv) > 4 else {}
    eng = Engine(l3_extra(Path(sys.argv[2]), host_blocks=8, **cap))
    chunks = {}
    for seed in SEEDS:
        chunks[seed] = l3_keys(eng.add(f"r{seed}", prompt(seed, blocks=BLOCKS)))
        eng.run()
    held = sorted(held_keys(eng))

    def pause():
        print(json.dumps({"durable": sorted(durable(eng)), "held": held, "chunks": chunks}), flush=True)
        sys.stdin.readline()  # killed -9 while waiting here

    if sys.argv[3] == "taking-in":  # the catalog's half of the stop, after it logged its first batch
        catalog = eng.manager.l3
        commit = catalog.commit
        def commit_then_pause(batch_ids):
            commit(batch_ids)
            pause()
        catalog.commit = commit_then_pause
        eng.close()
    if sys.argv[3] == "workers-closed":
        eng.worker.shutdown()  # the first half of a clean stop: the stop copies are on disk
    pause()
""")


def kill_at(directory: Path, when: str, *args: str) -> tuple[dict[str, Any], list[Path], int]:
    """Runs CHILD to ``when``, then kills it -9 there; returns its line, the stop copies and the
    directory's disk bytes at that moment."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(HERE), str(directory), when, *args],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = json.loads(_readline(child, LINE_TIMEOUT_S))
        stop_copies = list(directory.rglob("stop.bin"))
        at_kill = disk_bytes(directory)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=LINE_TIMEOUT_S)
        for pipe in (child.stdin, child.stdout):
            assert pipe is not None
            pipe.close()
    return line, stop_copies, at_kill


@pytest.mark.parametrize("when", ["running", "workers-closed"])
def test_a_kill_9_instead_of_a_clean_stop_loses_only_unacknowledged_chunks(tmp_path: Path, when: str) -> None:
    """kill -9 of a settled engine, or of one whose workers already left their stop copies: the
    restart recovers exactly the acknowledged chunks (not the host copy), removes the stale stop
    copy, and serves exact bytes."""
    line, stop_copies, _ = kill_at(tmp_path, when)
    acked, held = set(line["durable"]), set(line["held"])
    assert acked and held - acked, "some chunks were on disk, others only in host memory"
    assert len(stop_copies) == (when == "workers-closed"), stop_copies
    chunks = {int(seed): keys for seed, keys in line["chunks"].items()}
    replay(tmp_path, acked, chunks)
    assert not list(tmp_path.rglob("stop.bin")), "the next life removed the stop copy nobody took in"


def stop_copy_offsets(geometry: L3Geometry, rank: int) -> dict[int, int]:
    """L3 key -> byte offset of each good record in ``rank``'s stop copy (the key its header names,
    confirmed by the full check)."""
    data = np.fromfile(geometry.stop_copy(rank), dtype=np.uint8)
    namespace = geometry.namespace(rank, stop_copy=True)
    out = {}
    for offset in range(0, len(data), geometry.slot_bytes):
        record = data[offset:offset + geometry.slot_bytes]
        key_at = geometry.slot_bytes - L3_HEADER_BYTES + L3_RECORD_KEY_AT  # in the header, the record's last bytes
        header_key = int.from_bytes(record[key_at:key_at + 8].tobytes(), "little")
        if l3_check(record, namespace, header_key, 0, geometry.page_bytes) is None:
            out[header_key] = offset
    return out


def test_a_damaged_or_foreign_stop_copy_is_never_taken_in(tmp_path: Path) -> None:
    """Between the workers' close and the catalog's: one held row's stop copy gets a flipped payload
    bit, another row's record is replaced by a third row's (another key): neither is logged
    (``l3_stop_unproven``), the rest are, and a restart serves only exact bytes."""
    eng = Engine(l3_extra(tmp_path, host_blocks=16))
    chunks = {1: l3_keys(eng.add("r1", prompt(1, blocks=BLOCKS)))}
    eng.run()
    chunks[2] = l3_keys(eng.add("r2", prompt(2, blocks=BLOCKS)))
    eng.run()
    eng.worker.shutdown()
    geometry = eng.manager.l3.geometry
    slot_bytes = geometry.slot_bytes
    at = stop_copy_offsets(geometry, 0)
    assert len(at) == 10, "the reserve holds all ten held chunks"
    with open(geometry.stop_copy(0), "r+b") as f:
        f.seek(at[chunks[1][2]] + 1000)  # a payload byte of seed 1's third chunk
        byte = f.read(1)[0]
        f.seek(at[chunks[1][2]] + 1000)
        f.write(bytes([byte ^ 0x01]))
        f.seek(at[chunks[2][4]])
        other = f.read(slot_bytes)
        f.seek(at[chunks[2][1]])  # seed 2's second chunk's record is replaced by its fifth's
        f.write(other)
    eng.scheduler.shutdown()
    stats = eng.manager.stats()
    assert stats["l3_stop_unproven"] == 2 and stats["l3_stop_spilled"] == 8, stats
    on_disk = durable(eng)
    assert on_disk == set(chunks[1] + chunks[2]) - {chunks[1][2], chunks[2][1]}
    replay(tmp_path, on_disk, chunks)


def test_a_stop_keeps_disk_bytes_within_a_small_cap_at_every_sample(tmp_path: Path) -> None:
    """A cap whose stop-copy reserve (2 records per worker) is smaller than the 8-block host: disk
    bytes stay within the cap once the workers' stop copies are written, while the catalog takes
    them in, and after the stop. The reserve holds the newest job's leading chunks (seed 3's first
    two), which the restart serves byte for byte; the other 6 host chunks are counted, not kept."""
    extra = l3_extra(tmp_path, host_blocks=8, cpkv_l3_bytes=SMALL_CAP)
    eng = Engine(extra)
    chunks = {}
    for seed in SEEDS:
        chunks[seed] = l3_keys(eng.add(f"r{seed}", prompt(seed, blocks=BLOCKS)))
        eng.run()
        assert disk_bytes(tmp_path) <= SMALL_CAP
    held, before = held_keys(eng), durable(eng)
    assert len(held) == 8 and len(before) == 7 and not held & before
    samples = {}
    catalog = eng.manager.l3
    commit = catalog.commit

    def commit_sampled(batch_ids: list[int]) -> None:
        commit(batch_ids)
        samples.setdefault("taking in", disk_bytes(tmp_path))  # records and log entries written, stop copies still there

    catalog.commit = commit_sampled  # type: ignore[method-assign]
    eng.worker.shutdown()
    copies = sorted(tmp_path.rglob("stop.bin"))
    assert len(copies) == 1
    samples["stop copies written"] = disk_bytes(tmp_path)
    assert samples["stop copies written"] <= SMALL_CAP, samples
    assert copies[0].stat().st_blocks * 512 <= SMALL_CAP_RESERVE * catalog.geometry.slot_bytes
    eng.scheduler.shutdown()
    samples["stopped"] = disk_bytes(tmp_path)
    assert "taking in" in samples and max(samples.values()) <= SMALL_CAP, samples
    stats = eng.manager.stats()
    kept = set(chunks[3][:SMALL_CAP_RESERVE])
    assert stats["l3_stop_spilled"] == SMALL_CAP_RESERVE and stats["l3_stop_unproven"] == 0, stats
    assert stats["l3_not_spilled"] == 8 - SMALL_CAP_RESERVE, stats
    on_disk = durable(eng)
    assert on_disk == before | kept, "the stop kept the newest job's leading chunks"
    after = replay(tmp_path, on_disk, chunks, SMALL_CAP)
    leading = sum(next((i for i, k in enumerate(keys) if k not in on_disk), len(keys)) for keys in chunks.values())
    assert after["l3_promoted"] == leading and leading >= 2 + SMALL_CAP_RESERVE, after  # seed 3's 2 among them


@pytest.mark.parametrize("when", ["workers-closed", "taking-in"])
def test_a_kill_9_during_the_stop_stays_within_a_small_cap(tmp_path: Path, when: str) -> None:
    """kill -9 once the workers' stop copies are on disk, or after the catalog logged what it took
    in from them (the stop copies still there): disk bytes are within the cap at the kill and in the
    next life, which recovers exactly what was logged and serves it byte for byte."""
    line, stop_copies, at_kill = kill_at(tmp_path, when, str(SMALL_CAP))
    assert len(stop_copies) == 1 and at_kill <= SMALL_CAP, (stop_copies, at_kill)
    acked, held = set(line["durable"]), set(line["held"])
    chunks = {int(seed): keys for seed, keys in line["chunks"].items()}
    if when == "taking-in":
        assert held & acked == set(chunks[3][:SMALL_CAP_RESERVE]), "the reserve's chunks were logged"
    else:
        assert not held & acked
    replay(tmp_path, acked, chunks, SMALL_CAP)
    assert not list(tmp_path.rglob("stop.bin"))
