"""The L3 tier under a :class:`~cpkv.tier.CacheController`: spills from the host slab, lookups
and reads for the pages a request misses in device and slab.

Every decision is replicated: which pages leave the slab (``TierCache.take_spills``), where they
go (the store's index), which pages a request finds (``lookup_run``), and which records failed
their check (agreed by one MIN all-reduce of three outcomes, :meth:`L3Tier.settle`: failed, not
written yet, served). The I/O is split by rank: a
spilled page is written by its writer rank (``L3Index.writer``), a page found for a request is
read by the rank that owns its device page (logical page ``p`` is rank ``p % cp``'s), so each is
written and read once per node.

An L3 page is one slab row of every payload and layer: per payload (in the controller's order),
its ``num_layers`` rows of ``row_bytes`` one after another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from cpkv.errors import InvalidArgumentError
from cpkv.tier.l3 import keys
from cpkv.tier.l3.direct import aligned_empty, errno_name
from cpkv.tier.l3.directory import check_l3_pair
from cpkv.tier.l3.order import NOT_WRITTEN
from cpkv.tier.l3.store import L3Namespace, L3Store

PEER_REFUSED = "--l3-dir: another rank of this node could not open the L3 store (its error says why)"
# A hit's outcome on one rank, ordered so that one MIN over the ranks gives the node's: a record that
# failed its check on its reader (dropped everywhere), one its writer had not written yet (a miss this
# time, kept), one served (or not this rank's to read).
FAILED, NOT_YET, SERVED = 0, 1, 2


@dataclass(frozen=True)
class L3Found:
    """Pages of one request found in L3: ``keys[i]`` at ``(slots[i], sequences[i])``."""

    keys: list[int]
    slots: list[int]
    sequences: list[int]

    def __len__(self) -> int:
        return len(self.keys)


def page_layout(payloads: Mapping[str, Any], num_layers: int) -> dict[str, int]:
    """Byte offset of each payload's first layer row within an L3 page (payloads in order)."""
    offsets, at = {}, 0
    for name, spec in payloads.items():
        offsets[name] = at
        at += num_layers * spec.row_bytes
    offsets[""] = at  # the page's size
    return offsets


def page_namespace(payloads: Mapping[str, Any], num_layers: int, *, page_size: int, cp_size: int,
                   model: str) -> L3Namespace:
    """What a page laid out by :func:`page_layout` must share with its reader to be served (the L3
    tier's and the cluster tier's)."""
    described = ",".join(f"{name}:{'x'.join(map(str, spec.page_shape))}:{spec.dtype}" for name, spec in payloads.items())
    return L3Namespace(model=model, dtype=described, kv_layout=f"slab row: payload-major, {num_layers} layers",
                       page_size=page_size, cp_size=cp_size, tp_size=1,
                       page_bytes=page_layout(payloads, num_layers)[""])


def gather_pages(slab: Any, offsets: Mapping[str, int], num_layers: int, rows: np.ndarray, out: np.ndarray) -> None:
    """Pages of slab ``rows`` laid out by :func:`page_layout` into the first ``offsets[""]`` bytes of
    each row of ``out`` (uint8 ``[len(rows), >= page bytes]``)."""
    for name, at in offsets.items():
        if not name:
            continue
        region = slab.rows(name)  # uint8 [layers, pages, row_bytes], shared
        region = region.numpy() if hasattr(region, "numpy") else np.asarray(region)
        layers = out[:, at:at + num_layers * region.shape[2]].reshape(len(rows), num_layers, -1)
        layers[:] = region[:, rows, :].transpose(1, 0, 2)


class L3Tier:
    """One rank's L3 under a controller; open is collective (every rank of the node, then a
    barrier: recovery reads every rank's log before any rank writes)."""

    def __init__(self, directory: str | os.PathLike, cap_bytes: int, *, slab: Any, payloads: Mapping[str, Any],
                 num_layers: int, page_size: int, rank: int, cp_size: int, model: str,
                 all_reduce_min: Any) -> None:
        self._slab = slab
        self.payloads = dict(payloads)
        self.num_layers = num_layers
        self.offsets = page_layout(self.payloads, num_layers)
        self.page_bytes = self.offsets[""]
        self.rank, self.cp_size = rank, cp_size
        self._all_reduce_min = all_reduce_min  # (values, what) -> values, bounded by the collective timeout
        namespace = page_namespace(self.payloads, num_layers, page_size=page_size, cp_size=cp_size, model=model)
        self.counters = {"l3_pages_spilled": 0, "l3_hit_pages": 0, "l3_lookups": 0, "l3_read_failures": 0,
                         "l3_not_written_misses": 0}
        self._unsettled: list[tuple[int, int]] = []  # (key, outcome on this rank) of this forward's hits, in order
        self.io_error: str | None = None  # this rank's first L3 I/O error, until every rank has heard of it
        self.stopped: str | None = None  # why the tier stopped taking pages (the same on every rank)
        # Every rank recovered before any writes; a refusal on one rank is the same refusal on every rank.
        opened: L3Store | None = None
        refusal = ""
        try:
            opened = L3Store(directory, cap_bytes, namespace, rank=rank, ranks_on_node=cp_size,
                             cap_setting="--l3-bytes")
        except InvalidArgumentError as err:
            refusal = str(err)
        except OSError as err:
            refusal = f"--l3-dir {os.fspath(directory)}: cannot open the L3 store: {errno_name(err)} ({err.strerror})"
        try:
            (all_opened,) = self._all_reduce_min([0 if refusal else 1], "L3 open")
        except BaseException:
            if opened is not None:
                opened.close()
            raise
        if refusal or not all_opened:
            if opened is not None:
                opened.close()
            raise InvalidArgumentError(refusal or PEER_REFUSED)
        assert opened is not None
        self.store = opened

    # -- spills (host slab -> L3) -------------------------------------------------------------

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """uint8 ``[len(rows), page_bytes]``: the L3 pages of slab ``rows``, gathered once into
        page-aligned memory (the store writes each page from there, :func:`aligned_empty`)."""
        out = aligned_empty(len(rows), self.page_bytes)
        gather_pages(self._slab, self.offsets, self.num_layers, rows, out)
        return out

    def spill(self, spilled: Sequence[tuple[np.ndarray, np.ndarray]]) -> int:
        """Places the pages host eviction released (replicated) and writes this rank's share from the
        slab rows, before the rows are written again. Returns the pages placed."""
        keys: list[int] = []
        rows: list[int] = []
        seen: set[int] = set()
        for object_keys, object_rows in spilled:
            for key, row in zip(object_keys.tolist(), object_rows.tolist()):
                if key not in seen:  # one object's pages may also be another's (a path backed up twice)
                    seen.add(key)
                    keys.append(key)
                    rows.append(row)
        if not keys or self.stopped is not None:
            return 0
        index, placed = self.store.index, 0
        batch = max(1, self.store.slots)
        for start in range(0, len(keys), batch):
            part_keys, part_rows = keys[start:start + batch], rows[start:start + batch]
            if self.io_error is not None:  # placed as on every rank, written nowhere: counted misses
                placed += len(self.store.put([(key, None) for key in part_keys], durable=False))
                continue
            mine = [i for i, key in enumerate(part_keys)
                    if index.peek(key) is None and index.writer(key) == self.rank]
            data = self.gather(np.asarray([part_rows[i] for i in mine], dtype=np.int64)) if mine else None
            blank = np.zeros(self.page_bytes, dtype=np.uint8)  # other ranks' pages: sizes only, never written here
            pages: list[tuple[int, Any]] = [(key, blank) for key in part_keys]
            for j, i in enumerate(mine):
                pages[i] = (part_keys[i], data[j])  # type: ignore[index]
            try:
                placed += len(self.store.put(pages, durable=False))
            except OSError as err:  # the index placed them before the write failed (replicated)
                placed += len(part_keys)
                self._failed(err, "write")
        self.counters["l3_pages_spilled"] += placed
        return placed

    def flush(self) -> None:
        """This rank's spills acknowledged durable (records synced, then their log entries)."""
        if self.stopped is not None or self.io_error is not None:
            return
        try:
            self.store.flush()
        except OSError as err:
            self._failed(err, "sync")

    # -- an I/O error: the same outcome on every rank ---------------------------------------------

    def _failed(self, err: OSError, what: str) -> None:
        """This rank's L3 I/O failed: from here it places what every rank places and writes nothing,
        until the next commit point tells every rank (:meth:`healthy`, :meth:`stop`)."""
        if self.io_error is None:
            self.io_error = f"rank {self.rank}'s L3 {what} failed: {errno_name(err)} ({err.strerror})"

    def healthy(self) -> int:
        """1 while this rank's L3 I/O has not failed: the commit point's MIN all-reduce carries it."""
        return 0 if self.io_error is not None else 1

    def stop(self, reason: str) -> None:
        """Every rank, at the same commit point: the tier takes no more pages (its index stays as every
        rank holds it, so pages already in L3 are still found and read)."""
        if self.stopped is None:
            self.stopped = self.io_error or reason

    # -- reads (L3 -> a request's device pages) -------------------------------------------------

    def lookup_run(self, keys: Sequence[int]) -> L3Found:
        """The leading pages of ``keys`` found in L3, up to the first miss (replicated: a use)."""
        found = L3Found([], [], [])
        for key in keys:
            self.counters["l3_lookups"] += 1
            hit = self.store.lookup(int(key))
            if hit is None:
                break
            found.keys.append(int(key))
            found.slots.append(hit[0])
            found.sequences.append(hit[1])
        return found

    def read(self, found: L3Found, device_pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reads the found pages whose device page this rank owns. Returns (their positions in
        ``found`` that read back whole, uint8 ``[n, page_bytes]`` of those pages); a failed record is
        left out here and dropped on every rank at :meth:`settle`, one not written yet left out and kept."""
        owned = [i for i, page in enumerate(device_pages[:len(found)].tolist()) if page % self.cp_size == self.rank]
        out = aligned_empty(len(owned), self.page_bytes)  # read in place where the page is whole blocks
        reasons = self.store.read_many([(found.keys[i], found.slots[i], found.sequences[i]) for i in owned], out) \
            if owned else []
        ok = [j for j, reason in enumerate(reasons) if reason is None]
        failed = {found.keys[owned[j]]: reason for j, reason in enumerate(reasons) if reason is not None}
        self._unsettled.extend((key, SERVED if key not in failed else NOT_YET if failed[key] == NOT_WRITTEN
                                else FAILED) for key in found.keys)
        self.counters["l3_read_failures"] += sum(reason != NOT_WRITTEN for reason in failed.values())
        return np.asarray([owned[j] for j in ok], dtype=np.int64), out[ok]

    def settle(self) -> int:
        """C (only on a forward with L3 hits, on every rank alike): one MIN all-reduce of the hits'
        outcomes; a record that failed on its reader is dropped from every rank's index, one not
        written yet is a miss on every rank and stays. Returns the pages served."""
        if not self._unsettled:
            return 0
        outcomes = self._all_reduce_min([outcome for _, outcome in self._unsettled], "L3 read check")
        keys = [key for key, _ in self._unsettled]
        self._unsettled = []
        for key, outcome in zip(keys, outcomes):
            if outcome == FAILED:
                self.store.drop(key, "failed its check on its reader")
        served = sum(1 for outcome in outcomes if outcome == SERVED)
        self.counters["l3_hit_pages"] += served
        self.counters["l3_not_written_misses"] += sum(1 for outcome in outcomes if outcome == NOT_YET)
        return served

    # -- agreement, stats, close ----------------------------------------------------------------

    def digest(self) -> int:
        return self.store.digest()

    def stats(self) -> dict[str, Any]:
        s = self.store.stats()
        out: dict[str, Any] = dict(self.counters)
        out.update({"l3_pages_written": s["pages_written"], "l3_pages_read": s["pages_read"],
                    "l3_pages_written_in_place": s["pages_written_in_place"],
                    "l3_pages_read_in_place": s["pages_read_in_place"],
                    "l3_corrupt_dropped": s["corrupt_dropped"], "l3_pages_superseded": s["pages_superseded"],
                    "l3_recovery_s": s["recovery_s"],
                    "l3_recovered_pages": s["recovered_pages"], "l3_disk_bytes": s["disk_bytes"],
                    "l3_cap_bytes": s["cap_bytes"], "l3_slots": s["slots"], "l3_mode": s["mode"],
                    "l3_digest": self.digest(), "l3_stopped": self.stopped})
        return out

    def close(self) -> None:
        try:
            self.store.close()
        except OSError as err:  # the descriptors are closed; what was not synced is not acknowledged
            self._failed(err, "sync at close")


def combined_digest(tier_digest: int, l3_digest: int) -> int:
    """One 64-bit value for the agreement check over the two tiers' digests and the L3 index's."""
    return keys.combined_digest(tier_digest, l3_digest)


def check_l3_options(directory: Any, cap_bytes: Any) -> None:
    """``--l3-dir`` and ``--l3-bytes`` by the one L3 setting rule (:func:`~.directory.check_l3_pair`)."""
    check_l3_pair(directory, cap_bytes, "--l3-dir", "--l3-bytes")