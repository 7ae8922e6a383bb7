"""One CP rank of ``cpkv replay``: an engine loop through cpkv's public API only.

Per forward: batch admission (:func:`cpkv.scheduling.form_batch` over the waiting requests'
matches), replicated lookups and load-back of host hits, new pages allocated, then per layer:
wait for the load, write the new KV into the owners' pools, compose every request's dense KV
(:class:`~cpkv.compose.ShmGroup` on the CPU, :class:`~cpkv.compose.CudaIpcGroup` on a GPU: see
:mod:`cpkv.replay.device`), check every composed byte, write-through backup; then insert,
release, and the commit point (:meth:`~cpkv.tier.CacheController.end_forward`).

The KV of a page is a pure function of (its block id, layer, payload) that tells every such triple
apart (:func:`~cpkv.replay.kv_rows.kv_rows`): block ids chain (equal ids mean equal prefixes), so the expected
bytes of every page of every request are known, and a page served for the wrong block is a wrong byte.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cpkv.replay.device import ByteCheck, ExpectedRows, ReplayClock, ReplayDevice, replay_device
from cpkv.replay.options import ReplayOptions
from cpkv.traces import block_tokens

# Test hook (set inside a rank process by a test): called with (forward, payload, layer, dense u8 rows)
# after each compose, before the check, so a test can corrupt one composed byte.
after_compose: Callable[[int, str, int, Any], None] | None = None


@dataclass
class _Running:
    """One admitted request inside a forward."""

    tokens: np.ndarray
    blocks: np.ndarray
    load: Any
    pages: np.ndarray  # every page of the request, in token order
    cached: int  # leading pages read from the cache (prefix)
    l3_pages: np.ndarray | None = None  # device pages this rank filled from L3 (owned, read back whole)
    l3_data: np.ndarray | None = None  # their L3 pages, uint8 [n, page_bytes]
    l3_found: int = 0  # pages past the cached prefix that L3 holds (the cluster is asked about the rest)
    cluster_pages: np.ndarray | None = None  # device pages this rank filled from the cluster tier (owned, checked)
    cluster_data: np.ndarray | None = None  # their pages, uint8 [n, page_bytes]


def replay_rank(rank: int, world: int, options: ReplayOptions, requests: list[tuple[int, ...]],
                device: ReplayDevice | None = None) -> dict:
    """One rank's run; ``device`` (default: from ``options.device``) is where its pools live and how
    its group is made (a test passes CPU tensors through the device path here)."""
    import torch

    from cpkv.config import config, override_config
    from cpkv.runtime.layout import CpLayout
    from cpkv.scheduling import AffinityPolicy, BudgetConfig, Candidate, ScanState, form_batch
    from cpkv.tier import CacheController

    torch.set_num_threads(1)
    where = device if device is not None else replay_device(options.device, rank, world)
    settings = override_config(config(), check_every=options.check_every,
                               collective_timeout_s=options.timeout_s, transfer_timeout_s=options.timeout_s)
    page = options.page_size
    layout = CpLayout(world, rank, page)
    rows = -(-options.device_pages // world)
    payload_names = list(options.payloads)
    started = time.perf_counter()
    counters = {"blocks": 0, "device_hit_blocks": 0, "host_hit_blocks": 0, "forwards": 0, "composed_bytes": 0,
                "verified_bytes": 0, "verification_failures": 0, "requests_uncached": 0, "compose_barriers": 0,
                "l3_hit_blocks": 0, "cluster_hit_blocks": 0}
    with where.open_group(options.timeout_s) as group:
        pools = {name: [group.register_pool(f"{name}@{layer}", rows, spec.page_shape, spec.dtype, 0)
                        for layer in range(options.layers)]
                 for name, spec in options.payloads.items()}
        ctl = CacheController(layout=layout, device_pages=options.device_pages, host_pages=options.host_pages,
                              payloads=options.payloads, device_pools=pools, policy=options.policy,
                              process_group=None, settings=settings, l3_dir=options.l3_dir,
                              l3_bytes=options.l3_bytes, l3_model="cpkv replay",
                              cluster_master=options.cluster_master, cluster_metadata=options.cluster_metadata,
                              cluster_bytes=options.cluster_bytes)
        # The controller's stream ops (None for CPU pools): the replay times its own work with them.
        clock = ReplayClock(ctl.streams)
        check = ByteCheck(where.device)
        expected = ExpectedRows(where.device, options.layers, [spec.row_bytes for spec in options.payloads.values()])
        try:
            policy = AffinityPolicy(floor_tokens=2 * page, cp_mode=True, enabled=options.admission)
            longest = max(len(r) for r in requests) * page
            cap = -(-longest * options.batch // page) * page
            budget = BudgetConfig(page_size=page, extend_cap=cap, cached_cap=1 << 40,
                                  staging_pages=cap // page + 1, chunking=False)
            state = ScanState()
            waiting: list[int] = []
            next_request = 0
            progress = _Progress(len(requests), enabled=rank == 0 and options.progress)
            while next_request < len(requests) or waiting:
                clock.begin_forward()
                while len(waiting) < options.batch and next_request < len(requests):
                    waiting.append(next_request)
                    next_request += 1
                candidates, hits = [], {}
                for index in waiting:
                    blocks = np.asarray(requests[index], dtype=np.int64)
                    hit = ctl.lookup(block_tokens(blocks, page))
                    hits[index] = hit
                    usable = min(hit.host_tokens // page, len(blocks) - 1)
                    device_hit = min(hit.device_tokens // page, usable)
                    candidates.append(Candidate(index, device_hit * page, (usable - device_hit) * page,
                                                (len(blocks) - usable) * page))
                step = form_batch(candidates, state, policy, budget)
                state = step.state
                admitted = [a.request_id for a in step.batch]
                for index in waiting:
                    if index not in admitted:
                        ctl.release(hits[index])
                waiting = [i for i in waiting if i not in admitted]
                running = _admit(ctl, requests, admitted, hits, page, counters)
                _forward(ctl, group, running, options, payload_names, counters, layout, where.device, clock, check,
                         expected)
                clock.sync_forward()  # the device path's one sync: the forward's bytes are composed and checked
                wrong_rows, wrong_bytes = check.take()
                counters["verification_failures"] += wrong_rows
                counters["verified_bytes"] -= wrong_bytes
                for r in running:
                    ctl.insert(r.tokens, r.pages)
                    if options.cluster_put == "backup":
                        ctl.put_to_cluster(r.tokens, r.pages, r.cached)
                for index in admitted:
                    ctl.release(hits[index])
                if ctl.l3 is not None:
                    counters["l3_hit_blocks"] += ctl.l3.settle()  # C on a forward with L3 hits only
                if ctl.cluster is not None:
                    counters["cluster_hit_blocks"] += ctl.cluster.settle()  # C on a forward with cluster hits only
                ctl.end_forward()
                clock.end_forward()
                counters["forwards"] += 1
                progress.update(len(admitted))
            ctl.flush_backups()
            ctl.end_forward()
            stats: dict[str, Any] = dict(ctl.stats())
            if ctl.l3 is not None:  # a clean stop: every cached page goes to L3 for the next run
                stats["l3_pages_spilled_at_stop"] = ctl.spill_all()
            elif ctl.cluster is not None:  # and to the cluster tier, for the next instance
                ctl.spill_all()
            ctl.check_agreement()
            stats["agreement_checks"] = ctl.counters["agreement_checks"]
            stats["collectives"] = ctl.counters["collectives"]
            if ctl.l3 is not None:
                stats.update(ctl.l3.stats())
            if ctl.cluster is not None:
                stats.update(ctl.cluster.stats())
            progress.close()
        finally:
            ctl.close()
        counters["compose_barriers"] = group.stats.barriers
        barrier_s = group.stats.barrier_s
    stats.update(counters)
    stats["digest"] = ctl.digest()
    stats["wall_s"] = time.perf_counter() - started
    stats["device"] = str(where.device)
    stats["forward_s"] = clock.forward_s
    stats["compose_s"] = clock.compose_s
    stats["compose_timed_bytes"] = clock.compose_bytes
    stats["barrier_s"] = barrier_s
    return stats


def _admit(ctl: Any, requests: list[tuple[int, ...]], admitted: list[int], hits: dict, page: int,
           counters: dict) -> list[_Running]:
    """Load-back and new pages for each admitted request (every call replicated)."""
    running = []
    asks: list[tuple[_Running, np.ndarray, np.ndarray]] = []  # (request, keys, their fresh pages) for the cluster
    loads = ctl.load_batch([hits[index] for index in admitted])
    for index, load in zip(admitted, loads):
        blocks = np.asarray(requests[index], dtype=np.int64)
        hit = hits[index]
        counters["blocks"] += len(blocks)
        counters["device_hit_blocks"] += hit.device_tokens // page
        counters["host_hit_blocks"] += (hit.host_tokens - hit.device_tokens) // page
        cached = np.concatenate([hit.device_pages, load.pages]).astype(np.int64)
        # Fully cached: the last page is recomputed, as engines do.
        keep = min(len(cached), len(blocks) - 1)
        fresh = ctl.allocate(len(blocks) - keep)
        if fresh is None:  # the device is full of locked pages: run it uncached
            counters["requests_uncached"] += 1
            keep = 0
        dropped = cached[keep:]
        if len(dropped):
            ctl.free(dropped[np.isin(dropped, load.pages)])
        if fresh is not None:
            tokens = block_tokens(blocks, page)
            r = _Running(tokens, blocks, load, np.concatenate([cached[:keep], fresh]).astype(np.int64), keep)
            if ctl.l3 is not None:
                # Pages past the cached prefix that L3 holds (the last one is recomputed, as engines do):
                # found on every rank alike, read by the owner of each one's device page.
                keys = ctl.core.page_keys(tokens)[keep:len(blocks) - 1]
                found = ctl.l3.lookup_run(keys)
                r.l3_found = len(found)
                if len(found):
                    positions, data = ctl.l3.read(found, fresh)
                    r.l3_pages, r.l3_data = fresh[positions], data
            if ctl.cluster is not None:
                # Past the cached prefix and L3's run: asked of the cluster, for the whole batch at once.
                below = keep + r.l3_found
                asks.append((r, ctl.core.page_keys(tokens)[below:len(blocks) - 1], fresh[r.l3_found:]))
            running.append(r)
    if ctl.cluster is not None:
        # C (skipped alike on every rank when nothing is asked): found on every rank alike, each page
        # read by the owner of its device page.
        for (r, _, pages), found in zip(asks, ctl.cluster.find([keys for _, keys, _ in asks])):
            if len(found):
                positions, data = ctl.cluster.read(found, pages)
                r.cluster_pages, r.cluster_data = pages[positions], data
    return running


def _forward(ctl: Any, group: Any, running: list[_Running], options: ReplayOptions, payload_names: list[str],
             counters: dict, layout: Any, device: Any, clock: ReplayClock, check: ByteCheck,
             expected_rows: ExpectedRows) -> None:
    """The forward's layers. Device pools: everything is queued on the caller's stream (the host
    waits only in the compose barrier); the caller reads the check's counts after its sync."""
    import torch

    from cpkv.compose import ComposePlan, SlotSpans

    if not running:
        for layer in range(options.layers):  # a forward with no request still backs up, like any other
            ctl.backup_layer(layer)
        return
    # New KV goes straight into its owner's pool, so every page of a request is read from the pools
    # (the compose barrier orders these writes before any peer's gather). One plan serves every
    # layer and payload of the batch.
    spans, slot = [], 0
    for r in running:
        spans.append(SlotSpans(_runs(slot, r.pages), []))
        slot += len(r.pages)
    plan = ComposePlan(layout.cp_size, options.page_size, spans, slot, pool_rows=-(-options.device_pages
                                                                                   // layout.cp_size))
    pages = np.concatenate([r.pages for r in running])
    expected_rows.set_blocks(np.concatenate([r.blocks for r in running]))
    is_new = np.concatenate([np.arange(len(r.pages)) >= r.cached for r in running])
    owned_new = np.flatnonzero(is_new & (pages % layout.cp_size == layout.rank))
    # Layer-invariant indices: built once per batch on the CPU, uploaded once.
    mine = torch.from_numpy(owned_new).to(device)
    mine_rows = torch.from_numpy(pages[owned_new] // layout.cp_size).to(device)
    nothing_staged = {name: torch.empty(0, *spec.page_shape, dtype=spec.dtype, device=device)
                      for name, spec in options.payloads.items()}
    # Pages this rank reads back from L3 (owned, read whole): their bytes replace the new KV written for
    # them, so the byte check below verifies every byte L3 served.
    l3 = [r for r in running if r.l3_pages is not None and len(r.l3_pages)]
    if l3:
        l3_rows = torch.from_numpy(np.concatenate([r.l3_pages for r in l3]) // layout.cp_size).to(device)
        l3_data = torch.from_numpy(np.concatenate([r.l3_data for r in l3])).to(device)
        offsets = ctl.l3.offsets
    # Pages this rank read from the cluster tier (owned, checked): the same, verified the same way.
    cluster = [r for r in running if r.cluster_pages is not None and len(r.cluster_pages)]
    if cluster:
        cluster_rows = torch.from_numpy(np.concatenate([r.cluster_pages for r in cluster]) // layout.cp_size).to(device)
        cluster_data = torch.from_numpy(np.concatenate([r.cluster_data for r in cluster])).to(device)
    forward = counters["forwards"]
    for layer in range(options.layers):
        for r in running:
            r.load.wait(layer)  # device pools: the caller's stream waits for the layer's load-back
        for p, name in enumerate(payload_names):
            key = f"{name}@{layer}"
            row_bytes = options.payloads[name].row_bytes
            expected = expected_rows.rows(layer, p)
            pool = group.pool(key).view(torch.uint8).view(-1, row_bytes)
            pool.index_copy_(0, mine_rows, expected.index_select(0, mine))  # this layer's new KV, owned pages
            if l3:
                at = offsets[name] + layer * row_bytes
                pool.index_copy_(0, l3_rows, l3_data[:, at:at + row_bytes])
            if cluster:
                at = ctl.cluster.offsets[name] + layer * row_bytes
                pool.index_copy_(0, cluster_rows, cluster_data[:, at:at + row_bytes])
            started = clock.start()
            dense = group.compose(plan, key, nothing_staged[name], layer=layer)
            clock.stop(started, dense.numel() * dense.element_size())
            got = dense.view(torch.uint8).view(slot, row_bytes)
            if after_compose is not None:
                after_compose(forward, name, layer, got)
            counters["composed_bytes"] += got.numel()
            counters["verified_bytes"] += got.numel()  # less the wrong rows' bytes, once the forward is read
            check.compare(got, expected)
        ctl.backup_layer(layer)


def _runs(first_slot: int, pages: np.ndarray) -> list[tuple[int, int, int]]:
    """``pages`` at consecutive slots from ``first_slot`` as (slot, page, count) spans of consecutive pages."""
    starts = np.r_[0, np.flatnonzero(np.diff(pages) != 1) + 1]
    counts = np.diff(starts, append=len(pages))
    return [(first_slot + int(i), int(pages[i]), int(c)) for i, c in zip(starts, counts)]


class _Progress:
    """A live bar on stderr (tqdm), only on a terminal and unless --quiet."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="req", file=sys.stderr, desc="replay")

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
