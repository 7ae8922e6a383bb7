"""StoreProbe, the one probe of the cluster tiers (the main job's and both engines'), against a store
whose worker the test finishes by hand: a success is kept until it is used (no probe starts over
it, so ranks whose probes finish at different points all say yes at one point), a failure starts the
next probe at most every ``every`` polls, nothing starts while a call is stuck on the worker, and a
reset forgets the last outcome."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from cpkv.tier.cluster.probe import StoreProbe, probe_key


class Worker:
    """BoundedStore's start/take/round_trip/register, with each job finished by :meth:`finish`."""

    def __init__(self) -> None:
        self.job: Callable[[], Any] | None = None
        self.result: tuple[bool, Any] | None = None
        self.answers = True  # what the store does with the next round trip
        self.registered: list[int] = []
        self.keys: list[str] = []

    def register(self, address: int, nbytes: int) -> None:
        self.registered.append(nbytes)

    def round_trip(self, key: str, src: Any, dst: Any) -> bool:
        self.keys.append(key)
        if not self.answers:
            raise RuntimeError("connection refused")
        dst[:] = src
        return bool((src == dst).all())

    def start(self, job: Callable[[], Any]) -> bool:
        if self.job is not None:
            return False
        self.job, self.result = job, None
        return True

    def take(self) -> tuple[bool, Any] | None:
        if self.job is not None:
            return None
        result, self.result = self.result, None
        return result

    def finish(self) -> None:
        assert self.job is not None
        job, self.job = self.job, None
        try:
            self.result = (True, job())
        except Exception as err:
            self.result = (False, err)


def test_a_success_is_kept_until_reset_and_no_probe_starts_over_it() -> None:
    store = Worker()
    probe = StoreProbe(store)  # type: ignore[arg-type]
    assert store.registered == [128]
    assert probe.poll() is False and probe.in_flight and probe.probes == 1
    assert probe.poll() is False, "still running"
    store.finish()
    assert probe.poll() is True
    for _ in range(5):
        assert probe.poll() is True and not probe.in_flight
    assert probe.probes == 1
    probe.reset()
    assert probe.poll() is False and probe.probes == 2, "after a reset the next probe starts at once"


def test_a_failure_starts_the_next_probe_every_n_polls() -> None:
    store = Worker()
    store.answers = False
    probe = StoreProbe(store, every=3)  # type: ignore[arg-type]
    assert probe.poll() is False and probe.probes == 1
    store.finish()
    started = []
    for _ in range(7):
        assert probe.poll() is False
        started.append(probe.probes)
        if probe.in_flight:
            store.finish()
    assert probe.failures >= 2
    assert started == [1, 1, 2, 2, 2, 3, 3], started
    store.answers = True
    while not probe.in_flight:
        probe.poll()
    store.finish()
    assert probe.poll() is True


def test_nothing_starts_while_a_call_is_stuck_on_the_worker() -> None:
    store = Worker()
    probe = StoreProbe(store)  # type: ignore[arg-type]
    store.job = lambda: [0]  # a call that outlived its timeout still runs
    assert probe.poll() is False and probe.probes == 0 and not probe.in_flight
    store.finish()
    assert probe.poll() is False and probe.probes == 1, "the probe starts once the worker is free"


def test_every_prober_has_its_own_key() -> None:
    assert probe_key() != probe_key()
    store = Worker()
    StoreProbe(store, "cpkv/probe/mine").poll()  # type: ignore[arg-type]
    store.finish()
    assert store.keys == ["cpkv/probe/mine"]
    for every in (0, 1.5, True):
        with pytest.raises(ValueError, match="every"):
            StoreProbe(store, every=every)  # type: ignore[arg-type]
