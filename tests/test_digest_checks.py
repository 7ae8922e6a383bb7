"""The adapters' shared digest-check cadence: which stores are checked, in which order, and what a
failed check stops."""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.errors import DivergenceError
from cpkv.integrations._digest_checks import DigestChecks

WAIT_S = 30.0
T = TypeVar("T")


def taking(value: T) -> Callable[[], T]:
    """What a store's ``take`` captures: the value as it is now."""
    return lambda: value


@settings(max_examples=50, deadline=None)
@given(every=st.integers(1, 9), stores=st.integers(0, 60))
def test_every_nth_store_is_checked_once_in_order_with_the_state_taken_at_the_store(every: int, stores: int) -> None:
    seen: list[tuple[int, int]] = []
    checks: DigestChecks[tuple[int, int]] = DigestChecks(every, seen.append, lambda: False)
    state = 0
    for n in range(1, stores + 1):
        state = state * 31 + n  # what the store changed; later stores change it again
        checks.after_store(n, taking((n, state)))
    checks.wait(WAIT_S)
    checks.close(WAIT_S)
    expected, state = [], 0
    for n in range(1, stores + 1):
        state = state * 31 + n
        if n % every == 0:
            expected.append((n, state))
    assert seen == expected


def test_a_failed_check_stops_the_later_ones_and_wait_returns() -> None:
    broken = threading.Event()
    seen: list[int] = []

    def check(point: int) -> None:
        seen.append(point)
        if point == 2:
            broken.set()  # the adapter keeps the error; the checker stops
            raise DivergenceError(f"digest differs at store {point}")

    checks: DigestChecks[int] = DigestChecks(1, check, broken.is_set)
    for n in range(1, 6):
        checks.after_store(n, taking(n))
    checks.wait(WAIT_S)  # returns on the failure, not after WAIT_S
    assert broken.is_set()
    checks.close(WAIT_S)
    assert seen == [1, 2]


def test_the_checks_run_off_the_storing_thread() -> None:
    release, started = threading.Event(), threading.Event()
    threads: list[str] = []

    def check(point: int) -> None:
        threads.append(threading.current_thread().name)
        started.set()
        assert release.wait(WAIT_S)

    checks: DigestChecks[int] = DigestChecks(1, check, lambda: False, name="checker-under-test")
    checks.after_store(1, lambda: 1)
    assert started.wait(WAIT_S)
    checks.after_store(2, lambda: 2)  # returns while the first check still blocks
    release.set()
    checks.wait(WAIT_S)
    checks.close(WAIT_S)
    assert threads == ["checker-under-test", "checker-under-test"]
