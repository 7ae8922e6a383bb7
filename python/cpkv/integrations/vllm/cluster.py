"""The cluster tier under cpkv's own vLLM connector (``CpkvOffloadingSpec``): chunks every vLLM
instance shares through Mooncake Store, below the host tier (and below L3 when L3 is on).

vLLM's connector gives a backend two channels: the specs of the jobs it creates (scheduler ->
workers) and their completion (workers -> scheduler; a worker may not fail a job: vLLM asserts
``success``). The scheduler has no view of the slab and a worker cannot refuse a load, so the work
is split by what each side can do safely:

- **Records.** Each worker's shard of a chunk is its own record (the cluster tier's one format,
  :mod:`cpkv.tier.cluster.pages`: payload, then the L3 trailer with namespace, key, sequence 0,
  length, CRC32C), under a namespace naming the model, dtype, layout, chunk size, parallel geometry
  and the shard. A chunk is a hit only if every worker's record is present and valid.
- **Writes** (:class:`ClusterShard`, worker side): when a store job has copied a chunk into the
  host rows, each worker puts its shard from those rows: ``batch_is_exist``, then
  ``batch_put_from`` of what the cluster lacks (one copy per cluster). Put on store, not on
  eviction: the rows then hold exactly the chunks the job names, and no later job can have
  reused them (a spill carried to a later job can be overtaken by a promotion's fill of the same
  row); other instances also hit the chunk as soon as it is computed.
- **Reads** (:class:`ClusterCatalog`, scheduler side): on a miss below, the lookup answers RETRY
  and a background thread asks ``batch_is_exist`` about every shard's record, then
  ``batch_get_into`` them into a registered staging slot (a memfd nothing of vLLM sees), and checks
  every record (CRC, key, namespace, length). Only then is the chunk a HIT: it takes a host row
  (as an L3 promotion does) and the load's spec names its staging slot; each worker copies its own
  checked shard from the slot into the row before the load copies the row out (the row is not
  visible to the model before that load). The slot is released when the load completed. A record
  that fails is a counted miss, and the chunk's next store replaces it by ``upsert``.
- **Faults.** Every store call is bounded by ``cpkv_timeout_s``. A scheduler call that fails or
  does not answer turns the tier off for the instance (lookups MISS at once, nothing is served);
  while off it probes the store at most every :data:`PROBE_EVERY_STEPS` scheduler steps (counted,
  never timed) and the step after a probe succeeded turns it on again, cold. A worker's failed put
  only costs that chunk its hit (its shard is missing: a miss on every later lookup), so a worker
  needs no channel to report it: it stops putting, and re-attaches by its own probe, every
  :data:`PROBE_EVERY_JOBS` of its jobs. A master down at start is an
  :class:`~cpkv.errors.InvalidArgumentError` naming ``cpkv_cluster_master``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from cpkv import _cpkv
from cpkv.errors import InvalidArgumentError
from cpkv.tier.cluster.mooncake import BoundedStore
from cpkv.tier.cluster.pages import ClusterClient, ClusterPages
from cpkv.tier.cluster.tier import SEQUENCE, TRAILER, object_key
from cpkv.tier.l3.store import L3Namespace

MASTER_SETTING = "kv_connector_extra_config['cpkv_cluster_master']"
PROBE_EVERY_STEPS = 16  # scheduler steps between probes while the tier is off
PROBE_EVERY_JOBS = 16  # a worker's jobs between probes while its puts are off
STAGING_BYTES = 256 << 20  # the scheduler's staging memory, at most (and at least one chunk)
STAGING_CHUNKS = 64  # chunks staged at once, at most
EXIST_BATCH = 128  # objects per batch_is_exist / batch_get_into call


@dataclass(frozen=True)
class ClusterGeometry:
    """What the scheduler and every worker derive alike from vLLM's config."""

    model: str
    dtype: str
    layout: str
    tokens_per_chunk: int
    world: int
    page_bytes: int  # one worker's shard of a chunk

    @property
    def record_bytes(self) -> int:
        return self.page_bytes + TRAILER

    def namespace(self, shard: int) -> int:
        return L3Namespace(model=self.model, dtype=self.dtype,
                           kv_layout=f"vllm offload chunk, {self.layout}, cluster shard {shard} of {self.world}",
                           page_size=self.tokens_per_chunk, cp_size=1, tp_size=self.world,
                           page_bytes=self.page_bytes).id()

    def staging_chunks(self) -> int:
        return max(1, min(STAGING_CHUNKS, STAGING_BYTES // (self.world * self.record_bytes)))


@dataclass
class ClusterFill:
    """A chunk read from the cluster: host ``row`` is filled from staging ``slot`` (every worker's
    checked record of L3 key ``key``, shard ``r`` at ``r * record_bytes``)."""

    row: int
    key: int
    slot: int


class ClusterCatalog:
    """The scheduler side: lookups that fall through to the cluster, checked reads into staging,
    the tier's health (see the module docstring)."""

    def __init__(self, geometry: ClusterGeometry, master: str, metadata: str, timeout_s: float) -> None:
        self.geometry = geometry
        self.namespaces = [geometry.namespace(r) for r in range(geometry.world)]
        self.client = ClusterClient(master, metadata, timeout_s, setting=MASTER_SETTING,
                                    probe_every=PROBE_EVERY_STEPS)
        chunks = geometry.staging_chunks()
        size = chunks * geometry.world * geometry.record_bytes
        # A memfd: no name in /dev/shm to leave behind; the workers map it through /proc.
        self._fd = os.memfd_create("cpkv-cluster-staging")
        try:
            os.ftruncate(self._fd, size)
            self._map = mmap.mmap(self._fd, size)
        except BaseException:
            os.close(self._fd)
            self.client.close()
            raise
        self.staging = np.frombuffer(self._map, dtype=np.uint8).reshape(chunks, geometry.world, geometry.record_bytes)
        self.client.register(self.staging.reshape(-1))
        self.staging_path = f"/proc/{os.getpid()}/fd/{self._fd}"
        self._free = list(range(chunks - 1, -1, -1))
        self._reads: dict[int, tuple[str, int]] = {}  # l3 key -> ("reading" | "ok" | "miss", slot)
        self.replace: set[int] = set()  # keys whose stored record failed its check: the next store upserts
        self.counters = {"cluster_lookups": 0, "cluster_hits": 0, "cluster_pages_read": 0,
                         "cluster_corrupt_dropped": 0, "cluster_no_staging": 0, "cluster_reattaches": 0,
                         "cluster_promoted": 0, "cluster_no_host_room": 0}
        self._inflight = 0
        self._idle = threading.Condition()
        self._work: queue.SimpleQueue[list[tuple[int, int]] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[int, int, bool, bool]] = queue.SimpleQueue()
        self._pending: list[tuple[int, int]] = []  # reads started this step, sent at the step's end
        # Finished reads no lookup used by the end of the next step (its request stopped at an
        # earlier miss, or left) are dropped there, their slots freed: staging never leaks.
        self._finished_now: list[int] = []
        self._finished_before: list[int] = []
        self._thread = threading.Thread(target=self._read_loop, name="cpkv-cluster-read", daemon=True)
        self._thread.start()

    @property
    def available(self) -> bool:
        return self.client.down is None

    # -- the scheduler thread ------------------------------------------------------------------

    def state(self, key: int) -> str | None:
        """This key's read: None (none started), "reading", "ok" (checked, staged) or "miss"."""
        self._collect()
        found = self._reads.get(key)
        return None if found is None else found[0]

    def start_read(self, key: int) -> bool:
        """Starts the read of ``key``'s records (False: the tier is off or no staging slot is free)."""
        if not self.available:
            return False
        if not self._free:
            self.counters["cluster_no_staging"] += 1
            return False
        slot = self._free.pop()
        self.counters["cluster_lookups"] += 1
        self._reads[key] = ("reading", slot)
        self._pending.append((key, slot))
        with self._idle:
            self._inflight += 1
        if len(self._pending) >= EXIST_BATCH // self.geometry.world:
            self._send()
        return True

    def take(self, key: int) -> int:
        """A checked read, used: its staging slot (held until :meth:`release`)."""
        state, slot = self._reads.pop(key)
        assert state == "ok"
        return slot

    def forget(self, key: int) -> None:
        """A read that missed (or whose chunk got no host row): its slot, if any, is free again."""
        _, slot = self._reads.pop(key)
        if slot >= 0:
            self._free.append(slot)

    def release(self, slots: Sequence[int]) -> None:
        """The loads that read these slots completed (or their chunks left the host unread)."""
        self._free.extend(slots)

    def reset(self) -> None:
        """A cache reset: finished reads are forgotten; reads in flight keep their slots until done."""
        self._collect()
        for key in [k for k, (state, _) in self._reads.items() if state != "reading"]:
            self.forget(key)

    def step(self) -> None:
        """The end of a scheduler step: the reads started in it go out together; while the tier is
        off, its probe is polled (one poll per step: the cadence is counted, never timed)."""
        self._send()
        self._collect()
        for key in self._finished_before:
            if key in self._reads and self._reads[key][0] != "reading":
                self.forget(key)
        self._finished_before, self._finished_now = self._finished_now, []
        if not self.available and self.client.probe_ok():
            self.client.reattach()
            self.counters["cluster_reattaches"] += 1

    @property
    def reading(self) -> bool:
        with self._idle:
            return self._inflight > 0

    def wait_idle(self, timeout_s: float) -> bool:
        self._send()
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout_s)

    def _send(self) -> None:
        if self._pending:
            self._work.put(self._pending)
            self._pending = []

    def _collect(self) -> None:
        while not self._results.empty():  # one reader (this thread): empty() is exact for it
            key, slot, ok, corrupt = self._results.get_nowait()
            if not ok:  # nothing staged: the slot is free at once
                self._free.append(slot)
                slot = -1
            self._reads[key] = ("ok" if ok else "miss", slot)
            self._finished_now.append(key)
            if ok:
                self.counters["cluster_hits"] += 1
            if corrupt:
                self.replace.add(key)

    # -- the read thread ------------------------------------------------------------------------

    def _read_loop(self) -> None:
        while True:
            batch = self._work.get()
            if batch is None:
                return
            try:
                outcomes = self._read(batch)
            except Exception:  # noqa: BLE001 -- a read never dies silently: a miss, and the tier goes off
                self.client.mark_down("a cluster read raised", fault=True)
                outcomes = [(False, False)] * len(batch)
            for (key, slot), (ok, corrupt) in zip(batch, outcomes):
                self._results.put((key, slot, ok, corrupt))
            with self._idle:
                self._inflight -= len(batch)
                self._idle.notify_all()

    def _read(self, batch: list[tuple[int, int]]) -> list[tuple[bool, bool]]:
        """Per (key, slot): (every shard's record read whole and checked, some record failed its check)."""
        g, world = self.geometry, self.geometry.world
        names = [object_key(self.namespaces[r], key) for key, _ in batch for r in range(world)]
        present: list[int] = []
        for start in range(0, len(names), EXIST_BATCH):
            codes = self.client.call(partial(BoundedStore.exist, keys=names[start:start + EXIST_BATCH]))
            if codes is None:
                return [(False, False)] * len(batch)
            present.extend(codes)
        whole = [i for i in range(len(batch)) if all(present[i * world + r] == 1 for r in range(world))]
        outcomes = [(False, False)] * len(batch)
        base = self.staging.ctypes.data
        for start in range(0, len(whole), max(1, EXIST_BATCH // world)):
            part = whole[start:start + max(1, EXIST_BATCH // world)]
            keys = [names[i * world + r] for i in part for r in range(world)]
            addresses = [base + (batch[i][1] * world + r) * g.record_bytes for i in part for r in range(world)]
            codes = self.client.call(partial(BoundedStore.get_into, keys=keys, addresses=addresses,
                                             sizes=[g.record_bytes] * len(keys)))
            if codes is None:
                return outcomes
            for j, i in enumerate(part):
                key, slot = batch[i]
                ok, corrupt = True, False
                for r in range(world):
                    code = codes[j * world + r]
                    reason = None if code != g.record_bytes else _cpkv.l3_check_packed(
                        self.staging[slot, r], self.namespaces[r], [key], [SEQUENCE], g.page_bytes)[0]
                    if code != g.record_bytes or reason is not None:
                        ok = False
                        corrupt |= code >= 0  # an object there that is not the record it must be
                self.counters["cluster_pages_read"] += sum(1 for r in range(world) if codes[j * world + r] >= 0)
                self.counters["cluster_corrupt_dropped"] += int(corrupt)
                outcomes[i] = (ok, corrupt)
        return outcomes

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out.update({"cluster_available": int(self.available), "cluster_down": self.client.down,
                    "cluster_faults": self.client.faults, "cluster_probes": self.client.probe.probes,
                    "cluster_staging_free": len(self._free)})
        return out

    def close(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=30)
        self.client.close()
        del self.staging
        with contextlib.suppress(BufferError):  # a view still held elsewhere: the mapping goes with it
            self._map.close()
        os.close(self._fd)


class ClusterShard:
    """One worker's side: puts its shard of the chunks a store job copied in, and copies its shard
    of a staged read into a host row (see the module docstring)."""

    def __init__(self, geometry: ClusterGeometry, rank: int, master: str, metadata: str, timeout_s: float,
                 segment_bytes: int = 0) -> None:
        self.geometry = geometry
        self.rank = rank
        self.namespace = geometry.namespace(rank)
        self.client = ClusterClient(master, metadata, timeout_s, setting=MASTER_SETTING,
                                    segment_bytes=segment_bytes, probe_every=PROBE_EVERY_JOBS)
        self.pages = ClusterPages(self.client, self.namespace, geometry.page_bytes)
        self._staging: tuple[str, mmap.mmap, np.ndarray] | None = None
        self.counters = {"cluster_puts_skipped": 0, "cluster_chunks_filled": 0, "cluster_reattaches": 0}

    def job(self) -> None:
        """Once per job: while this worker's puts are off, poll its probe (counted in jobs)."""
        if self.client.down is not None and self.client.probe_ok():
            self.client.reattach()
            self.counters["cluster_reattaches"] += 1

    def put(self, keys: Sequence[int], rows: np.ndarray, pages_of: Callable[[np.ndarray], np.ndarray],
            replace: Sequence[int] = ()) -> int:
        """Puts this worker's shard of the chunks in ``rows`` (``rows[i]`` holds ``keys[i]``) the cluster
        lacks, or whose stored record failed a check (``replace``); returns the records put."""
        if not len(keys):
            return 0
        if self.client.down is not None:
            self.counters["cluster_puts_skipped"] += len(keys)
            return 0
        self.pages._replace.update(int(k) for k in replace)
        return self.pages.put([int(k) for k in keys], pages_of(np.asarray(rows, dtype=np.int64)))

    def read(self, staging_path: str, fill: ClusterFill) -> np.ndarray:
        """This worker's checked shard of a staged chunk. The scheduler checked every record before
        it answered HIT and holds the slot until the load completed, so a failure here is memory
        changing under a reader: raised, never served."""
        g = self.geometry
        if self._staging is None or self._staging[0] != staging_path:
            self._close_staging()
            try:
                fd = os.open(staging_path, os.O_RDONLY)
            except OSError as err:
                raise InvalidArgumentError(f"{MASTER_SETTING}: this worker cannot map the scheduler's cluster "
                                           f"staging {staging_path} ({err.strerror}): the scheduler and the "
                                           "workers must run on one machine") from err
            try:
                mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            view = np.frombuffer(mapped, dtype=np.uint8).reshape(-1, g.world, g.record_bytes)
            self._staging = (staging_path, mapped, view)
        record = self._staging[2][fill.slot, self.rank]
        reason = _cpkv.l3_check_packed(record, self.namespace, [fill.key], [SEQUENCE], g.page_bytes)[0]
        if reason is not None:
            raise InvalidArgumentError(f"cluster record of key {fill.key:#x} in staging slot {fill.slot} failed its "
                                       f"check on worker {self.rank} after the scheduler's check passed: {reason}")
        self.counters["cluster_chunks_filled"] += 1
        return record[:g.page_bytes]

    def _close_staging(self) -> None:
        if self._staging is not None:
            _, mapped, _ = self._staging
            self._staging = None
            with contextlib.suppress(BufferError):  # a view still held elsewhere: the mapping goes with it
                mapped.close()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out.update(self.pages.counters)
        out.update({"cluster_available": int(self.client.down is None), "cluster_faults": self.client.faults})
        return out

    def close(self) -> None:
        self._close_staging()
        self.client.close()
