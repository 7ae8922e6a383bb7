"""`cpkv bench allocator` runs end to end on a short stream and proves its comparison is fair."""

from __future__ import annotations

import json

import cpkv
from cpkv.bench import _alloc_stream as stream_mod
from cpkv.bench._reference_allocator import ReferenceAllocator
from cpkv.cli import main


def test_bench_allocator_writes_json(tmp_path, capsys):
    out = tmp_path / "alloc.json"
    argv = ["bench", "allocator", "--workload", "pool64k", "--steps", "30", "--repeat", "1",
            "--call-path-live", "2000", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["command"] == "bench allocator"
    speed = data["tables"][0]["rows"]
    assert {row["calls"] for row in speed} == {"single", "batched"}
    assert all(row["ops/s"] > 0 and row["speedup"] > 0 for row in speed)
    assert set(data["speedups"]["pool64k"]) == {"single", "batched", "arrays"}
    assert len(speed) == 5  # reference and cpkv single; reference, reserve_many and reserve_batch
    checksums = {row["placements sha256"] for row in data["tables"][2]["rows"]}
    assert len(checksums) == 1 and len(data["tables"][2]["rows"]) == 4  # all four placed identically
    assert "speedup" in capsys.readouterr().out
    call_path = data["tables"][3]["rows"]  # the cycle against its floor, both payload sets
    assert [(row["live objects"], row["payloads"]) for row in call_path] == [(2000, "all"), (2000, '["kv"]')]
    assert all(row["cycle ns"] > row["floor ns"] > 0 for row in call_path)
    assert all(row["lookup pair ns"] > row["floor ns"] for row in call_path)


def test_reference_allocator_matches_cpkv_on_a_tight_stream():
    # Small pools, large objects: misses and multi-extent placements are common.
    pools = {"kv": 512, "index": 384}
    stream = stream_mod.make_stream(7, 200, pools, batch=8, occupancy=0.95, max_pages=48)
    names = list(pools)
    reference = ReferenceAllocator(pools)
    ref = stream_mod.replay(reference, stream)
    alloc = cpkv.PageAllocator(pools)
    got = stream_mod.replay(alloc, stream, batched=True)
    keys = [k for step in stream for k, _ in step.reserves]
    assert any(p is None for p in ref) and any(p and len(p["kv"]) > 1 for p in ref)
    assert [stream_mod.reference_record(k, p) for k, p in zip(keys, ref)] == [
        stream_mod.placement_record(k, p, names) for k, p in zip(keys, got)
    ]
    for name in names:
        assert alloc.free_extents(name) == reference.free_extents(name)
    arrays = cpkv.PageAllocator(pools)
    batches = stream_mod.replay_arrays(arrays, stream_mod.as_arrays(stream))
    assert [stream_mod.placement_record(k, p, names) for k, p in zip(keys, stream_mod.placements(batches))] == [
        stream_mod.placement_record(k, p, names) for k, p in zip(keys, got)
    ]
    assert arrays.digest() == alloc.digest()
