"""Turning a failed or stalled barrier/collective into an error that names rank and layer."""

from __future__ import annotations

import datetime
from typing import Callable, TypeVar

from cpkv.errors import CollectiveTimeoutError

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0


def as_timedelta(seconds: float) -> datetime.timedelta:
    if not seconds > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {seconds!r}")
    return datetime.timedelta(seconds=seconds)


def guarded(what: str, rank: int, layer: int, timeout_s: float, call: Callable[[], T]) -> T:
    """Runs one collective; a timeout or a vanished peer becomes :class:`CollectiveTimeoutError`.

    Gloo reports a dead peer as a closed connection and a stalled one as a
    timeout; both mean the same thing to the caller: this layer cannot finish.
    """
    try:
        return call()
    except CollectiveTimeoutError:
        raise
    except (RuntimeError, TimeoutError, ConnectionError) as err:
        raise CollectiveTimeoutError(
            f"rank {rank}: {what} of layer {layer} did not complete within {timeout_s:g} s "
            f"(a peer died or stalled): {str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from err
