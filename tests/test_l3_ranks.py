"""L3 across real gloo ranks: 2 and 4 ranks on one node, and 4 ranks as 2 simulated nodes (2
directories), replay one stream of slab evictions (puts) and lookups. Every rank holds the same
index (digests agreed by MIN/MAX all-reduce), each node's files hold each page once, every byte of
every hit is read by its writer rank and checked, and one extra lookup on one rank is caught."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from cpkv import _cpkv
from cpkv.runtime.launch import run_ranks
from cpkv.tier.l3 import L3Store
from l3_pages import namespace, page

CAP = 40 * 4096 + 64 * 1024


def stream(seed: int, steps: int = 120) -> list[tuple[str, list[int]]]:
    rng = np.random.default_rng(seed)
    ops: list[tuple[str, list[int]]] = []
    next_key = 1
    for _ in range(steps):
        if rng.random() < 0.5:
            n = int(rng.integers(1, 7))
            ops.append(("put", list(range(next_key, next_key + n))))
            next_key += n
        else:
            ops.append(("get", [int(rng.integers(1, next_key + 1))]))
    return ops


def _rank(rank: int, world: int, root: str, nodes: int, ops: list, extra_lookup_rank: int) -> dict:
    import torch.distributed as dist

    from cpkv.errors import DivergenceError
    from cpkv.runtime.agree import agree

    per_node = world // nodes
    node, local = divmod(rank, per_node)
    store = L3Store(f"{root}/node{node}", CAP, namespace(), rank=local, ranks_on_node=per_node)
    dist.barrier()  # every rank of the node has recovered before any writes
    hits = verified = wrong = 0
    for kind, keys in ops:
        if kind == "put":
            store.put([(k, page(k)) for k in keys])
            dist.barrier()  # the commit point: the writers' records are durable before anyone reads
        else:
            found = store.lookup(keys[0])
            hits += found is not None
            if found is not None and store.index.writer(keys[0]) == local:
                got = store.read(keys[0], *found)
                assert got is not None, f"rank {rank}: key {keys[0]}: {store.last_reject}"
                wrong += int(not np.array_equal(got, page(keys[0])))
                verified += got.nbytes
    if rank == extra_lookup_rank:
        store.lookup(ops[0][1][0])
    outcome = "agreed"
    try:
        agree(store.digest(), group=None, rank=rank, step="L3 digest", timeout_s=30.0)
    except DivergenceError as err:
        outcome = f"DivergenceError: {err}"
    result = {"digest": store.digest(), "hits": hits, "verified": verified, "wrong": wrong, "outcome": outcome,
              "entries": store.index.entries(), "written": store.counters["pages_written"]}
    store.close()
    return result


def _records_on_disk(directory, slots_per_file: int, slot_bytes: int, slots: int) -> list[tuple[int, int]]:
    """(key, sequence) of every slot's header, read straight from the files."""
    out = []
    for slot in range(slots):
        with open(directory / f"data-{slot // slots_per_file}.bin", "rb") as f:
            f.seek((slot % slots_per_file) * slot_bytes + slot_bytes - _cpkv.L3_HEADER_BYTES)  # the record's last bytes
            header = f.read(_cpkv.L3_HEADER_BYTES)
        if struct.unpack_from("<Q", header)[0] == _cpkv.L3_RECORD_MAGIC:
            out.append(struct.unpack_from("<QQ", header, _cpkv.L3_RECORD_KEY_AT))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world, nodes", [(2, 1), (4, 1), (4, 2)])
def test_ranks_agree_and_each_node_holds_each_page_once(tmp_path, world, nodes):
    ops = stream(world * 10 + nodes)
    for n in range(nodes):
        (tmp_path / f"node{n}").mkdir()
    results = run_ranks(_rank, world, str(tmp_path), nodes, ops, -1, timeout_s=240)
    assert all(r["outcome"] == "agreed" for r in results), results
    assert len({r["digest"] for r in results}) == 1
    assert len({tuple(r["entries"]) for r in results}) == 1
    assert sum(r["wrong"] for r in results) == 0
    hits = results[0]["hits"]
    assert hits > 10 and all(r["hits"] == hits for r in results)
    per_node = world // nodes
    # Each hit was read and checked once per node, by its writer rank.
    assert sum(r["verified"] for r in results) == hits * nodes * page(0).nbytes
    live = results[0]["entries"]
    for n in range(nodes):
        node_results = results[n * per_node:(n + 1) * per_node]
        assert all(r["written"] > 0 for r in node_results)  # the writes are spread over the node's ranks
        with L3Store(tmp_path / f"node{n}", CAP, namespace(), rank=0, ranks_on_node=per_node) as store:
            assert store.index.entries() == live  # recovered from every rank's log: the live index
            on_disk = _records_on_disk(store.directory, store.slots_per_file, store.slot_bytes, store.slots)
            keys = [k for k, _ in on_disk]
            assert len(keys) == len(set(keys))  # one copy per node
            assert sorted(on_disk) == sorted((k, q) for k, _, q in live)
            for key, slot, sequence in live:
                assert np.array_equal(store.read(key, slot, sequence), page(key))


@pytest.mark.timeout(300)
def test_one_extra_lookup_on_one_rank_is_caught_on_every_rank(tmp_path):
    (tmp_path / "node0").mkdir()
    results = run_ranks(_rank, 2, str(tmp_path), 1, stream(3, steps=30), 1, timeout_s=240)
    assert all(r["outcome"].startswith("DivergenceError") for r in results), results
