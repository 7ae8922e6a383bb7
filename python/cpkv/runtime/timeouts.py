"""The timeout rule (which timeouts are accepted), and turning a failed or stalled
barrier/collective into an error that names rank and step (and layer)."""

from __future__ import annotations

import datetime
import math
import time
from typing import Any, Callable, TypeVar

from cpkv.errors import CollectiveTimeoutError, InvalidArgumentError

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0
# torch.distributed and gloo count timeouts in whole milliseconds: a shorter one is zero (gloo's
# store refuses it). A week is longer than any wait a live peer needs, and far inside what
# datetime.timedelta and gloo's millisecond counters hold (1e15 s overflows both).
MIN_TIMEOUT_S = 1e-3
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def checked_timeout_s(value: Any, what: str = "timeout_s") -> float:
    """``value`` as a timeout in seconds by the one rule: a finite int or float in
    ``[MIN_TIMEOUT_S, MAX_TIMEOUT_S]`` (never a bool or a str); anything else is an
    :class:`InvalidArgumentError` naming ``what`` and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{what} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if not (math.isfinite(seconds) and MIN_TIMEOUT_S <= seconds <= MAX_TIMEOUT_S):
        raise InvalidArgumentError(
            f"{what} must be a finite number of seconds in [{MIN_TIMEOUT_S:g}, {MAX_TIMEOUT_S:g}], got {value!r}")
    return seconds


def as_timedelta(seconds: float, what: str = "timeout_s") -> datetime.timedelta:
    return datetime.timedelta(seconds=checked_timeout_s(seconds, what))


def guarded(what: str, rank: int, layer: int | None, timeout_s: float, call: Callable[[], T]) -> T:
    """Runs one collective; a timeout or a vanished peer becomes :class:`CollectiveTimeoutError`.

    ``layer`` None: a collective of no layer (a commit, an agreement), named by ``what`` alone.

    Gloo reports a dead peer as a closed connection and a stalled one as a
    timeout; both mean to the caller that this layer cannot finish, but the
    message says which it was (a death is not "did not complete within 60 s").
    """
    started = time.monotonic()
    try:
        return call()
    except CollectiveTimeoutError:
        raise
    except (RuntimeError, TimeoutError, ConnectionError) as err:
        elapsed = time.monotonic() - started
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        text = text.split(". This is typically caused by", 1)[0]  # gloo's advice, not information
        if isinstance(err, ConnectionError) or any(mark in text for mark in _CONNECTION_LOST):
            how = f"failed after {elapsed:.1f} s: a peer's connection closed (it died)"
        elif elapsed < 0.9 * timeout_s:  # gloo may word a peer's death as a timeout; the clock says not
            how = f"failed after {elapsed:.1f} s, before its {timeout_s:g} s timeout (a peer failed or died)"
        else:
            how = f"did not complete within {timeout_s:g} s (a peer died or stalled)"
        where = what if layer is None else f"{what} of layer {layer}"
        raise CollectiveTimeoutError(f"rank {rank}: {where} {how}: {text}") from err


# How gloo words a peer whose process is gone (its sockets closed by the kernel).
_CONNECTION_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "ECONNRESET")
