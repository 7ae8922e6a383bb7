"""CacheController: one rank's engine-facing two-tier cache.

Every decision comes from the Rust :class:`~cpkv._cpkv.TierCache`, which every rank drives with
the same calls; this class moves the bytes this rank owns (logical page ``p`` is rank
``p % cp``'s row ``p // cp``), runs the two collectives and keeps time.

One forward (``C``: a collective, every rank issues it in the same order, whatever its hits)::

    hit = ctl.lookup(tokens)                # device hit, host hit; the path is locked
    load = ctl.load(hit)                    # device pages for the host-only part; copies start
                                            # (load_batch: a forward's requests in one copy)
    new = ctl.allocate(n)                   # pages for the new tokens (evicting as needed)
    for layer in range(L):
        load.wait(layer)                    # this layer's owned pages are in the device pool
        ...compose, run the layer, write the new KV to the owners' pools...
        ctl.backup_layer(layer)             # write-through: owned pages of pending backups
    ctl.insert(tokens, pages)               # the tree adopts the pages; backups are reserved
    ctl.release(hit)                        # the lookup's lock
    ctl.end_forward()                       # C: MIN of the done frontiers -> commit;
                                            # C every k forwards: the digest agreement
                                            # (cpkv.runtime.agree)

A backup reserved by ``insert`` is copied by the ``backup_layer`` calls that follow (the next
forward's layers, or :meth:`flush_backups`), and committed by the first ``end_forward`` after
every rank finished it. Nothing else is collective: placement and eviction are computed.

With ``l3_dir`` / ``l3_bytes`` a durable third tier (:mod:`cpkv.tier.l3.tier`) sits below the slab:
``insert`` writes the pages host eviction released to it (never write-through), ``digest`` and the
agreement check cover its index, and ``spill_all`` moves every cached page there at a clean stop.

Bytes move through :mod:`cpkv.tier.copy`, the copy the engine adapters use too. CUDA pools: copies
run on two side streams of the pools' device and never block the host (:mod:`cpkv.tier.streams`
says how they are ordered against the caller's stream). A backup is
``non_blocking`` device-to-host into the pinned slab, each layer marked done by an event; it counts
as finished (and can be committed) once its events have completed. Pages a backup may still read
are safe to reuse: ``allocate`` and ``load`` order the caller's and the load stream after the
backups issued so far.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from cpkv._cpkv import DEFAULT_POLICY, InsertOutcome, Lookup, TierCache
from cpkv.config import CpkvConfig, config
from cpkv.errors import ArgumentTypeError, CollectiveTimeoutError, InvalidArgumentError
from cpkv.runtime.agree import agree, all_reduce_min
from cpkv.runtime.gloo_group import gloo_group_of
from cpkv.runtime.layout import CpLayout
from cpkv.tier import streams as _streams
from cpkv.tier.copy import RowCopy, SlabCopier, word_dtype
from cpkv.tier.slab import HostSlab, SlabSpec
from cpkv.tier.timing import CopyTimes
from cpkv.tier.warnings import RateLimitedLog

log = logging.getLogger("cpkv.tier")


@dataclass
class _PendingBackup:
    ticket: int
    copy: RowCopy
    started: float
    layers_done: set[int] = field(default_factory=set)  # layers whose copies are issued
    events: dict[int, Any] = field(default_factory=dict)  # device pools: layer -> its copy's done event


@dataclass
class _LoadJob:
    """One ``load_batch``'s copy for the load-back worker, and what the load stream waits for first."""

    signals: _LoadSignals
    copy: RowCopy
    after: list[Any]


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def _layer_index(layer: Any, num_layers: int) -> int:
    """``layer`` as an int in ``[0, num_layers)``: ArgumentTypeError for a bool, a float or anything
    else that is no int (even when it would compare equal to one), InvalidArgumentError out of range."""
    if isinstance(layer, bool):
        raise ArgumentTypeError(f"layer must be an int, got {layer!r}")
    try:
        index = operator.index(layer)
    except TypeError:
        raise ArgumentTypeError(f"layer must be an int, got {layer!r}") from None
    if not 0 <= index < num_layers:
        raise InvalidArgumentError(f"layer {index} is not in [0, {num_layers})")
    return index


def _check_lookup(hit: Any, what: str) -> None:
    if not isinstance(hit, Lookup):
        raise ArgumentTypeError(f"{what} takes a Lookup from lookup(), got {hit!r}")


def _pools_device(device_pools: Mapping[str, Sequence[Any]]) -> Any:
    """The one device every pool is on (CUDA pools on two devices, or mixed with CPU ones, are refused)."""
    devices = {str(p.device): p.device for layers in device_pools.values() for p in layers}
    if len(devices) != 1:
        raise InvalidArgumentError(f"every device pool must be on one device, got {sorted(devices)}")
    return next(iter(devices.values()))


class _LoadSignals:
    """What the load-back worker tells every handle of one ``load_batch`` (they share its copies):
    per layer, set once the layer's copy is done (CPU pools) or issued (device pools), that copy's
    device event, and the error that ended the batch. Shared, so a forward of ``n`` loads costs
    ``L`` signals and ``L`` stream waits, not ``n * L`` of each."""

    def __init__(self, num_layers: int, *, ready: bool = False) -> None:
        self.ready = [threading.Event() for _ in range(num_layers)]
        self.events: list[Any] = [None] * num_layers  # device pools: the layer's copy-done event
        self.waited: list[Any] = [None] * num_layers  # device pools: the stream that last waited on it
        self.error: BaseException | None = None
        if ready:
            for event in self.ready:
                event.set()


class LoadHandle:
    """A load-back in flight: ``pages`` are the device pages it fills, ``wait(layer)`` blocks
    until this rank's owned pages of that layer are in its pool."""

    def __init__(self, pages: np.ndarray, num_layers: int, timeout_s: float, streams: Any = None, *,
                 signals: _LoadSignals | None = None) -> None:
        self.pages = pages
        # load_batch's handles share their batch's signals; a handle made alone has its own.
        self._signals = signals if signals is not None else _LoadSignals(num_layers)
        self._streams = streams
        self._timeout_s = timeout_s

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    @property
    def error(self) -> BaseException | None:
        """What ended this load (its batch's copy failed or a wait ran out of time), else None."""
        return self._signals.error

    def wait(self, layer: int) -> None:
        """CPU pools: returns once the layer's rows are in the pool. Device pools: returns once its
        copies are issued, and the caller's current stream then waits for them (the host does not)."""
        signals = self._signals
        layer = _layer_index(layer, len(signals.ready))
        if not signals.ready[layer].wait(self._timeout_s):
            signals.error = CollectiveTimeoutError(f"load-back of layer {layer} did not finish within "
                                                   f"{self._timeout_s:g} s")
        if signals.error is not None:
            raise signals.error
        event = signals.events[layer]
        if event is not None:
            stream = self._streams.current()
            # Another handle of the batch may have made this stream wait on the event already.
            if signals.waited[layer] != stream:
                self._streams.wait(stream, event)
                signals.waited[layer] = stream

    def wait_all(self) -> None:
        for layer in range(len(self._signals.ready)):
            self.wait(layer)

    def done(self) -> bool:
        return all(e.is_set() for e in self._signals.ready)


class CacheController:
    """One rank's two-tier CP cache over ``process_group`` (gloo on CPU, NCCL on CUDA).

    Collective to build (every rank, same arguments): it creates the shared :class:`HostSlab`
    unless one is given. ``device_pools[payload][layer]`` is this rank's device pool of that
    layer, ``[rows, *page_shape]`` with ``rows >= ceil(device_pages / cp)``.
    """

    def __init__(
        self,
        *,
        layout: CpLayout,
        device_pages: int,
        host_pages: int,
        payloads: Mapping[str, SlabSpec],
        device_pools: Mapping[str, Sequence[Any]],
        policy: str = DEFAULT_POLICY,
        process_group: Any = None,
        settings: CpkvConfig | None = None,
        slab: HostSlab | None = None,
        l3_dir: str | None = None,
        l3_bytes: int | None = None,
        l3_model: str = "cpkv",
        cluster_master: str | None = None,
        cluster_metadata: str | None = None,
        cluster_bytes: int | None = None,
    ) -> None:
        import torch
        import torch.distributed as dist

        self.settings = settings if settings is not None else config()
        self.layout = layout
        self._dist = dist if dist.is_available() and dist.is_initialized() else None
        self._pg = process_group
        world = self._dist.get_world_size(process_group) if self._dist else 1
        rank = self._dist.get_rank(process_group) if self._dist else 0
        if (world, rank) != (layout.cp_size, layout.rank):
            raise InvalidArgumentError(f"layout says rank {layout.rank} of {layout.cp_size}, the process group "
                                       f"says rank {rank} of {world}")
        # A bad host_pages is rejected (with its name) by TierCache itself.
        valid_host = type(host_pages) is int and host_pages > 0
        host_free = int(self.settings.host_free_target * host_pages) if valid_host else 0
        self.core = TierCache(page_size=layout.page_size, cp_size=layout.cp_size, device_pages=device_pages,
                              host_pages=host_pages, policy=policy, host_free_target=host_free)
        if not payloads:
            raise InvalidArgumentError("payloads must name at least one payload")
        self.payloads = dict(payloads)
        self.num_layers = self._check_pools(device_pools, device_pages)
        self.device = _pools_device(device_pools)
        # CUDA pools: copies on side streams of the pools' device (not the current one); CPU pools: None.
        self._streams: Any = _streams.stream_ops(self.device)  # CudaStreams, a test's double, or None
        pool_bytes = {name: [p.view(torch.uint8).view(p.shape[0], -1) for p in device_pools[name]]
                      for name in self.payloads}
        # The slab and the commit/agreement collectives carry host values: over the process group when it
        # is gloo, else over a gloo group of the same ranks (NCCL cannot set up a host slab).
        self._host_pg = gloo_group_of(process_group, self.settings.collective_timeout_s) if self._dist else None
        # Pinned (page-locked, registered with CUDA) only for CUDA pools, registered from their device:
        # CPU pools on a GPU machine start no CUDA context and lock no memory.
        self.slab = slab if slab is not None else self._create_slab(host_pages)
        if self.slab.num_pages < host_pages or self.slab.num_layers != self.num_layers:
            raise InvalidArgumentError(f"slab has {self.slab.num_pages} pages x {self.slab.num_layers} layers, "
                                       f"the cache needs {host_pages} x {self.num_layers}")
        # Rows move as the widest integer word that divides them (the torch copies' speed).
        words = {name: word_dtype(*pool_bytes[name], self.slab.rows(name)) for name in self.payloads}
        self._pools = {name: [p.view(words[name]) for p in pool_bytes[name]] for name in self.payloads}
        self._slab_rows = {name: self.slab.rows(name).view(words[name]) for name in self.payloads}
        self._copier = SlabCopier()
        self._load_stream = self._streams.new_stream("load") if self._streams else None
        self._backup_stream = self._streams.new_stream("backup") if self._streams else None
        self._backup_tail: Any = None  # the last backup copy's event: pages it read may be reused after it
        self._load_tail: Any = None  # the last load-back copy's event: slab rows it read may be rewritten after it
        self._backups: list[_PendingBackup] = []
        self._merged_backups: tuple[tuple[int, ...], RowCopy | None] = ((), None)
        self._loads: list[LoadHandle] = []  # one per load_batch, over all its pages
        self._load_failed = False
        self._load_worker: threading.Thread | None = None
        self._copy_queue: list[_LoadJob] = []
        self._copy_cv = threading.Condition()
        self._closed = False
        self.forwards = 0
        self.warnings = RateLimitedLog(self.settings.warn_interval_s, log)
        self.counters = {"bytes_backed_up": 0, "bytes_loaded": 0, "collectives": 0, "agreement_checks": 0,
                         "transfers_aborted": 0}
        self.copy_times = CopyTimes(self._streams)  # what backups and load-backs took (stats: *_copy_ns)
        # The durable third tier (cpkv.tier.l3): pages host eviction releases go there; None when off.
        self.l3: Any = None
        if l3_dir is not None or l3_bytes is not None:
            from cpkv.tier.l3.tier import L3Tier, check_l3_options

            check_l3_options(l3_dir, l3_bytes)
            assert l3_dir is not None and l3_bytes is not None  # both or neither, checked above
            self.core.enable_spills()
            self.l3 = L3Tier(l3_dir, l3_bytes, slab=self.slab, payloads=self.payloads, num_layers=self.num_layers,
                             page_size=layout.page_size, rank=layout.rank, cp_size=layout.cp_size, model=l3_model,
                             all_reduce_min=self._all_reduce_min)
        # The cluster tier (cpkv.tier.cluster) below L3 (or the slab): pages host eviction releases are
        # put there by their writer rank; None when off.
        self.cluster: Any = None
        if cluster_master is not None or cluster_metadata is not None or cluster_bytes is not None:
            from cpkv.tier.cluster.tier import ClusterTier, check_cluster_options

            check_cluster_options(cluster_master, cluster_metadata, cluster_bytes)
            assert cluster_master is not None and cluster_metadata is not None  # both or neither, checked above
            self.core.enable_spills()
            self.cluster = ClusterTier(cluster_master, cluster_metadata, slab=self.slab, payloads=self.payloads,
                                       num_layers=self.num_layers, page_size=layout.page_size, rank=layout.rank,
                                       cp_size=layout.cp_size, model=l3_model,
                                       timeout_s=self.settings.transfer_timeout_s,
                                       all_reduce_min=self._all_reduce_min,
                                       segment_bytes=(cluster_bytes or 0) // layout.cp_size)

    @property
    def streams(self) -> Any:
        """How the cache orders its copies (:mod:`cpkv.tier.streams`): CUDA streams of the pools'
        device, or None for CPU pools. An engine orders its own work on the same terms."""
        return self._streams

    # -- setup --------------------------------------------------------------------------------

    def _create_slab(self, host_pages: int) -> HostSlab:
        def create() -> HostSlab:
            return HostSlab.create(self.payloads, num_pages=host_pages, num_layers=self.num_layers,
                                   process_group=self._host_pg, timeout_s=self.settings.collective_timeout_s,
                                   pin=self.device.type == "cuda")

        if self._streams is None:
            return create()
        with self._streams.device_guard():
            return create()

    def _check_pools(self, device_pools: Mapping[str, Sequence[Any]], device_pages: int) -> int:
        rows_needed = -(-int(device_pages) // self.layout.cp_size)
        if set(device_pools) != set(self.payloads):
            raise InvalidArgumentError(f"device_pools has payloads {sorted(device_pools)}, "
                                       f"payloads are {sorted(self.payloads)}")
        layers = {len(device_pools[name]) for name in self.payloads}
        if len(layers) != 1 or 0 in layers:
            raise InvalidArgumentError(f"every payload needs the same number (>= 1) of layer pools, got "
                                       f"{ {name: len(device_pools[name]) for name in self.payloads} }")
        for name, spec in self.payloads.items():
            for layer, pool in enumerate(device_pools[name]):
                want = (rows_needed, *spec.page_shape)
                if pool.dtype != spec.dtype or tuple(pool.shape[1:]) != tuple(spec.page_shape) \
                        or pool.shape[0] < rows_needed or not pool.is_contiguous():
                    raise InvalidArgumentError(
                        f"payload {name!r} layer {layer}: pool is {tuple(pool.shape)} {pool.dtype}, needs a "
                        f"contiguous {want} (or more rows) of {spec.dtype}")
        return layers.pop()

    # -- per request ----------------------------------------------------------------------------

    def lookup(self, tokens: Any, namespace: Any = None) -> Lookup:
        """Longest cached prefix in either tier; locks it until :meth:`release`."""
        self._check_open()
        return self.core.lookup(tokens, namespace)

    def release(self, hit: Lookup) -> None:
        """Undoes :meth:`lookup`'s lock (call once the request's pages are inserted or dropped)."""
        self._check_open()
        _check_lookup(hit, "release")
        if hit.locked:
            self.core.unlock(hit.node)

    def allocate(self, num_pages: int) -> np.ndarray | None:
        """Device pages for new tokens (replicated; evicts device leaves as needed), or None."""
        self._check_open()
        pages = self.core.allocate(num_pages)
        self._after_backups()  # an evicted page may still be read by a backup copy in flight
        return pages

    def free(self, pages: Any) -> None:
        """Gives back device pages this request holds and will not insert. A page a load-back is
        still filling is given back once its copy is done (it could be reallocated otherwise); on
        a device, once the caller's stream waits for the copy (issued is not done there)."""
        self._check_open()
        for handle in self._loads:
            if not self._load_settled(handle) and np.isin(handle.pages, pages).any():
                handle.wait_all()
        self.core.free(pages)

    def load(self, hit: Lookup) -> LoadHandle:
        """Brings the host-only part of ``hit`` back: device pages are taken now (replicated) and
        this rank's owned rows are copied from the slab in the background, layer by layer."""
        return self.load_batch([hit])[0]

    def load_batch(self, hits: Sequence[Lookup]) -> list[LoadHandle]:
        """:meth:`load` for a forward's requests at once: their copies go to the worker together,
        as one copy per layer (fewer, longer copies than request by request)."""
        self._check_open()
        if isinstance(hits, (str, bytes)) or not isinstance(hits, Sequence):
            raise ArgumentTypeError(f"load_batch takes a sequence of Lookups, got {hits!r}")
        for hit in hits:  # all checked before any page is taken
            _check_lookup(hit, "load")
        timeout_s = self.settings.transfer_timeout_s
        loading, nothing = _LoadSignals(self.num_layers), _LoadSignals(self.num_layers, ready=True)
        handles: list[LoadHandle] = []
        loaded: list[np.ndarray] = []
        host_rows: list[np.ndarray] = []
        for hit in hits:
            runs = self.core.plan_load(hit.node) if hit.locked and hit.host_tokens > hit.device_tokens else []
            if runs:
                pages = np.concatenate([r.device_pages for r in runs])
                loaded.append(pages)
                host_rows.extend(r.host_pages for r in runs)
                handles.append(LoadHandle(pages, self.num_layers, timeout_s, self._streams, signals=loading))
            else:
                handles.append(LoadHandle(np.zeros(0, dtype=np.int64), self.num_layers, timeout_s, self._streams,
                                          signals=nothing))
        if loaded:
            # The load stream starts after what the caller queued so far (an earlier forward's kernels
            # may still read the rows it overwrites) and after the backups issued so far.
            after = [] if self._streams is None else \
                [e for e in (self._streams.record(self._streams.current()), self._backup_tail) if e is not None]
            # The batch as one handle over all its pages (what end_forward checks and free waits for)
            # and one copy: the owned rows of all its pages at once.
            pages = np.concatenate(loaded)
            self._loads.append(LoadHandle(pages, self.num_layers, timeout_s, self._streams, signals=loading))
            self._enqueue(_LoadJob(loading, self._owned(pages, np.concatenate(host_rows)), after))
        return handles

    def insert(self, tokens: Any, pages: Any, namespace: Any = None) -> InsertOutcome:
        """Caches ``tokens`` on ``pages`` and reserves write-through backups (replicated)."""
        self._check_open()
        out = self.core.insert(tokens, pages, namespace)
        if self.l3 is not None or self.cluster is not None:
            # Host eviction freed these rows; no rank writes them before the next end_forward, which
            # this rank reaches only once its share is copied out.
            self._spill(self.core.take_spills())
        now = time.monotonic()
        for b in out.backups:
            self._backups.append(_PendingBackup(b.ticket, self._owned(b.device_pages, b.host_pages), now))
        if out.skipped_pages:
            self.warnings.warn("skipped_backup", f"host tier full: skipped the backup of {out.skipped_pages} pages "
                               "on every rank")
        return out

    # -- per layer ----------------------------------------------------------------------------

    def backup_layer(self, layer: int) -> None:
        """Copies ``layer`` of every pending backup's owned pages from the device pool to the slab
        (device pools: issued on the backup stream after the caller's queued work, not waited for)."""
        self._check_open()
        layer = _layer_index(layer, self.num_layers)
        due = [b for b in self._backups if layer not in b.layers_done]
        if not due:
            return
        # One copy per payload for all of them, not one per backup; the same backups are usually due
        # at every layer, so their merged copy (and its runs) is built once.
        tickets = tuple(b.ticket for b in due)
        merged = self._merged_backups[1]
        if self._merged_backups[0] != tickets or merged is None:
            merged = RowCopy.merged([b.copy for b in due])
            self._merged_backups = (tickets, merged)
        done = None
        nbytes = self._copy_bytes(merged) // self.num_layers
        if self._streams is None:
            started = time.perf_counter()
            self._copy_layer(layer, merged, to_slab=True)
            self.copy_times.add_host("backup", nbytes, time.perf_counter() - started)
        else:
            ops, stream = self._streams, self._backup_stream
            ops.wait(stream, ops.record(ops.current()))  # the layer's KV, written by the caller's queued work
            if self._load_tail is not None:
                ops.wait(stream, self._load_tail)  # slab rows a load-back still reads
            start = ops.record(stream, timing=True)  # after the waits: the copy's own time
            with ops.on(stream):
                self._copy_layer(layer, merged, to_slab=True)
            done = self._backup_tail = ops.record(stream, timing=True)
            self.copy_times.add_device("backup", nbytes, start, done)
        for backup in due:
            backup.layers_done.add(layer)
            if done is not None:
                backup.events[layer] = done

    def flush_backups(self) -> None:
        """Copies every layer of every pending backup and waits until the bytes are in the slab (an
        idle engine, or before shutdown), so the next :meth:`end_forward` can commit all of them.
        With L3, call it after an ``end_forward``, not between an ``insert`` and the next one: rows an
        ``insert`` spilled may still be read by their writer rank until that commit point."""
        for layer in range(self.num_layers):
            self.backup_layer(layer)
        if self._streams is not None:
            for backup in self._backups:
                for event in backup.events.values():
                    self._streams.synchronize(event)

    # -- per forward (collective) -----------------------------------------------------------------

    def end_forward(self) -> None:
        """The commit point. C: one MIN all-reduce of (completed-backup frontier, transfers healthy);
        commits what every rank finished, or aborts every transfer in flight on every rank when
        one rank's ran out of time. Every ``check_every`` forwards, C: the digest agreement check."""
        self._check_open()
        self.copy_times.settle()
        unfinished = [b for b in self._backups if not self._backup_finished(b)]
        # Tickets are issued in order, so the frontier is just below the oldest unfinished one.
        frontier = min(b.ticket for b in unfinished) - 1 if unfinished else self.core.issued
        now = time.monotonic()
        overdue = any(now - b.started > self.settings.transfer_timeout_s for b in unfinished)
        healthy = 0 if overdue or self._load_failed or any(h.error is not None for h in self._loads) else 1
        if self.l3 is not None:
            self.l3.flush()  # this forward's spills durable before the commit point
        # With L3: whether this rank's L3 I/O held up; one rank's failure stops the tier on every rank here.
        l3_ok = self.l3.healthy() if self.l3 is not None else 1
        frontier_min, healthy_min, l3_ok_min = self._all_reduce_min([frontier, healthy, l3_ok], "commit frontier")
        if l3_ok_min == 0:
            self._stop_l3()
        self._loads = [h for h in self._loads if not self._load_settled(h)]
        if healthy_min == 0:
            aborted = self.core.abort_pending()
            self._backups.clear()
            self._load_failed = False
            self.counters["transfers_aborted"] += len(aborted)
            self.warnings.warn("aborted_transfer", f"a transfer ran out of time on some rank: aborted "
                               f"{len(aborted)} backups on every rank")
        else:
            committed, _ = self.core.commit(frontier_min)
            committed_set = set(committed)
            self.counters["bytes_backed_up"] += sum(self._copy_bytes(b.copy) for b in self._backups
                                                    if b.ticket in committed_set)
            # Every ticket up to the frontier is committed or released now.
            self._backups = [b for b in self._backups if b.ticket > frontier_min]
        self.forwards += 1
        if self.forwards % self.settings.check_every == 0:
            self.check_agreement()

    def check_agreement(self) -> None:
        """C: the digest agreement (:func:`cpkv.runtime.agree.agree`, all 64 bits in one MIN
        all-reduce): equal on every rank or :class:`DivergenceError` on every rank, naming which
        ranks hold which digest."""
        self._check_open()
        digest = self.digest()
        self.counters["collectives"] += 1
        if self._dist is not None:
            agree(digest, group=self._host_pg, rank=self.layout.rank,
                  step=f"digest check at forward {self.forwards}", timeout_s=self.settings.collective_timeout_s)
        self.counters["agreement_checks"] += 1  # passed ones (the replay report's "agreement checks passed")

    def digest(self) -> int:
        """The tiers' digest (with L3: combined with the L3 index's, so the agreement covers it)."""
        if self.l3 is None:
            return self.core.digest()
        from cpkv.tier.l3.tier import combined_digest

        return combined_digest(self.core.digest(), self.l3.digest())

    def spill_all(self) -> int:
        """With L3 or the cluster tier, a clean stop: every cached page leaves device and slab for them
        (replicated; call after the last ``end_forward``, with no lookup held). Returns the pages placed
        in L3 (with no L3: the pages this rank put in the cluster)."""
        self._check_open()
        if self.l3 is None and self.cluster is None:
            return 0
        self.core.evict_device(self.core.device_pages)
        self.core.evict_host(self.core.host_pages)
        placed = self._spill(self.core.take_spills())
        if self.l3 is not None:
            self.l3.flush()
            (l3_ok,) = self._all_reduce_min([self.l3.healthy()], "L3 stop spill")
            if l3_ok == 0:
                self._stop_l3()
        return placed

    def _stop_l3(self) -> None:
        """C (every rank at the same point): one rank's L3 I/O failed, so the tier takes no more pages."""
        assert self.l3 is not None
        if self.l3.stopped is None:
            self.l3.stop("another rank's L3 I/O failed")
            self.warnings.warn("l3_stopped", f"L3 stopped taking pages on every rank: {self.l3.stopped}")

    def put_to_cluster(self, tokens: Any, pages: Any, first: int) -> int:
        """Put on backup (``cpkv replay --cluster-put backup``; CPU pools): pages ``first`` onwards of
        a request just inserted go to the cluster tier from the device pools, each put by the rank that
        owns its device page (one copy per cluster; the default puts pages on eviction instead).
        Not collective. Returns the pages this rank put."""
        self._check_open()
        if self.cluster is None:
            return 0
        keys = self.core.page_keys(tokens)
        pages = np.asarray(pages, dtype=np.int64)[:len(keys)]
        mine = [i for i in range(first, len(pages)) if pages[i] % self.layout.cp_size == self.layout.rank]
        put = 0
        for start in range(0, len(mine), self.cluster.batch):
            part = mine[start:start + self.cluster.batch]
            rows = pages[part] // self.layout.cp_size
            put += self.cluster.put_pages([int(keys[i]) for i in part], lambda out, rows=rows: self._gather_pool_rows(
                rows, out))
        return put

    def _gather_pool_rows(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Device pool ``rows`` (CPU pools) laid out as L3 pages into ``out``'s rows."""
        offsets = self.cluster.offsets
        for name, spec in self.payloads.items():
            for layer, pool in enumerate(self._pools[name]):
                at = offsets[name] + layer * spec.row_bytes
                out[:, at:at + spec.row_bytes] = pool.view(torch_uint8()).numpy()[rows]

    def _spill(self, spilled: list) -> int:
        """Pages host eviction released, to L3 and to the cluster tier (each its writer rank's share).
        Returns the pages L3 placed (with no L3: the pages this rank put in the cluster)."""
        put = self.cluster.spill(spilled) if self.cluster is not None else 0
        return self.l3.spill(spilled) if self.l3 is not None else put

    def stats(self) -> dict[str, int]:
        """Replicated decision counters, this rank's byte counters and copy times (``backup_copy_ns``,
        ``load_copy_ns`` and their bytes: :mod:`cpkv.tier.timing`), and suppressed warnings."""
        out = dict(self.core.stats())
        out.update(self.counters)
        self.copy_times.settle()
        out.update(self.copy_times.counters())
        out["forwards"] = self.forwards
        if self.l3 is not None:
            out.update(self.l3.stats())
        if self.cluster is not None:
            out.update({k: v for k, v in self.cluster.stats().items() if isinstance(v, int)})
        out.update({f"warnings_{kind}": n for kind, n in self.warnings.counts.items()})
        return out

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Local and idempotent: stops the copier and unmaps the slab (its names are long gone)."""
        if self._closed:
            return
        self._closed = True
        with self._copy_cv:
            self._copy_queue.clear()
            self._copy_cv.notify_all()
        if self._load_worker is not None:
            self._load_worker.join(timeout=self.settings.transfer_timeout_s)
        for tail in (self._backup_tail, self._load_tail):
            if tail is not None:  # no copy may still use the slab when it is unpinned and unmapped
                self._streams.synchronize(tail)
        if self._streams is not None:
            self.copy_times.settle(wait=True)
        if self.l3 is not None:
            self.l3.close()  # a clean stop: what was written is made durable
        if self.cluster is not None:
            self.cluster.close()
        self._copier.clear()  # its source tables hold views of the slab's mapping
        self._slab_rows.clear()
        self._pools.clear()
        self.slab.close()

    def __enter__(self) -> CacheController:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the cache controller is closed")

    def _backup_finished(self, backup: _PendingBackup) -> bool:
        """Every layer issued, and (device pools) every layer's copy completed: only then may it commit."""
        if len(backup.layers_done) < self.num_layers:
            return False
        if backup.events:
            if not all(self._streams.done(e) for e in backup.events.values()):
                return False
            backup.events.clear()
        return True

    def _load_settled(self, handle: LoadHandle) -> bool:
        """Its copies are done: CPU pools, every layer copied; device pools, also completed there."""
        if not handle.done():
            return False
        events = handle._signals.events
        return self._streams is None or all(e is None or self._streams.done(e) for e in events)

    def _after_backups(self) -> None:
        """The caller's stream waits (on the device) for the backups issued so far."""
        if self._backup_tail is not None:
            self._streams.wait(self._streams.current(), self._backup_tail)

    def _owned(self, device_pages: Any, host_rows: Any) -> RowCopy:
        return RowCopy.owned(self.layout.owned_rows(device_pages, host_rows))

    def _copy_layer(self, layer: int, copy: RowCopy, *, to_slab: bool) -> None:
        """One layer of every payload (device pools: issued on the current stream, which the caller
        has made a side stream)."""
        for name in self.payloads:
            self._copier.copy(copy, self._pools[name][layer], self._slab_rows[name][layer], to_slab=to_slab)

    def _copy_bytes(self, copy: RowCopy) -> int:
        row_bytes = sum(spec.row_bytes for spec in self.payloads.values())
        return len(copy) * row_bytes * self.num_layers

    def _enqueue(self, job: _LoadJob) -> None:
        with self._copy_cv:
            self._copy_queue.append(job)
            self._copy_cv.notify()
        if self._load_worker is None:
            self._load_worker = threading.Thread(target=self._copy_loads, name="cpkv-load", daemon=True)
            self._load_worker.start()

    def _copy_loads(self) -> None:
        """The load-back worker: every load queued so far in one copy per layer, layer by layer, so
        layer i of every request is ready while i + 1 is copied (not request after request)."""
        while True:
            with self._copy_cv:
                while not self._copy_queue and not self._closed:
                    self._copy_cv.wait()
                if self._closed:
                    return
                jobs, self._copy_queue = self._copy_queue, []
            try:
                copy = RowCopy.merged([job.copy for job in jobs])
                if self._streams is None:
                    layer_bytes = self._copy_bytes(copy) // self.num_layers
                    for layer in range(self.num_layers):
                        started = time.perf_counter()
                        self._copy_layer(layer, copy, to_slab=False)
                        # Counted before the waiters hear of it, so their stats() include it.
                        self.copy_times.add_host("load", layer_bytes, time.perf_counter() - started)
                        for job in jobs:
                            job.signals.ready[layer].set()
                else:
                    self._copy_loads_on_device(jobs, copy)
                self.counters["bytes_loaded"] += self._copy_bytes(copy)
            except BaseException as err:  # noqa: BLE001 -- reported to the waiters and to the next commit
                self._load_failed = True
                for job in jobs:
                    job.signals.error = err
                    for event in job.signals.ready:
                        event.set()

    def _copy_loads_on_device(self, jobs: list[_LoadJob], copy: RowCopy) -> None:
        """The load stream waits for what each job's caller had queued, then copies layer by layer;
        each layer's event is what ``LoadHandle.wait`` makes the caller's stream wait on."""
        ops, stream = self._streams, self._load_stream
        for job in jobs:
            for event in job.after:
                ops.wait(stream, event)
        start = ops.record(stream, timing=True)  # after the waits: the copies' own time
        for layer in range(self.num_layers):
            with ops.on(stream):
                self._copy_layer(layer, copy, to_slab=False)
            last = layer == self.num_layers - 1
            event = self._load_tail = ops.record(stream, timing=last)
            if last:  # counted before the waiters hear of it, so their stats() include it
                self.copy_times.add_device("load", self._copy_bytes(copy), start, event)
            for job in jobs:
                job.signals.events[layer] = event
                job.signals.ready[layer].set()

    def _all_reduce_min(self, values: list[int], what: str) -> list[int]:
        self.counters["collectives"] += 1
        if self._dist is None:
            return values
        # Host values, over the gloo group: no device sync.
        return all_reduce_min(values, group=self._host_pg, rank=self.layout.rank, step=what,
                              timeout_s=self.settings.collective_timeout_s)
