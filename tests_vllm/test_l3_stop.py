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

import pytest

from cpkv._cpkv import L3_HEADER_BYTES
from cpkv.integrations.vllm.l3 import l3_key
from engine import Engine, prompt
from test_l3 import BLOCKS, assert_exact, keys_of, l3_extra, serve
from test_l3_kill import LINE_TIMEOUT_S, _readline

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


def replay(directory: Path, on_disk: set[int], chunks: dict[int, list[int]]) -> dict[str, int]:
    """A restarted engine (empty host, zeroed KV) serves each seed's prompt (``chunks``: seed -> its
    chunks' L3 keys): it recovers exactly ``on_disk``, its hits are exactly the leading chunks on
    disk, every block it has is exact, nothing is dropped."""
    eng = Engine(l3_extra(directory, host_blocks=32))
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


CHILD = textwrap.dedent("""
    import json, logging, sys
    from pathlib import Path
    logging.disable(logging.WARNING)
    sys.path.insert(0, sys.argv[1])
    from engine import Engine, prompt
    from test_l3 import BLOCKS, l3_extra
    from test_l3_stop import SEEDS, durable, held_keys, l3_keys
    eng = Engine(l3_extra(Path(sys.argv[2]), host_blocks=8))
    chunks = {}
    for seed in SEEDS:
        chunks[seed] = l3_keys(eng.add(f"r{seed}", prompt(seed, blocks=BLOCKS)))
        eng.run()
    if sys.argv[3] == "workers-closed":
        eng.worker.shutdown()  # the first half of a clean stop: the stop copies are on disk
    print(json.dumps({"durable": sorted(durable(eng)), "held": sorted(held_keys(eng)), "chunks": chunks}), flush=True)
    sys.stdin.readline()  # killed -9 while waiting here
""")


@pytest.mark.parametrize("when", ["running", "workers-closed"])
def test_a_kill_9_instead_of_a_clean_stop_loses_only_unacknowledged_chunks(tmp_path: Path, when: str) -> None:
    """kill -9 of a settled engine, or of one whose workers already left their stop copies: the
    restart recovers exactly the acknowledged chunks (not the host copy), removes the stale stop
    copy, and serves exact bytes."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(HERE), str(tmp_path), when], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = json.loads(_readline(child, LINE_TIMEOUT_S))
        stop_copies = list(tmp_path.rglob("stop.bin"))
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=LINE_TIMEOUT_S)
        for pipe in (child.stdin, child.stdout):
            assert pipe is not None
            pipe.close()
    acked, held = set(line["durable"]), set(line["held"])
    assert acked and held - acked, "some chunks were on disk, others only in host memory"
    assert len(stop_copies) == (when == "workers-closed"), stop_copies
    chunks = {int(seed): keys for seed, keys in line["chunks"].items()}
    replay(tmp_path, acked, chunks)
    assert not list(tmp_path.rglob("stop.bin")), "the next life removed the stop copy nobody took in"


def test_a_damaged_or_foreign_stop_copy_is_never_taken_in(tmp_path: Path) -> None:
    """Between the workers' close and the catalog's: one held row's stop copy gets a flipped payload
    bit, another row's record is replaced by a third row's (another key): neither is logged
    (``l3_stop_unproven``), the rest are, and a restart serves only exact bytes."""
    eng = Engine(l3_extra(tmp_path, host_blocks=16))
    chunks = {1: l3_keys(eng.add("r1", prompt(1, blocks=BLOCKS)))}
    eng.run()
    chunks[2] = l3_keys(eng.add("r2", prompt(2, blocks=BLOCKS)))
    eng.run()
    rows = dict(eng.manager._held_chunks())
    eng.worker.shutdown()
    geometry = eng.manager.l3.geometry
    slot_bytes = geometry.slot_bytes
    with open(geometry.stop_copy(0), "r+b") as f:
        at = rows[chunks[1][2]] * slot_bytes + L3_HEADER_BYTES + 1000  # a payload byte of seed 1's third chunk
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x01]))
        f.seek(rows[chunks[2][4]] * slot_bytes)
        other = f.read(slot_bytes)
        f.seek(rows[chunks[2][1]] * slot_bytes)  # seed 2's second row now holds its fifth chunk's record
        f.write(other)
    eng.scheduler.shutdown()
    stats = eng.manager.stats()
    assert stats["l3_stop_unproven"] == 2 and stats["l3_stop_spilled"] == 8, stats
    on_disk = durable(eng)
    assert on_disk == set(chunks[1] + chunks[2]) - {chunks[1][2], chunks[2][1]}
    replay(tmp_path, on_disk, chunks)
