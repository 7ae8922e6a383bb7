"""``cpkv bench tier``: the two-tier cache's byte moves and decisions, in one process.

Three measurements, all in this process (world 1, no torch.distributed), through
``CacheController``'s public calls:

- backup: fresh requests are inserted so that ``--pages`` pages are pending backup (one backup
  of ``--node-pages`` pages per request), then ``backup_layer(layer)`` is timed layer by layer
  (one copy per payload for all pending backups); ``end_forward`` commits them
  and the next repetition's requests evict them from the device.
- load-back: the committed requests are evicted from the device, then, as in one forward,
  ``load_batch`` of every request's lookup followed by ``wait_all()`` of each is timed (the plans, the
  copier thread, its copies), divided by the layers.
- both against a plain ``dst.copy_(src)`` of the same bytes between the same two memories (the
  first ``--pages`` rows of the layer's device pool and of its slab region, contiguous). Every
  copy figure is the best of ``--repeats`` rounds, after one warm-up round; timed to completion
  (device copies are asynchronous).
- bytes: in the last round, every page that came back is compared with what was backed up (the
  device rows are inverted in between, so a copy that did not land, or landed late, shows); a
  difference is reported in the JSON and on stderr, and the bench exits 1, on CPU and CUDA pools.
- decisions: a ``cpkv.workload`` trace replayed through the Rust core (``cpkv._cpkv.TierCache``:
  lookup / plan_load / allocate / insert / unlock / commit every few requests with the issued
  frontier), against the same stream through a plain device-only ``PrefixTree`` (match, lock,
  evict, insert, unlock: what an engine without a host tier writes). The device holds
  ``--device-fraction`` of the trace's distinct pages, the host 4x that. The plain tree's replay
  is timed twice; its row's ratio is the first time over the second, the run-to-run noise to read
  the cpkv row's ratio against.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

# (label, {payload: (page_shape, dtype name)})
COPY_SHAPES: list[tuple[str, dict[str, tuple[tuple[int, ...], str]]]] = [
    ("K+V, 2 x 32 KB rows", {"k": ((16_384,), "bfloat16"), "v": ((16_384,), "bfloat16")}),
    ("one payload, 4 KB rows", {"kv": ((2_048,), "bfloat16")}),
]
COMMIT_EVERY = 4


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pages", type=int, default=512, help="pages pending per backup / load-back round "
                        "(default %(default)s)")
    parser.add_argument("--node-pages", type=int, default=32, help="pages per request, i.e. per backup "
                        "(default %(default)s; must divide --pages)")
    parser.add_argument("--layers", type=int, default=8, help="layers per payload (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per copy measurement "
                        "(default %(default)s)")
    parser.add_argument("--requests", type=int, default=2_000, help="trace requests for the decision "
                        "replay (default %(default)s)")
    parser.add_argument("--device-fraction", type=float, default=0.0625, help="device pages as a fraction of the "
                        "trace's distinct pages in the decision replay; host = 4x device (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per page (default %(default)s)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the device pools live; "
                        "cuda times D2H backups and H2D load-backs against a plain pinned copy, the host link's "
                        "bound (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON")


def _validate(args: argparse.Namespace) -> None:
    from cpkv._args import output_file, positive_int
    from cpkv.errors import InvalidArgumentError

    for option in ("pages", "node_pages", "layers", "repeats", "requests", "page_size"):
        positive_int(getattr(args, option), "--" + option.replace("_", "-"))
    if args.seed < 0:
        raise InvalidArgumentError(f"--seed must be a non-negative integer, got {args.seed}")
    if not (math.isfinite(args.device_fraction) and 0 < args.device_fraction <= 1):
        raise InvalidArgumentError(f"--device-fraction must be in (0, 1], got {args.device_fraction}")
    if args.pages % args.node_pages:
        raise InvalidArgumentError(f"--node-pages {args.node_pages} must divide --pages {args.pages}")
    output_file(args.json, "--json")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InvalidArgumentError("--device cuda: no CUDA device is available here")


def _sync(device: str) -> None:
    """Copies to or from a GPU are asynchronous: time them to completion."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# -- byte moves --------------------------------------------------------------------------------


def _copy_rows(args: argparse.Namespace, label: str, shapes: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, Any]:
    """One payload set: backup and load-back through the controller, and the plain copies."""
    import numpy as np
    import torch

    from cpkv.runtime.layout import CpLayout
    from cpkv.tier import CacheController, SlabSpec

    page, pages, layers = args.page_size, args.pages, args.layers
    specs = {name: SlabSpec(shape, getattr(torch, dtype)) for name, (shape, dtype) in shapes.items()}
    pools = {name: [torch.randint(0, 255, (pages, spec.row_bytes), dtype=torch.uint8, device=args.device)
                    .view(spec.dtype).view(pages, *spec.page_shape) for _ in range(layers)]
             for name, spec in specs.items()}
    row_bytes = sum(spec.row_bytes for spec in specs.values())
    layer_bytes = pages * row_bytes
    per_request = args.node_pages
    requests = pages // per_request
    backup_s: list[float] = []  # per timed round, seconds per layer
    load_s: list[float] = []
    backed_up = loaded = wrong_bytes = 0
    ctl = CacheController(layout=CpLayout(1, 0, page), device_pages=pages, host_pages=pages, payloads=specs,
                          device_pools=pools)
    try:
        for rep in range(args.repeats + 1):  # round 0 warms up (page faults, the copier thread)
            batch = [np.arange(per_request * page, dtype=np.int64) + (rep * requests + r) * 1_000_000
                     for r in range(requests)]
            pending = 0
            written = []  # per request: the device pages its KV was written to
            for tokens in batch:  # fresh requests: their pages become pending backups
                hit = ctl.lookup(tokens)
                fresh = ctl.allocate(per_request)
                if fresh is None:
                    raise RuntimeError("bench tier: the device pool has no room for a fresh request")
                out = ctl.insert(tokens, fresh)
                ctl.release(hit)
                written.append(fresh)
                pending += sum(len(b.device_pages) for b in out.backups)
            _sync(args.device)
            started = time.perf_counter()
            for layer in range(layers):
                ctl.backup_layer(layer)
            _sync(args.device)
            spent = time.perf_counter() - started
            ctl.end_forward()  # commits every backup
            if rep:
                backup_s.append(spent / layers)
                backed_up += pending
            ctl.core.evict_device(pages)  # the batch stays on the host only
            checked = rep == args.repeats
            if checked:
                expected = _snapshot(pools, written)
                _invert(pools)  # what is in the pool now is wrong: only a landed load-back makes it right
            _sync(args.device)
            # One forward's requests: their loads are issued together, then waited for.
            hits = [ctl.lookup(tokens) for tokens in batch]
            started = time.perf_counter()
            loads = ctl.load_batch(hits)
            for load in loads:
                load.wait_all()
            _sync(args.device)  # on CUDA, wait_all orders the caller's stream; the copies may still run
            spent = time.perf_counter() - started
            if checked:
                wrong_bytes += _compare(pools, [load.pages for load in loads], expected)
            got = sum(load.num_pages for load in loads)
            for tokens, hit, load in zip(batch, hits, loads):
                ctl.insert(tokens, load.pages)
                ctl.release(hit)
            ctl.end_forward()
            if rep:
                load_s.append(spent / layers)
                loaded += got
        plain = _plain_copies(args, pools, {name: ctl.slab.rows(name) for name in specs})
    finally:
        ctl.close()
    if backed_up != pages * args.repeats or loaded != pages * args.repeats:
        raise RuntimeError(f"bench tier: {backed_up} pages backed up and {loaded} loaded back, expected "
                           f"{pages * args.repeats} each")

    return {
        "label": label,
        "row_bytes": row_bytes,
        "layer_bytes": layer_bytes,
        "backup_s": min(backup_s),
        "load_s": min(load_s),
        "plain_backup_s": plain["backup"],
        "plain_load_s": plain["load"],
        "bytes_checked": layers * pages * row_bytes,
        "bytes_wrong": wrong_bytes,
    }


def _snapshot(pools: dict[str, list[Any]], written: list[Any]) -> dict[str, list[Any]]:
    """The rows of every written page, request by request in page order, per payload and layer."""
    import numpy as np
    import torch

    pages = torch.from_numpy(np.concatenate(written).astype(np.int64))
    return {name: [_rows(p).index_select(0, pages.to(p.device)) for p in layers] for name, layers in pools.items()}


def _invert(pools: dict[str, list[Any]]) -> None:
    for layers in pools.values():
        for p in layers:
            rows = _rows(p)
            rows.bitwise_not_()


def _compare(pools: dict[str, list[Any]], loaded: list[Any], expected: dict[str, list[Any]]) -> int:
    """Bytes of the loaded pages (in request and page order) that differ from the snapshot."""
    import numpy as np
    import torch

    pages = torch.from_numpy(np.concatenate(loaded).astype(np.int64))
    wrong = 0
    for name, layers in pools.items():
        for p, want in zip(layers, expected[name]):
            got = _rows(p).index_select(0, pages.to(p.device))
            wrong += int((got != want).sum()) if got.shape == want.shape else want.numel()
    return wrong


def _rows(pool: Any) -> Any:
    import torch

    return pool.view(torch.uint8).view(pool.shape[0], -1)


def _plain_copies(args: argparse.Namespace, pools: dict[str, list[Any]], slab_rows: dict[str, Any]) -> dict[str, float]:
    """Seconds per layer (best round) of ``dst.copy_(src)`` between the first ``--pages`` rows of each layer's pool
    and of its slab region (both contiguous), each way."""
    import torch

    pages = args.pages
    src = {name: [p.view(torch.uint8).view(pages, -1) for p in layers] for name, layers in pools.items()}
    dst = {name: [slab_rows[name][layer][:pages] for layer in range(args.layers)] for name in pools}
    plain = {}
    for direction, (a, b) in {"backup": (src, dst), "load": (dst, src)}.items():
        rounds = []
        for rep in range(args.repeats + 1):  # round 0 warms up
            started = time.perf_counter()
            for layer in range(args.layers):
                for name in pools:
                    b[name][layer].copy_(a[name][layer])
            _sync(args.device)
            if rep:
                rounds.append((time.perf_counter() - started) / args.layers)
        plain[direction] = min(rounds)
    return plain


# -- decisions ---------------------------------------------------------------------------------


def _trace(args: argparse.Namespace) -> tuple[list[Any], int]:
    from cpkv.traces import block_tokens
    from cpkv.workload import generate

    page = args.page_size
    streams = []
    blocks: set[int] = set()
    for req in generate(args.requests, args.seed):
        blocks.update(req.hash_ids)
        streams.append(block_tokens(req.hash_ids, page))
    return streams, len(blocks)


def _replay_tier(streams: list[Any], page: int, device: int, host: int) -> dict[str, Any]:
    import numpy as np

    from cpkv._cpkv import TierCache

    core = TierCache(page_size=page, cp_size=1, device_pages=device, host_pages=host)
    calls = hit_pages = loaded = misses = 0
    started = time.perf_counter()
    for i, tokens in enumerate(streams):
        hit = core.lookup(tokens)
        have = len(hit.device_pages)
        held = []
        calls += 2
        if hit.locked and hit.host_tokens > hit.device_tokens:
            runs = core.plan_load(hit.node)
            held = [int(p) for run in runs for p in run.device_pages]
            calls += 1
        fresh = core.allocate(len(tokens) // page - have - len(held))
        if fresh is None:
            misses += 1
            if held:
                core.free(held)
                calls += 1
        else:
            core.insert(tokens, np.concatenate([hit.device_pages, np.asarray(held, dtype=np.int64), fresh]))
            calls += 1
            hit_pages += have
            loaded += len(held)
        if hit.locked:
            core.unlock(hit.node)
            calls += 1
        if (i + 1) % COMMIT_EVERY == 0:
            core.commit(core.issued)
            calls += 1
    spent = time.perf_counter() - started
    core.check_invariants()
    return {"s": spent, "calls": calls, "hit_pages": hit_pages, "loaded_pages": loaded, "misses": misses}


def _replay_tree(streams: list[Any], page: int, device: int) -> dict[str, Any]:
    from cpkv import PrefixTree

    tree = PrefixTree(page, "lru")
    free = list(range(device))
    calls = hit_pages = misses = 0
    started = time.perf_counter()
    for tokens in streams:
        m = tree.match(tokens)
        need = len(tokens) // page - len(m.device_pages)
        locked = m.length > 0
        if locked:
            tree.lock(m.node)
        calls += 1 + 2 * locked
        if need > len(free):
            for victim in tree.evict(need - len(free)):
                free.extend(victim.pages.tolist())
            calls += 1
        if need <= len(free):
            fresh = free[len(free) - need:]
            del free[len(free) - need:]
            tree.insert(tokens, [*m.device_pages.tolist(), *fresh])
            calls += 1
            hit_pages += len(m.device_pages)
        else:
            misses += 1
        if locked:
            tree.unlock(m.node)
    spent = time.perf_counter() - started
    tree.check_invariants()
    return {"s": spent, "calls": calls, "hit_pages": hit_pages, "misses": misses}


# -- the command -------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    _validate(args)
    from cpkv._report import Table, emit

    copies = [_copy_rows(args, label, shapes) for label, shapes in COPY_SHAPES]
    tables = []
    for direction, what in (("backup", "backup_layer(layer) after inserts left the pages pending"),
                            ("load", "load_batch(lookups) of every host-only request of the round, then wait_all(), per layer")):
        table = Table(f"{direction}: {args.pages} pages per layer, {args.layers} layers, {args.device} pools <-> "
                      "host slab, "
                      f"best of {args.repeats} rounds; cpkv = CacheController.{what}; plain = dst.copy_(src) of the "
                      "same bytes, contiguous",
                      ["rows", "MB/layer", "cpkv ms/layer", "cpkv GB/s", "plain ms/layer", "plain GB/s",
                       "ratio"])
        for c in copies:
            mine, plain = c[f"{direction}_s"], c[f"plain_{direction}_s"]
            table.add(c["label"], c["layer_bytes"] / 1e6, mine * 1e3, c["layer_bytes"] / mine / 1e9, plain * 1e3,
                      c["layer_bytes"] / plain / 1e9, plain / mine)
        tables.append(table)

    streams, distinct = _trace(args)
    page = args.page_size
    longest = max(len(t) // page for t in streams)
    device = max(int(distinct * args.device_fraction), longest)
    host = 4 * device
    tier = _replay_tier(streams, page, device, host)
    tree = _replay_tree(streams, page, device)
    tree["s_again"] = _replay_tree(streams, page, device)["s"]
    n = len(streams)
    table = Table(f"decisions: workload.generate({n}, seed={args.seed}), {distinct:,} distinct pages of {page} "
                  f"tokens, device {device:,} pages, host {host:,}; one Python call per decision; "
                  "ratio = requests/s relative to the plain tree (its own row: its second timing against "
                  "its first, the noise)",
                  ["implementation", "requests/s", "calls/s", "calls/request", "device-hit pages",
                   "loaded-back pages", "ratio"])
    table.add("cpkv TierCache (lookup/plan_load/allocate/insert/unlock/commit)", n / tier["s"],
              tier["calls"] / tier["s"], tier["calls"] / n, tier["hit_pages"], tier["loaded_pages"],
              tree["s"] / tier["s"])
    table.add("plain PrefixTree, device only (match/lock/evict/insert/unlock)", n / tree["s"],
              tree["calls"] / tree["s"], tree["calls"] / n, tree["hit_pages"], 0, tree["s"] / tree["s_again"])
    tables.append(table)
    wrong = [c for c in copies if c["bytes_wrong"]]
    emit("bench tier", tables, args.json, pages=args.pages, node_pages=args.node_pages, layers=args.layers,
         repeats=args.repeats, requests=args.requests, seed=args.seed, page_size=page, device_pages=device,
         host_pages=host, copies=copies, tier_replay=tier, tree_replay=tree)
    for c in wrong:
        print(f"cpkv bench tier: {c['label']}, {args.device} pools: {c['bytes_wrong']:,} of {c['bytes_checked']:,} "
              "bytes loaded back differ from what was backed up", file=sys.stderr)
    return 1 if wrong else 0
