"""cpkv's L3 under vLLM (``cpkv_l3_dir`` / ``cpkv_l3_bytes``), through vLLM's real Scheduler and
worker-side OffloadingConnector on the CPU (tests_vllm/engine.py): chunks the host evicts are
written to disk before their rows are reused, and a second engine on the same directory serves
them as hits, byte for byte; a foreign namespace and a damaged record are misses, never served;
a block-hash root that changes across restarts is refused; bad settings fail at construction.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.v1.kv_offload.base import make_offload_key

from cpkv.errors import InvalidArgumentError
from cpkv.integrations.vllm import CpkvOffloadConfig
from cpkv.integrations.vllm.config import check_stable_block_hashes
from cpkv.integrations.vllm.l3 import l3_key
from engine import BLOCK_TOKENS, NUM_LAYERS, Engine, block_bytes, cpkv_extra, prompt

CHECK_TIMEOUT_S = 60.0
BLOCKS = 4  # full blocks per prompt (and 5 more tokens: vLLM may load all four): a prompt's offer fits a host of 4 whole


def l3_extra(directory: Path, host_blocks: int = 4, **overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"cpkv_host_blocks": host_blocks, "cpkv_l3_dir": str(directory), "cpkv_l3_bytes": 1 << 22}
    return cpkv_extra(**{**settings, **overrides})


def keys_of(request: Any) -> list[bytes]:
    return [make_offload_key(h, 0) for h in request.block_hashes]


def first_engine(directory: Path, seeds: tuple[int, ...] = (1, 2, 3)) -> tuple[dict[str, Any], dict[int, list[bytes]], set[int]]:
    """Runs one prompt per seed on a 4-block host (each evicts the one before) and stops cleanly.
    Returns its stats before the stop, each seed's keys and the L3 keys durable on disk after it."""
    eng = Engine(l3_extra(directory))
    keys = {}
    for seed in seeds:
        keys[seed] = keys_of(eng.add(f"r{seed}", prompt(seed, blocks=BLOCKS)))
        eng.run()
    stats = eng.manager.stats()
    catalog = eng.manager.l3
    eng.close()
    on_disk = {k for k, _, _ in catalog.index.entries()}
    return stats, keys, on_disk


def leading(keys: list[bytes], on_disk: set[int]) -> int:
    n = 0
    while n < len(keys) and l3_key(keys[n]) in on_disk:
        n += 1
    return n


def serve(eng: Engine, req_id: str, tokens: list[int]) -> tuple[int, list[int]]:
    """Adds the request and steps (waiting on the catalog's record checks, never on the clock)
    until it computes; returns its hit blocks and its device blocks."""
    eng.add(req_id, tokens)
    for _ in range(30):
        out = eng.step()
        if req_id in out.num_scheduled_tokens:
            eng.run()
            return eng.started_at[req_id] // BLOCK_TOKENS, eng.last_blocks[req_id]
        assert eng.manager.l3.wait_idle(CHECK_TIMEOUT_S), "an L3 record check did not finish"
    raise AssertionError(f"{req_id} was never scheduled")


def assert_exact(eng: Engine, tokens: list[int], blocks: list[int], count: int) -> None:
    for index in range(count):
        chunk = tokens[index * BLOCK_TOKENS: (index + 1) * BLOCK_TOKENS]
        for layer in range(NUM_LAYERS):
            assert torch.equal(eng.page(layer, blocks[index]), block_bytes(layer, index, chunk, eng.page_bytes)), \
                (index, layer)


def test_a_restarted_engine_serves_what_the_first_evicted_to_l3(tmp_path: Path) -> None:
    stats, keys, on_disk = first_engine(tmp_path)
    assert stats["l3_spilled"] == stats["evicted"] > 0, stats  # every evicted chunk went to disk
    assert stats["l3_committed"] == stats["l3_spilled"] and stats["l3_pending_batches"] == 0, stats
    expected_hits = leading(keys[1], on_disk)
    assert expected_hits >= 2, f"seed 1's chunks were evicted to disk: {expected_hits}"

    eng = Engine(l3_extra(tmp_path, host_blocks=16))  # a fresh process's state: empty host, zeroed KV
    assert eng.manager.stats()["l3_recovered"] == len(on_disk)
    tokens = prompt(1, blocks=BLOCKS)
    hits, blocks = serve(eng, "again", tokens)
    after = eng.manager.stats()
    assert hits == expected_hits and after["l3_promoted"] == hits and after["l3_verified"] == hits, after
    assert_exact(eng, tokens, blocks, hits)  # filled from disk into host rows, then into the device
    assert after["l3_corrupt_dropped"] == 0 and eng.manager.num_pins == 0
    eng.manager.check()
    eng.close()


def test_a_foreign_namespace_is_never_served(tmp_path: Path) -> None:
    _, keys, on_disk = first_engine(tmp_path, seeds=(1, 2))
    assert leading(keys[1], on_disk) >= 1
    # Offloaded chunks of two GPU blocks: another page size, so another namespace.
    eng = Engine(l3_extra(tmp_path, host_blocks=16, block_size=2 * BLOCK_TOKENS))
    assert eng.manager.stats()["l3_recovered"] == 0
    hits, _ = serve(eng, "again", prompt(1, blocks=BLOCKS))
    stats = eng.manager.stats()
    assert hits == 0 and stats["l3_promoted"] == 0 and stats["l3_hits"] == 0, stats
    eng.close()


def test_a_damaged_record_is_a_counted_miss(tmp_path: Path) -> None:
    _, keys, on_disk = first_engine(tmp_path)
    assert leading(keys[1], on_disk) >= 2
    eng = Engine(l3_extra(tmp_path, host_blocks=16))
    catalog = eng.manager.l3
    slot, _ = catalog.index.peek(l3_key(keys[1][1]))
    file, offset = catalog.geometry.where(slot)
    path = catalog.geometry.shard_dir(0) / f"data-{file}.bin"
    with open(path, "r+b") as f:  # one payload bit of the second chunk's record
        f.seek(offset + 100)
        byte = f.read(1)[0]
        f.seek(offset + 100)
        f.write(bytes([byte ^ 0x10]))
    tokens = prompt(1, blocks=BLOCKS)
    hits, blocks = serve(eng, "again", tokens)
    stats = eng.manager.stats()
    assert hits == 1, "the first chunk is served, the damaged second one ends the hit"
    assert stats["l3_corrupt_dropped"] == 1 and stats["l3_rejects"] == {"shard 0: checksum": 1}, stats
    assert catalog.index.peek(l3_key(keys[1][1])) is None, "dropped from the index"
    assert_exact(eng, tokens, blocks, BLOCKS)  # the rest was computed, not read from the bad record
    eng.close()


@pytest.mark.parametrize(("algo", "seed", "refused"), [
    ("xxhash", None, True), ("xxhash_cbor", None, True), ("xxhash", "7", False),
    ("sha256", None, False), ("sha256_cbor", None, False),
])
def test_a_block_hash_root_that_changes_across_restarts_is_refused(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                                   seed: str | None, refused: bool) -> None:
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    if refused:
        with pytest.raises(InvalidArgumentError, match="cpkv_l3_dir.*PYTHONHASHSEED"):
            check_stable_block_hashes(algo)
    else:
        check_stable_block_hashes(algo)


def test_the_refusal_fires_when_vllm_builds_the_connector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(InvalidArgumentError, match="cpkv_l3_dir.*xxhash"):
        Engine(l3_extra(tmp_path), hash_algo="xxhash")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    Engine(l3_extra(tmp_path), hash_algo="xxhash").close()


def test_unknown_hash_algorithm_needs_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(InvalidArgumentError, match="cpkv_l3_dir.*PYTHONHASHSEED"):
        check_stable_block_hashes(None)
    monkeypatch.setenv("PYTHONHASHSEED", "1")
    check_stable_block_hashes(None)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"cpkv_l3_dir": "DIR"}, "cpkv_l3_dir.*cpkv_l3_bytes"),
    ({"cpkv_l3_bytes": 1 << 20}, "cpkv_l3_bytes.*cpkv_l3_dir"),
    ({"cpkv_l3_dir": "DIR/missing", "cpkv_l3_bytes": 1 << 20}, "cpkv_l3_dir.*existing directory"),
    ({"cpkv_l3_dir": 7, "cpkv_l3_bytes": 1 << 20}, "cpkv_l3_dir"),
    ({"cpkv_l3_dir": "DIR", "cpkv_l3_bytes": 0}, "cpkv_l3_bytes.*got 0"),
    ({"cpkv_l3_dir": "DIR", "cpkv_l3_bytes": True}, "cpkv_l3_bytes.*got True"),
    ({"cpkv_l3_dir": "DIR", "cpkv_l3_bytes": "1M"}, "cpkv_l3_bytes.*'1M'"),
    ({"cpkv_l3_dir": "DIR", "cpkv_l3_bytes": 1.5}, "cpkv_l3_bytes.*1.5"),
])
def test_bad_l3_settings_are_refused_naming_the_key(tmp_path: Path, overrides: dict[str, Any], named: str) -> None:
    extra = {k: (v.replace("DIR", str(tmp_path)) if isinstance(v, str) else v) for k, v in overrides.items()}
    with pytest.raises(InvalidArgumentError, match=named):
        CpkvOffloadConfig.from_extra_config(cpkv_extra(**extra))


def test_a_cap_that_holds_no_chunk_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="cpkv_l3_bytes.*holds no chunk"):
        Engine(cpkv_extra(cpkv_l3_dir=str(tmp_path), cpkv_l3_bytes=4096))


def disk_bytes(directory: Path) -> int:
    """Allocated bytes of every file under ``directory`` (the shards' data files and the log)."""
    return sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())


def test_a_small_cap_stays_bounded_compacts_its_log_and_restarts_warm(tmp_path: Path) -> None:
    """Four slots for 24 chunks: the catalog keeps the last ones, its log is compacted (more
    entries than twice the slots), disk bytes stay within the cap, and a restart serves exactly
    the chunks the log names. Four slots leave no stop-copy reserve (an eighth of them): the stop
    keeps none of the host's chunks."""
    slot_bytes, cap = 16384, 24576 + 4 * 16480 + 100  # cpkv.tier.l3.store.slots_for: 4 slots
    extra = cpkv_extra(cpkv_host_blocks=4, cpkv_l3_dir=str(tmp_path), cpkv_l3_bytes=cap)
    eng = Engine(extra)
    keys = {}
    for seed in range(1, 7):
        keys[seed] = keys_of(eng.add(f"r{seed}", prompt(seed, blocks=BLOCKS)))
        eng.run()
        assert disk_bytes(tmp_path) <= cap
    stats = eng.manager.stats()
    assert eng.manager.l3.geometry.slot_bytes == slot_bytes and stats["l3_slots"] == 4, stats
    assert stats["l3_committed"] > 8 and stats["l3_compactions"] >= 1 and stats["l3_resident"] == 4, stats
    assert eng.manager.l3.geometry.stop_rows == 0
    eng.close()  # no reserve for stop copies: the host's 4 chunks are not kept
    on_disk = {k for k, _, _ in eng.manager.l3.index.entries()}
    stats = eng.manager.stats()
    assert stats["l3_stop_spilled"] == 0 and stats["l3_stop_unproven"] == 0 and disk_bytes(tmp_path) <= cap, stats

    eng = Engine(dict(extra, cpkv_host_blocks=16))
    assert eng.manager.stats()["l3_recovered"] == 4
    seed = max(keys, key=lambda s: leading(keys[s], on_disk))
    expected_hits = leading(keys[seed], on_disk)
    assert expected_hits >= 1
    tokens = prompt(seed, blocks=BLOCKS)
    hits, blocks = serve(eng, "again", tokens)
    assert hits == expected_hits and eng.manager.stats()["l3_promoted"] == hits
    assert_exact(eng, tokens, blocks, hits)
    assert disk_bytes(tmp_path) <= cap
    eng.close()


def serve_many(eng: Engine, requests: dict[str, list[int]]) -> int:
    """Adds the requests at once and steps until each has computed, checking every full block of
    each (loaded or computed) in the step it first computes; returns their hit blocks."""
    for req_id, tokens in requests.items():
        eng.add(req_id, tokens)
    left, hits = dict(requests), 0
    for _ in range(60):
        out = eng.step()
        for req_id in [r for r in left if r in out.num_scheduled_tokens]:
            tokens = left.pop(req_id)
            assert_exact(eng, tokens, eng.last_blocks[req_id], len(tokens) // BLOCK_TOKENS)
            hits += eng.started_at[req_id] // BLOCK_TOKENS
        if not left:
            eng.run()
            return hits
        assert eng.manager.l3.wait_idle(CHECK_TIMEOUT_S), "an L3 record check did not finish"
    raise AssertionError(f"never scheduled: {sorted(left)}")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_requests_across_restarts_serve_exact_bytes(tmp_path: Path, seed: int) -> None:
    """Seeded requests sharing prefixes, several at once, on a 4-block host over a 12-slot L3, in
    three engine lives on one directory: every block each request has when it first computes is
    exactly what was computed for it, while disk hits, evictions and slot reuse all happen."""
    rng = random.Random(seed)
    cap = 24576 + 13 * 16480 + 100  # 13 slots' worth: 12 data slots and one reserved for the stop copy
    extra = cpkv_extra(cpkv_host_blocks=4, cpkv_l3_dir=str(tmp_path), cpkv_l3_bytes=cap)
    promoted = spilled = hits = 0
    for life in range(3):
        eng = Engine(extra)
        for batch in range(5):
            requests = {}
            for i in range(rng.randint(1, 3)):
                base = prompt(rng.randrange(3), blocks=BLOCKS)[: rng.randint(2, BLOCKS) * BLOCK_TOKENS]
                requests[f"l{life}b{batch}r{i}"] = base + prompt(1000 + rng.randrange(10**6), blocks=1, extra_tokens=3)
            hits += serve_many(eng, requests)
            eng.manager.check()
        stats = eng.manager.stats()
        assert stats["l3_slots"] == 12, stats
        promoted += stats["l3_promoted"]
        spilled += stats["l3_spilled"]
        assert stats["l3_corrupt_dropped"] == 0 and eng.manager.num_pins == 0, stats
        assert disk_bytes(tmp_path) <= cap
        eng.close()
    assert promoted > 0 and spilled > 12 and hits > promoted, (promoted, spilled, hits)
