"""The node's L3 read-staging area: the node's ranks read an L3 record from disk once, not once each.

Where every rank of a node needs the same record (the SGLang backend: SGLang holds the KV replicated
on every rank of a store group, and every rank prefetches the same hits, each at its own time), the
first rank that needs a record claims its entry in a small shared-memory area of the node, reads and
checks the record from disk into its own memory, and publishes it there; the others copy it from
shared memory. Nothing here changes a replicated decision (which pages L3 holds, where): it only
saves disk reads, so it can serve ranks whose calls are not synchronized at all.

- **The area**: a :class:`~cpkv.tier.slab.HostSlab` the node's ranks create together when L3 opens
  (so it leaves nothing in /dev/shm after any exit), ``entries`` entries of one record each
  (``page_bytes + L3_HEADER_BYTES``: payload and header) and two 64-bit words per entry. Record (slot, sequence) goes to
  entry ``slot % entries``. Memory: ``entries * (page_bytes + L3_HEADER_BYTES + 16)`` bytes per node.
- **The protocol** (native, ``cpkv._cpkv.L3Staging``, every atomic and copy there): a state word per
  entry names (sequence, version, state: empty / reading / ready / failed) and changes only by
  compare-and-swap. A rank that finds its record ready copies it, re-checks the word (a claim in
  between: the copy is not used, counted ``l3_staging_reused``, the rank reads the record itself) and
  checks the copy as a disk read is checked (CRC32C over header and payload); one it finds failed is
  the same counted miss on every rank, read once; one being read by another rank is waited for; one
  whose entry is being read for another record is read by this rank itself (``l3_staging_busy``).
- **A claimant that dies or stalls**: a waiter whose entry's word has not moved for ``wait_s`` takes
  the claim over (compare-and-swap on the very word it watched, ``l3_staging_takeovers``), reads the
  record from disk and publishes it; the ranks after it are served from the area. So a rank killed
  mid-read costs the others one ``wait_s`` (the backend's ``cpkv_timeout_s``), never a hang, and every
  answer is still the record's bytes or a counted miss. A claimant whose own disk read raises gives
  its claims up (the entries go back to empty) before the error propagates.
- **A record not written yet** (its writer rank is behind the reader: the store's
  :data:`~cpkv.tier.l3.order.NOT_WRITTEN`) is a transient miss: the claimant gives its claim up
  instead of publishing a failure, so the next rank that needs the record (this one included) reads
  it again, and it is served once its writer has written it (``l3_not_written``).
- **Sequences**: a state word names sequences below 2**44; a record past that is read by every rank
  (``l3_staging_bypassed``), as without the area.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from cpkv._cpkv import L3_HEADER_BYTES, L3Staging
from cpkv.errors import InvalidArgumentError
from cpkv.tier.l3.order import NOT_WRITTEN
from cpkv.tier.l3.store import L3Store

__all__ = ["L3ReadStaging", "default_entries", "DEFAULT_STAGING_BYTES"]

# The default area holds this many bytes of records per node (at least MIN_DEFAULT_ENTRIES entries,
# at most the store's slots).
DEFAULT_STAGING_BYTES = 256 << 20
MIN_DEFAULT_ENTRIES = 64


def default_entries(page_bytes: int, slots: int) -> int:
    """Entries of the default area: ``DEFAULT_STAGING_BYTES`` of records, at least 64, at most the
    store's slots (more would never be used: a slot has one entry)."""
    per_entry = page_bytes + L3_HEADER_BYTES
    return max(1, min(slots, L3Staging.MAX_ENTRIES, max(MIN_DEFAULT_ENTRIES, DEFAULT_STAGING_BYTES // per_entry)))


class L3ReadStaging:
    """One rank's handle on its node's read-staging area over ``store`` (collective: every rank of
    ``process_group``, the node's ranks, constructs it with the same ``entries``).

    ``lock`` is the lock the caller holds around every other use of ``store`` (its read scratch is
    one buffer); :meth:`read` takes it around its disk reads only, never while it waits."""

    def __init__(self, store: L3Store, entries: int, *, lock: threading.Lock, process_group: Any,
                 wait_s: float, timeout_s: float) -> None:
        import torch

        from cpkv.tier.slab import HostSlab, SlabSpec

        if isinstance(entries, bool) or not isinstance(entries, int) or not 1 <= entries <= L3Staging.MAX_ENTRIES:
            raise InvalidArgumentError(f"L3 staging entries must be an int in [1, {L3Staging.MAX_ENTRIES}], "
                                       f"got {entries!r}")
        self.entries = min(entries, store.slots)  # a slot has one entry: more are never used
        self.store, self.lock, self.wait_s = store, lock, float(wait_s)
        self.page_bytes = store.page_bytes
        entry_bytes = store.page_bytes + L3_HEADER_BYTES
        self.slab = HostSlab.create({"record": SlabSpec((entry_bytes,), torch.uint8),
                                     "word": SlabSpec((2,), torch.int64)},
                                    num_pages=self.entries, num_layers=1, process_group=process_group,
                                    timeout_s=timeout_s, pin=False)
        self.native = L3Staging(self.slab.rows("record")[0], self.slab.view("word")[0], store.page_bytes,
                                store.namespace_id)
        self.counters = {"l3_disk_reads": 0, "l3_disk_read_failures": 0, "l3_not_written": 0, "l3_staging_hits": 0,
                         "l3_staging_failures_seen": 0, "l3_staging_claims": 0, "l3_staging_waits": 0,
                         "l3_staging_takeovers": 0, "l3_staging_lost_claims": 0, "l3_staging_busy": 0,
                         "l3_staging_reused": 0, "l3_staging_torn": 0, "l3_staging_bypassed": 0}
        self.counters_lock = threading.Lock()
        # Test hook: runs after this rank claimed entries and before it reads them (a claimant killed
        # mid-read).
        self.after_claim: Callable[[], None] | None = None

    @property
    def nbytes(self) -> int:
        return self.slab.nbytes

    @property
    def run_id(self) -> str:
        """Part of every /dev/shm name the area ever had (``cpkv-slab-<run_id>-p<i>``)."""
        return self.slab.run_id

    def _count(self, **deltas: int) -> None:
        with self.counters_lock:
            for name, delta in deltas.items():
                self.counters[name] += delta

    def read(self, found: Sequence[tuple[int, int, int]], out: np.ndarray) -> list[str | None]:
        """Pages ``(key, slot, sequence)`` (from the L3 index) into ``out[i]`` (uint8 ``[n, page_bytes]``),
        from the staging area or, once per node, from disk; per page None when served, else the reason
        its record failed its check (the same on every rank), or :data:`~cpkv.tier.l3.order.NOT_WRITTEN`
        where its writer had not written it yet (this rank's transient miss, published to no one)."""
        n = len(found)
        if out.shape != (n, self.page_bytes) or out.dtype != np.uint8:
            raise InvalidArgumentError(f"out must be uint8 [{n}, {self.page_bytes}], got {out.dtype} {out.shape}")
        reasons: list[str | None] = [None] * n
        if not n:
            return reasons
        keys, slots, sequences = ([f[j] for f in found] for j in range(3))
        codes, words, why = self.native.take(keys, slots, sequences, out)
        pending = self._settle(list(range(n)), codes, words, why, reasons, out, found)
        if pending:
            at = [i for i, _ in pending]
            sub = np.empty((len(at), self.page_bytes), dtype=np.uint8)
            codes, words, why, taken = self.native.wait([keys[i] for i in at], [slots[i] for i in at],
                                                        [sequences[i] for i in at], [w for _, w in pending], sub,
                                                        self.wait_s)
            self._count(l3_staging_waits=len(at), l3_staging_takeovers=sum(taken))
            served = [j for j, c in enumerate(codes) if c == L3Staging.SERVED]
            if served:
                out[[at[j] for j in served]] = sub[served]
            left = self._settle(at, codes, words, why, reasons, out, found)
            assert not left, "wait returns no record still waiting"
        return reasons

    def _settle(self, at: list[int], codes: Sequence[int], words: Sequence[int], why: Sequence[str | None],
                reasons: list[str | None], out: np.ndarray, found: Sequence[tuple[int, int, int]]) -> list:
        """Books the outcomes of ``take``/``wait`` for pages ``at``, reads what this rank must read from
        disk (publishing its claims); returns the (page, word) pairs still to wait for."""
        claims: dict[int, int] = {}
        private: list[int] = []
        pending = []
        tally = {"l3_staging_hits": 0, "l3_staging_failures_seen": 0, "l3_staging_busy": 0,
                 "l3_staging_reused": 0, "l3_staging_torn": 0, "l3_staging_bypassed": 0}
        fallback = {L3Staging.BUSY: "l3_staging_busy", L3Staging.REUSED: "l3_staging_reused",
                    L3Staging.TORN: "l3_staging_torn", L3Staging.BYPASS: "l3_staging_bypassed"}
        for i, code, word, reason in zip(at, codes, words, why):
            if code == L3Staging.SERVED:
                tally["l3_staging_hits"] += 1
            elif code == L3Staging.FAILED:
                reasons[i] = reason
                tally["l3_staging_failures_seen"] += 1
            elif code == L3Staging.CLAIMED:
                claims[i] = word
            elif code == L3Staging.WAIT:
                pending.append((i, word))
            else:
                tally[fallback[code]] += 1
                private.append(i)
        self._count(**tally)
        if claims and self.after_claim is not None:
            self.after_claim()
        if claims or private:
            self._from_disk(sorted([*claims, *private]), claims, reasons, out, found)
        return pending

    def _from_disk(self, at: list[int], claims: dict[int, int], reasons: list[str | None], out: np.ndarray,
                   found: Sequence[tuple[int, int, int]]) -> None:
        """Reads pages ``at`` from disk into ``out`` and publishes the ones this rank claimed (a record
        not written yet: its claim given up, not published); claims it cannot complete are given up
        before any error propagates."""
        whole = at == list(range(len(found)))
        sub = out if whole else np.empty((len(at), self.page_bytes), dtype=np.uint8)
        try:
            with self.lock:
                got = self.store.read_many([found[i] for i in at], sub, keep_records=True)
                published: list[bool] = []
                unwritten = [i for j, i in enumerate(at) if i in claims and got[j] == NOT_WRITTEN]
                if unwritten:
                    self.native.abandon([found[i][1] for i in unwritten], [claims[i] for i in unwritten])
                mine = [j for j, i in enumerate(at) if i in claims and got[j] != NOT_WRITTEN]
                if mine:
                    records, rows = self.store.last_records
                    published = self.native.publish(
                        [found[at[j]][1] for j in mine], [claims[at[j]] for j in mine], records,
                        [rows[j] * self.store.slot_bytes for j in mine], [got[j] for j in mine])
        except BaseException:
            if claims:
                self.native.abandon([found[i][1] for i in claims], list(claims.values()))
            raise
        if not whole:
            out[at] = sub
        for j, i in enumerate(at):
            reasons[i] = got[j]
        unwritten_reads = sum(r == NOT_WRITTEN for r in got)
        self._count(l3_disk_reads=len(at), l3_not_written=unwritten_reads,
                    l3_disk_read_failures=sum(r is not None for r in got) - unwritten_reads,
                    l3_staging_claims=len(claims), l3_staging_lost_claims=sum(not p for p in published))

    def stats(self) -> dict[str, Any]:
        with self.counters_lock:
            out: dict[str, Any] = dict(self.counters)
        out.update({"l3_staging_entries": self.entries, "l3_staging_bytes": self.nbytes,
                    "l3_staging_run_id": self.run_id})
        return out

    def close(self) -> None:
        self.native.close()  # waits for any call in flight; the area may be unmapped after it
        self.slab.close()
