"""Whether Mooncake Store answers again, asked while a cluster tier is unavailable: one home for the
probe of the main job's :class:`~cpkv.tier.cluster.tier.ClusterTier` and both engines' tiers
(:class:`~cpkv.tier.cluster.pages.ClusterClient`).

A probe is a round trip of one small object: an ``upsert`` of fresh bytes under this prober's own key,
then a ``get_into`` that must give the same bytes back (:meth:`BoundedStore.round_trip`). It runs on
the store's worker without waiting (:meth:`BoundedStore.start`), so a store that does not answer costs
the caller no time; a call that is still stuck on the worker (a store that stopped answering) delays
the next probe until it returns.

:meth:`StoreProbe.poll` is called at the caller's decision points (a MIN over the ranks, or one
scheduler's step): it takes the outcome of the probe in flight, if it finished, and says whether the
last finished probe succeeded. A success is kept until it is used (:meth:`StoreProbe.reset`, when the
tier re-attaches or is marked unavailable again): no new probe starts over it, so ranks whose probes
finish at different points still all say yes at one point, and when the tier re-attaches no probe
runs on the worker the tier's calls need. A new probe starts at most every ``every`` polls: the
caller's calls, not the clock, a rate every rank counts alike, so no wall-clock value decides when a
rank probes.
"""

from __future__ import annotations

import os
import uuid
from functools import partial

import numpy as np

from cpkv.tier.cluster.mooncake import BoundedStore

PROBE_BYTES = 64


def probe_key(owner: str = "") -> str:
    """A key no other prober writes (two probers' upserts of one key would fail each other's check)."""
    return f"cpkv/probe/{owner or f'{os.getpid()}-{uuid.uuid4().hex[:12]}'}"


class StoreProbe:
    """One client's probe of the store (see the module docstring). ``store``: the client, whose worker
    runs the probe; the probe's two rows are registered with it here (this may raise
    :class:`~cpkv.errors.ClusterUnavailableError`, as any call)."""

    def __init__(self, store: BoundedStore, key: str | None = None, *, every: int = 1) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self.store = store
        self.key = key if key is not None else probe_key()
        self.every = every
        # Fresh bytes per probe (this prober's nonce, then its probe count): a stale object from an
        # earlier probe never passes the round trip.
        self._nonce = np.frombuffer(uuid.uuid4().bytes[:8], dtype=np.uint8)
        self._rows = np.zeros((2, PROBE_BYTES), dtype=np.uint8)
        store.register(self._rows.ctypes.data, self._rows.nbytes)
        self._in_flight = False
        self._succeeded = False
        self._polls = 0  # polls since the last probe started (or since the reset)
        self._started = False  # whether a probe started since the last reset
        self.probes = 0  # probes started
        self.failures = 0  # probes that finished and failed

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    def poll(self) -> bool:
        """At a decision point: whether the last finished probe succeeded (kept until :meth:`reset`);
        takes the outcome of the probe in flight and starts the next one when due."""
        if self._in_flight:
            outcome = self.store.take()
            if outcome is not None:
                self._in_flight = False
                self._succeeded = outcome == (True, True)
                self.failures += int(not self._succeeded)
        self._polls += 1
        if not self._succeeded and not self._in_flight and self._due():
            self._rows[0, :8] = self._nonce
            self._rows[0, 8:16] = np.frombuffer(np.int64(self.probes).tobytes(), dtype=np.uint8)
            self._rows[1] = 0
            if self.store.start(partial(self.store.round_trip, self.key, self._rows[0], self._rows[1])):
                self._in_flight = True
                self._polls = 0
                self._started = True
                self.probes += 1
        return self._succeeded

    def _due(self) -> bool:
        # The first probe after a reset: at once; then every ``every`` polls.
        return not self._started or self._polls >= self.every

    def reset(self) -> None:
        """Forgets the last outcome (the tier re-attached, or was marked unavailable again): the next
        poll starts a probe as soon as none is in flight."""
        self._succeeded = False
        self._polls = 0
        self._started = False
