"""``cpkv bench cluster``: the cluster tier's put and get against raw Mooncake Store calls of the same
pages, in the same run, on its own local cluster (``mooncake_master`` + one store server, TCP over
loopback).

Per page size (64 KiB and 4 KiB), ``--batches`` batches of ``--batch`` pages, each batch of new keys:

- **cpkv put**: :meth:`ClusterTier.put_pages`: one ``batch_is_exist``, the pages copied into the
  tier's registered staging rows (the copy out of the host slab), sealed as packed L3 records
  (CRC32C of every byte) and one ``batch_put_from`` of payload + 64-byte trailer each.
- **raw put**: one ``batch_put_from`` of the same pages, each from its own registered memory.
- **cpkv get**: :meth:`ClusterTier.find` (one ``batch_is_exist``), :meth:`ClusterTier.read` (one
  ``batch_get_into`` of the records into staging, every record checked, the payloads copied out)
  and :meth:`ClusterTier.settle`.
- **raw get**: one ``batch_get_into`` of the raw objects into registered memory, nothing checked.

The cpkv and raw batches alternate and take turns going first (after one uncounted warm-up round),
so both see the same store; ``put_ratio`` and ``get_ratio`` are the median over rounds of raw time /
cpkv time within the round (1.0 is as fast as raw Mooncake; the median, because on a loaded machine
one slow call on either side swings a ratio of sums), ``*_ratio_total`` the ratio of the sums. The
floor: the same run also times what cpkv adds in series, alone: the ``batch_is_exist`` round trip,
the seal or check of a batch, and the copy; ``*_ratio_ceiling`` = raw time / (raw time + that).

The second half (``--requests``, 0 skips it), on the same cluster: two instances share one trace,
cpkv's cluster tier against SGLang's own ``mooncake`` backend (:mod:`cpkv.bench.cluster_share`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

PAGE_SIZES = (64 * 1024, 4 * 1024)


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path

    parser.add_argument("--batch", type=integer(1, 1024), default=128, help="pages per batch (default %(default)s)")
    parser.add_argument("--batches", type=integer(1, 10_000), default=24,
                        help="batches per page size and direction (default %(default)s)")
    parser.add_argument("--requests", type=integer(0, 100_000), default=40,
                        help="requests of the trace two instances share (default %(default)s; 0 skips that half)")
    parser.add_argument("--seed", type=integer(0), default=0, help="seed of that trace (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the tables as JSON")


def run(args: argparse.Namespace) -> int:
    from cpkv._report import Table, emit
    from cpkv.bench import cluster_share
    from cpkv.tier.cluster.local import local_cluster

    chains = cluster_share.trace(args.requests, args.seed) if args.requests else []
    # Both halves' objects fit at once: nothing is evicted, so every figure is the tier's own.
    store_bytes = 2 * args.batch * args.batches * (max(PAGE_SIZES) + 4096) + (256 << 20)
    if chains:
        store_bytes += cluster_share.store_bytes_needed(chains)
    sglang_note = cluster_share.sglang_missing() if chains else None
    if sglang_note:
        print(f"cpkv bench cluster: {sglang_note}")
    table = Table(f"cpkv bench cluster: {args.batches} batches of {args.batch} pages, one local Mooncake store "
                  "(TCP, loopback)", ["page", "cpkv put MB/s", "raw put MB/s", "put_ratio", "put ceiling",
                                      "cpkv get MB/s", "raw get MB/s", "get_ratio", "get ceiling"])
    figures: dict[str, Any] = {}
    with local_cluster(store_bytes) as cluster:
        for page_bytes in PAGE_SIZES:
            result = _measure(cluster.master, cluster.metadata, page_bytes, args.batch, args.batches)
            figures[f"{page_bytes // 1024}KiB"] = result
            table.add(f"{page_bytes // 1024} KiB", result["cpkv_put_mb_s"], result["raw_put_mb_s"],
                      result["put_ratio"], result["put_ratio_ceiling"], result["cpkv_get_mb_s"],
                      result["raw_get_mb_s"], result["get_ratio"], result["get_ratio_ceiling"])
        shared = cluster_share.run(cluster, chains, sglang_note is None) if chains else {}
    for backend, result in list(shared.items()):
        if "skipped" in result:  # SGLang imports but is another release
            sglang_note = result["skipped"]
            print(f"cpkv bench cluster: {sglang_note}")
            del shared[backend]
    tables = [table]
    if chains:
        tables.append(_share_table(chains, shared, args.seed))
        figures["shared"] = {"requests": len(chains), "seed": args.seed,
                             "trace_hits": cluster_share.trace_hits(chains), **shared}
    emit("bench cluster", tables, args.json, figures=figures, sglang=sglang_note or "compared")
    return 0


def _share_table(chains: list[list[str]], shared: dict[str, Any], seed: int) -> Any:
    from cpkv._report import Table
    from cpkv.bench import cluster_share
    from cpkv.bench.cluster_share import INSTANCES, page_bytes
    from cpkv.bench.sglang import DSA_PAGE

    unique_pages = len({key for keys in chains for key in keys})
    unique_tokens = unique_pages * DSA_PAGE
    expected = cluster_share.trace_hits(chains)
    table = Table(f"two instances (CP 2, DSA pools: KV + indexer, {sum(page_bytes()):,} bytes per 64-token page) "
                  f"share one store: {len(chains)} requests of cpkv.workload(seed={seed}), {unique_tokens:,} unique "
                  f"tokens; the trace allows {sum(expected) * DSA_PAGE:,} hit tokens",
                  ["backend", *[f"instance {i} hit tokens" for i in range(INSTANCES)], "hit tokens",
                   "store bytes / unique token", "objects / unique page"])
    names = {"cpkv": "cpkv cluster tier", "sglang": "SGLang 0.5.23 mooncake"}
    for backend, result in shared.items():
        per_instance = [sum(h for i, h in enumerate(result["hits"]) if i % INSTANCES == n) * DSA_PAGE
                        for n in range(INSTANCES)]
        table.add(names[backend], *per_instance, sum(per_instance), result["bytes"] / unique_tokens,
                  result["objects"] / unique_pages)
    return table


def _measure(master: str, metadata: str, page_bytes: int, batch: int, batches: int) -> dict[str, float]:
    import torch

    from cpkv import _cpkv
    from cpkv.tier import SlabSpec
    from cpkv.tier.cluster.mooncake import BoundedStore
    from cpkv.tier.cluster.tier import SEQUENCE, ClusterTier

    tier = ClusterTier(master, metadata, slab=None, payloads={"kv": SlabSpec((page_bytes,), torch.uint8)},
                       num_layers=1, page_size=16, rank=0, cp_size=1, model=f"bench cluster {page_bytes}",
                       timeout_s=60.0, all_reduce_min=lambda values, what: list(values), batch=batch)
    raw = BoundedStore(master, metadata, 60.0)
    rng = np.random.default_rng(page_bytes)
    pages = rng.integers(0, 256, (batch, page_bytes), dtype=np.uint8)  # the slab rows a put copies from
    back = np.empty_like(pages)
    for buffer in (pages, back):
        raw.register(buffer.ctypes.data, buffer.nbytes)
    addresses = [pages.ctypes.data + j * page_bytes for j in range(batch)]
    back_addresses = [back.ctypes.data + j * page_bytes for j in range(batch)]
    spent = {"cpkv_put": 0.0, "raw_put": 0.0, "cpkv_get": 0.0, "raw_get": 0.0}

    def fill(rows: np.ndarray) -> None:
        rows[:, :page_bytes] = pages

    def cpkv_put(keys: list[int], names: list[str]) -> None:
        if tier.put_pages(keys, fill) != batch:
            raise RuntimeError(f"bench cluster: a cpkv put of {page_bytes}-byte pages failed")

    def raw_put(keys: list[int], names: list[str]) -> None:
        codes = raw.put_from(names, addresses, [page_bytes] * batch)
        if codes != [0] * batch:
            raise RuntimeError(f"bench cluster: a raw put failed (codes {set(codes)})")

    def cpkv_get(keys: list[int], names: list[str]) -> None:
        found = tier.find([keys])[0]
        _, data = tier.read(found, np.arange(batch, dtype=np.int64))
        if tier.settle() != batch:
            raise RuntimeError(f"bench cluster: a cpkv get of {page_bytes}-byte pages failed")
        read_back.append(data)

    def raw_get(keys: list[int], names: list[str]) -> None:
        if raw.get_into(names, back_addresses, [page_bytes] * batch) != [page_bytes] * batch:
            raise RuntimeError("bench cluster: a raw get failed")

    # Round 0 warms both paths up and is not counted; the two paths take turns going first. What a
    # get brought back is compared after the clock stopped (the raw get is not compared either).
    read_back: list[np.ndarray] = []
    ratios: dict[str, list[float]] = {"put": [], "get": []}
    for round_ in range(batches + 1):
        keys = [(page_bytes << 32) + round_ * batch + j for j in range(batch)]
        names = [f"raw/{page_bytes}/{key}" for key in keys]
        for direction, step in (("put", (cpkv_put, raw_put)), ("get", (cpkv_get, raw_get))):
            took = {}
            for job in step if round_ % 2 else step[::-1]:
                started = time.perf_counter()
                job(keys, names)
                took[job.__name__] = time.perf_counter() - started
            if round_:
                for name, seconds in took.items():
                    spent[name] += seconds
                ratios[direction].append(took[f"raw_{direction}"] / took[f"cpkv_{direction}"])
        if not np.array_equal(read_back.pop(), pages) or not np.array_equal(back, pages):
            raise RuntimeError(f"bench cluster: a get of {page_bytes}-byte pages returned other bytes")
    # What cpkv adds in series, timed alone on the same data: the existence round trip, the seal and
    # the check of a batch, the copies into and out of the staging rows.
    names = [f"raw/{page_bytes}/{(page_bytes << 32) + j}" for j in range(batch)]
    staging = np.zeros((batch, page_bytes + _cpkv.L3_HEADER_BYTES), dtype=np.uint8)
    floor = {"exist": 0.0, "seal": 0.0, "check": 0.0, "copy": 0.0}
    for _ in range(batches):
        started = time.perf_counter()
        raw.exist(names)
        floor["exist"] += time.perf_counter() - started
        started = time.perf_counter()
        staging[:, :page_bytes] = pages
        floor["copy"] += time.perf_counter() - started
        keys = list(range(batch))
        started = time.perf_counter()
        _cpkv.l3_seal_packed(staging.reshape(-1), 1, keys, [SEQUENCE] * batch, page_bytes)
        floor["seal"] += time.perf_counter() - started
        started = time.perf_counter()
        _cpkv.l3_check_packed(staging.reshape(-1), 1, keys, [SEQUENCE] * batch, page_bytes)
        floor["check"] += time.perf_counter() - started
    tier.close()
    raw.close()
    total_mb = batch * batches * page_bytes / 1e6
    added_put = floor["exist"] + floor["copy"] + floor["seal"]
    added_get = floor["exist"] + floor["copy"] + floor["check"]
    return {
        "cpkv_put_mb_s": total_mb / spent["cpkv_put"], "raw_put_mb_s": total_mb / spent["raw_put"],
        "put_ratio": float(np.median(ratios["put"])), "put_ratio_total": spent["raw_put"] / spent["cpkv_put"],
        "put_ratio_ceiling": spent["raw_put"] / (spent["raw_put"] + added_put),
        "cpkv_get_mb_s": total_mb / spent["cpkv_get"], "raw_get_mb_s": total_mb / spent["raw_get"],
        "get_ratio": float(np.median(ratios["get"])), "get_ratio_total": spent["raw_get"] / spent["cpkv_get"],
        "get_ratio_ceiling": spent["raw_get"] / (spent["raw_get"] + added_get),
        "exist_ms_per_batch": floor["exist"] / batches * 1e3, "copy_ms_per_batch": floor["copy"] / batches * 1e3,
        "seal_ms_per_batch": floor["seal"] / batches * 1e3, "check_ms_per_batch": floor["check"] / batches * 1e3,
        "raw_put_ms_per_batch": spent["raw_put"] / batches * 1e3,
        "raw_get_ms_per_batch": spent["raw_get"] / batches * 1e3,
    }
