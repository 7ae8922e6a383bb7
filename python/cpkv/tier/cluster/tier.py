"""The cluster tier under a :class:`~cpkv.tier.CacheController`: pages every instance shares through
Mooncake Store, below the node's L3 (or below the slab when L3 is off).

**What is stored.** A page (laid out as an L3 page, :func:`~cpkv.tier.l3.tier.page_layout`) as a
packed L3 record: the payload, then the 64-byte trailer naming namespace, key, sequence (always 0: a
key names one content), length and CRC32C (:func:`cpkv._cpkv.l3_seal_packed`), under the object key
``cpkv/<namespace id>/<content key>``, both in hex. The namespace covers the model, every payload's
shape and dtype, the layout, page size and CP geometry, so a changed dtype or page size is a miss.

**Reads.** :meth:`ClusterTier.find` (C): every rank asks ``batch_is_exist`` about the same keys and
one MIN all-reduce agrees how many leading pages of each request the cluster holds (a rank's answer
may be newer than a peer's: the MIN is what every rank uses). :meth:`ClusterTier.read`: the rank that
owns a page's device page reads it with ``batch_get_into`` into its registered staging rows, which
nothing else sees, and checks the record (CRC, key, namespace, length) before copying a byte out.
:meth:`ClusterTier.settle` (C): one MIN all-reduce of which pages read back whole; a failed record is
a counted miss on every rank, and its key is written again with ``upsert`` by its next writer
(Mooncake's ``put`` of an existing key keeps the old value).

**Writes.** One copy per cluster: a page leaving the slab (host eviction, or every cached page at a
clean stop) is put by its node writer rank (the L3 rule, :meth:`cpkv._cpkv.L3Index.writer`) once,
after ``batch_is_exist`` says the cluster lacks it, from registered staging rows with
``batch_put_from``. Pages are put on eviction, not on backup (measured: README, "The cluster tier").

**Faults.** Every call is bounded by the timeout (:class:`~cpkv.tier.cluster.mooncake.BoundedStore`).
A call that fails with a store fault or does not answer makes this rank unhealthy; the next
collective (``find`` or ``settle``) carries that as a MIN, so every rank marks the tier unavailable
at the same point and serves nothing from it from then on: misses only, never a page read on one
rank and missed on another. While unavailable a rank probes the store
(:class:`~cpkv.tier.cluster.probe.StoreProbe`: an upsert and a get of one small object, started at
most every ``probe_every`` of the tier's agreed decision points, its ``find`` and ``settle`` calls:
counted in the replicated call sequence, never timed, so no wall-clock value enters the decision)
and the tier is available again on every rank at the first ``find`` or ``settle`` where every rank's
last probe succeeded (the MIN vote). A restarted master is cold: Mooncake keeps no objects across it,
and nothing is assumed present: every page is found and checked again.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from cpkv import _cpkv
from cpkv.errors import ClusterUnavailableError, InvalidArgumentError
from cpkv.tier.cluster.mooncake import BoundedStore, is_fault
from cpkv.tier.cluster.probe import StoreProbe
from cpkv.tier.l3.tier import L3Found, gather_pages, page_layout, page_namespace

TRAILER = _cpkv.L3_HEADER_BYTES
# A key names one content: its record carries no placement sequence.
SEQUENCE = 0
# Pages per store call (and rows of each staging buffer).
DEFAULT_BATCH = 128
# While unavailable: a probe starts at most every this many agreed decision points (find / settle).
PROBE_EVERY = 8


def object_key(namespace_id: int, key: int) -> str:
    return f"cpkv/{namespace_id:016x}/{key:016x}"


def check_cluster_options(master: Any, metadata: Any, cluster_bytes: Any = None, *,
                          name: Callable[[str], str] = lambda option: option) -> None:
    """``--cluster-master HOST:PORT`` and ``--cluster-metadata URL``: both or neither, well formed;
    ``--cluster-bytes`` only with them, a size >= 0. ``name``: how the caller spells an option in
    its errors (an engine's config key)."""
    m, d, b = name("--cluster-master"), name("--cluster-metadata"), name("--cluster-bytes")
    if (master is None) != (metadata is None):
        given, missing = (m, d) if master is not None else (d, m)
        raise InvalidArgumentError(f"{given} needs {missing} too")
    if master is None:
        if cluster_bytes is not None:
            raise InvalidArgumentError(f"{b} needs {m} and {d}")
        return
    host, _, port = str(master).rpartition(":")
    if not isinstance(master, str) or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidArgumentError(f"{m} {master!r} is not HOST:PORT")
    if not isinstance(metadata, str) or not metadata.startswith(("http://", "https://")):
        raise InvalidArgumentError(f"{d} {metadata!r} is not an http:// URL (the master's HTTP "
                                   "metadata server, e.g. http://127.0.0.1:8080/metadata)")
    if cluster_bytes is not None and (isinstance(cluster_bytes, bool) or not isinstance(cluster_bytes, int)
                                      or cluster_bytes < 0):
        raise InvalidArgumentError(f"{b} must be a number of bytes >= 0, got {cluster_bytes!r}")


StoreCall = Callable[[Callable[[BoundedStore], list[int]]], "list[int] | None"]


def get_checked(call: StoreCall, namespace_id: int, rows: np.ndarray, page_bytes: int,
                keys: Sequence[int]) -> list[tuple[int, str | None]] | None:
    """One ``batch_get_into`` of ``keys``' records into the first ``len(keys)`` registered staging
    ``rows`` (nothing else sees them), each checked (CRC, key, namespace, length): per key (the
    store's code: the bytes read or a negative code, the check's failure or None); None when the
    call failed (``call`` runs one store call: None on a failure)."""
    n, record_bytes = len(keys), page_bytes + TRAILER
    codes = call(partial(BoundedStore.get_into, keys=[object_key(namespace_id, key) for key in keys],
                         addresses=[rows.ctypes.data + j * record_bytes for j in range(n)], sizes=[record_bytes] * n))
    if codes is None:
        return None
    reasons = _cpkv.l3_check_packed(rows[:n].reshape(-1), namespace_id, list(keys), [SEQUENCE] * n, page_bytes)
    return list(zip(codes, reasons))


def put_missing(call: StoreCall, namespace_id: int, rows: np.ndarray, page_bytes: int, keys: Sequence[int],
                replace: set[int], fill: Callable[[np.ndarray], None]) -> int:
    """Puts up to ``len(rows)`` pages from the registered staging ``rows``: ``fill(rows)`` writes their
    payloads into the first ``page_bytes`` of each row; only the pages the cluster lacks
    (``batch_is_exist``), or whose stored record failed a check (in ``replace``: ``upsert``, and
    taken out of it once written), are sealed and sent. Returns the pages put."""
    n, record_bytes = len(keys), page_bytes + TRAILER
    codes = call(partial(BoundedStore.exist, keys=[object_key(namespace_id, key) for key in keys]))
    if codes is None:
        return 0
    wanted = [j for j, code in enumerate(codes) if code != 1 or keys[j] in replace]
    if not wanted:
        return 0
    fill(rows[:n])
    if len(wanted) < n:  # keep the rows to send back to back (one seal call, one put)
        rows[:len(wanted)] = rows[np.asarray(wanted, dtype=np.int64)]
    chosen = [keys[j] for j in wanted]
    _cpkv.l3_seal_packed(rows[:len(wanted)].reshape(-1), namespace_id, chosen, [SEQUENCE] * len(wanted), page_bytes)
    put = 0
    for upsert in (False, True):
        at = [j for j, key in enumerate(chosen) if (key in replace) == upsert]
        if not at:
            continue
        result = call(partial(BoundedStore.put_from, keys=[object_key(namespace_id, chosen[j]) for j in at],
                              addresses=[rows.ctypes.data + j * record_bytes for j in at],
                              sizes=[record_bytes] * len(at), replace=upsert))
        if result is None:
            break
        put += sum(1 for code in result if code == 0)
        if upsert:
            replace.difference_update(chosen[j] for j, code in zip(at, result) if code == 0)
    return put


def connect(master: str, metadata: str, timeout_s: float, segment_bytes: int = 0) -> BoundedStore:
    """A client of the master; a master that does not answer is one error naming the setting."""
    try:
        return BoundedStore(master, metadata, timeout_s, segment_bytes=segment_bytes)
    except ClusterUnavailableError as err:
        if str(err).startswith("--cluster-"):
            raise
        raise ClusterUnavailableError(f"--cluster-master {master}: {' '.join(str(err).split())}") from err


def check_master(master: str, metadata: Any, timeout_s: float) -> None:
    """Before any rank starts: a master that does not answer is one error naming the setting."""
    connect(master, str(metadata), timeout_s).close()


class ClusterTier:
    """One rank's cluster tier; open is collective (every rank connects, then one MIN agrees)."""

    def __init__(self, master: str, metadata: str, *, slab: Any, payloads: Mapping[str, Any], num_layers: int,
                 page_size: int, rank: int, cp_size: int, model: str, timeout_s: float,
                 all_reduce_min: Callable[[list[int], str], list[int]], segment_bytes: int = 0,
                 batch: int = DEFAULT_BATCH, probe_every: int = PROBE_EVERY) -> None:
        check_cluster_options(master, metadata)
        if isinstance(probe_every, bool) or not isinstance(probe_every, int) or probe_every < 1:
            raise InvalidArgumentError(f"probe_every must be an int >= 1, got {probe_every!r}")
        self._slab = slab
        self.num_layers = num_layers
        self.offsets = page_layout(payloads, num_layers)
        self.page_bytes = self.offsets[""]
        self.record_bytes = self.page_bytes + TRAILER
        self.rank, self.cp_size = rank, cp_size
        self.namespace_id = page_namespace(payloads, num_layers, page_size=page_size, cp_size=cp_size,
                                           model=model).id()
        self._writers = _cpkv.L3Index(1, cp_size)  # the L3 rule: which rank of a node writes a key
        self._all_reduce_min = all_reduce_min
        self.batch = batch
        self.probe_every = probe_every
        self.counters = {"cluster_pages_put": 0, "cluster_pages_read": 0, "cluster_hit_pages": 0,
                         "cluster_corrupt_dropped": 0, "cluster_lookups": 0, "cluster_faults": 0,
                         "cluster_unavailable_marks": 0, "cluster_reattaches": 0, "cluster_puts_skipped": 0}
        self.unavailable_s = 0.0
        self.unavailable_since: float | None = None
        self.marked_unavailable_at: list[float] = []  # wall-clock times (time.time()) the tier went unavailable
        self._healthy = 1
        self._probe: StoreProbe | None = None  # while unavailable: whether the store answers again
        self._replace: set[int] = set()  # keys whose stored record failed its check: written again by upsert
        self._unsettled: list[tuple[int, int]] = []  # (key, this rank's ok) of the found pages, in order
        self._corrupt_here: set[int] = set()  # keys this rank read whose record failed its check
        self.store: BoundedStore | None = None
        opened, failure = 1, None
        try:
            self.store = connect(master, metadata, timeout_s, segment_bytes)
            # Registered once: the staging rows the store reads into and writes from.
            self._read_rows = np.zeros((batch, self.record_bytes), dtype=np.uint8)
            self._write_rows = np.zeros((batch, self.record_bytes), dtype=np.uint8)
            for buffer in (self._read_rows, self._write_rows):
                self.store.register(buffer.ctypes.data, buffer.nbytes)
            self._probe = StoreProbe(self.store, every=probe_every)
        except ClusterUnavailableError as err:
            opened, failure = 0, err
        if self._all_reduce_min([opened], "cluster tier open")[0] == 0:
            self.close()
            if failure is not None:
                raise failure
            raise ClusterUnavailableError(f"--cluster-master {master}: another rank could not reach the Mooncake "
                                          "master")

    @property
    def available(self) -> bool:
        return self.unavailable_since is None

    # -- health (local; agreed at find/settle) --------------------------------------------------

    def _fault(self) -> None:
        if self._healthy:
            self.counters["cluster_faults"] += 1
        self._healthy = 0

    def _call(self, job: Callable[[BoundedStore], list[int]]) -> list[int] | None:
        """One store call; None (and this rank unhealthy) when it failed or did not answer."""
        if self.store is None or not self._healthy:
            return None
        try:
            codes = job(self.store)
        except ClusterUnavailableError:
            self._fault()
            return None
        if any(is_fault(code) for code in codes):
            self._fault()
        return codes

    def _probe_ok(self) -> bool:
        """While unavailable: whether this rank's last probe succeeded (:class:`StoreProbe`: run in the
        background, so a store that does not answer costs no forward any time)."""
        return self.store is not None and self._probe is not None and self._probe.poll()

    def _agree(self, values: list[int], what: str) -> list[int]:
        """C: MIN of [this rank healthy] + ``values``; marks the tier unavailable (or available again)
        on every rank at this same point. Returns the reduced ``values`` (zeros while unavailable)."""
        healthy = self._healthy if self.available else int(self._probe_ok())
        reduced = self._all_reduce_min([healthy, *values], what)
        now = time.monotonic()
        if self.available and reduced[0] == 0:
            self.unavailable_since = now
            self.marked_unavailable_at.append(time.time())
            self.counters["cluster_unavailable_marks"] += 1
            if self._probe is not None:
                self._probe.reset()
        elif not self.available and reduced[0] == 1:
            assert self.unavailable_since is not None
            self.unavailable_s += now - self.unavailable_since
            self.unavailable_since = None
            self._healthy = 1
            self.counters["cluster_reattaches"] += 1
            if self._probe is not None:
                self._probe.reset()
        if not self.available:
            return [0] * len(values)
        return reduced[1:]

    # -- reads --------------------------------------------------------------------------------

    def find(self, requests: Sequence[Sequence[int]]) -> list[L3Found]:
        """C (call with the same keys on every rank; skipped alike when no request has any): the
        leading pages of each request's ``keys`` the cluster holds, agreed by every rank."""
        if not any(len(keys) for keys in requests):
            return [L3Found([], [], []) for _ in requests]
        runs = [0] * len(requests)
        if self.available and self._healthy:
            unique = list(dict.fromkeys(int(k) for keys in requests for k in keys))
            present: dict[int, bool] = {}
            for start in range(0, len(unique), self.batch):
                part = unique[start:start + self.batch]
                codes = self._call(partial(BoundedStore.exist, keys=[object_key(self.namespace_id, k) for k in part]))
                if codes is None:
                    break
                present.update((k, code == 1) for k, code in zip(part, codes))
            else:
                for i, keys in enumerate(requests):
                    while runs[i] < len(keys) and present[int(keys[runs[i]])]:
                        runs[i] += 1
        self.counters["cluster_lookups"] += sum(len(keys) for keys in requests)
        agreed = self._agree([runs[i] if self._healthy else 0 for i in range(len(requests))], "cluster lookup")
        return [L3Found([int(k) for k in keys[:n]], [0] * n, [SEQUENCE] * n) for keys, n in zip(requests, agreed)]

    def read(self, found: L3Found, device_pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reads the found pages whose device page this rank owns (logical page ``p`` is rank
        ``p % cp``'s). Returns (their positions in ``found`` that read back whole and checked, uint8
        ``[n, page_bytes]`` of those pages); every other page is settled as a miss."""
        owned = [i for i, page in enumerate(device_pages[:len(found)].tolist()) if page % self.cp_size == self.rank]
        out = np.empty((len(owned), self.page_bytes), dtype=np.uint8)
        good: list[int] = []
        corrupt: set[int] = set()
        rows = self._read_rows
        for start in range(0, len(owned), self.batch):
            part = owned[start:start + self.batch]
            keys = [found.keys[i] for i in part]
            checked = get_checked(self._call, self.namespace_id, rows, self.page_bytes, keys)
            if checked is None:
                break
            self.counters["cluster_pages_read"] += sum(1 for code, _ in checked if code == self.record_bytes)
            whole = [j for j, (code, reason) in enumerate(checked) if code == self.record_bytes and reason is None]
            # One copy out of the staging rows for the batch (every page, as a rule), not one per page.
            at, n = len(good), len(part)
            out[at:at + len(whole)] = rows[:n, :self.page_bytes] if len(whole) == n else rows[whole, :self.page_bytes]
            good.extend(part[j] for j in whole)
            if len(whole) < n:  # an object there that is not the record it must be is corrupt
                read_whole = set(whole)
                corrupt.update(keys[j] for j, (code, _) in enumerate(checked) if code >= 0 and j not in read_whole)
        # This rank's word on each found page: read whole, or not its page (its owner decides).
        served, mine = set(good), set(owned)
        self._unsettled.extend((key, 1 if i in served or i not in mine else 0) for i, key in enumerate(found.keys))
        self._corrupt_here |= corrupt
        return np.asarray(good, dtype=np.int64), out[:len(good)]

    def settle(self) -> int:
        """C (only on a forward that found pages, on every rank alike): one MIN all-reduce of which
        found pages read back whole, with this rank's health. Returns the pages served (0 on every
        rank when some rank's store failed: those pages are misses everywhere)."""
        if not self._unsettled:
            return 0
        keys = [key for key, _ in self._unsettled]
        flags = self._agree([ok for _, ok in self._unsettled], "cluster read check")
        self._unsettled = []
        corrupt_here, self._corrupt_here = self._corrupt_here, set()
        # How many records failed their check, agreed: each rank counts what it read itself (a corrupt
        # record is read by one rank only), summed by the report.
        self.counters["cluster_corrupt_dropped"] += len(corrupt_here)
        self._replace.update(key for key, ok in zip(keys, flags) if not ok and key in corrupt_here)
        served = sum(flags)
        self.counters["cluster_hit_pages"] += served
        return served

    # -- writes -------------------------------------------------------------------------------

    def spill(self, spilled: Sequence[tuple[np.ndarray, np.ndarray]]) -> int:
        """Puts the pages host eviction released (replicated) that this rank writes, from the slab
        rows, before the rows are written again. Not collective. Returns the pages this rank put."""
        keys: list[int] = []
        rows: list[int] = []
        seen: set[int] = set()
        for object_keys, object_rows in spilled:
            for key, row in zip(object_keys.tolist(), object_rows.tolist()):
                if key not in seen and self._writers.writer(key) == self.rank:
                    seen.add(key)
                    keys.append(key)
                    rows.append(row)
        if not keys:
            return 0
        if not self.available or not self._healthy:
            self.counters["cluster_puts_skipped"] += len(keys)
            return 0
        put = 0
        for start in range(0, len(keys), self.batch):
            part_keys, part_rows = keys[start:start + self.batch], rows[start:start + self.batch]
            put += self.put_pages(part_keys, partial(gather_pages, self._slab, self.offsets, self.num_layers,
                                                     np.asarray(part_rows, dtype=np.int64)))
        return put

    def put_pages(self, keys: Sequence[int], fill: Callable[[np.ndarray], None]) -> int:
        """Puts up to ``batch`` pages (:func:`put_missing`); returns the pages put."""
        put = put_missing(self._call, self.namespace_id, self._write_rows, self.page_bytes, keys, self._replace, fill)
        self.counters["cluster_pages_put"] += put
        return put

    # -- stats, close ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        unavailable = self.unavailable_s
        if self.unavailable_since is not None:
            unavailable += time.monotonic() - self.unavailable_since
        out["cluster_unavailable_s"] = unavailable
        out["cluster_marked_unavailable_at"] = list(self.marked_unavailable_at)
        out["cluster_available"] = int(self.available)
        return out

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
