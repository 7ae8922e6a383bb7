"""One waiting request as the scheduler's scan sees it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling._validate import flag, non_negative_int


@dataclass(frozen=True, slots=True)
class Candidate:
    """A request the scan considers, carrying the prefix match the scan already did.

    ``device_hit`` and ``host_hit`` are the matched prefix tokens on the device
    and in the host pool; their sum is the cached prefix the forward reads.
    ``extend_tokens`` is what is still to be computed (for a chunked request:
    everything after its carried prefix). ``is_chunked`` marks the request a
    previous pass started in chunks; its ``device_hit`` then includes the
    chunks already computed (its true carried prefix). ``age_s`` is the time
    since arrival, supplied by the engine and used only outside CP mode (wall
    time is per rank); ``None`` when the engine has no age to give.
    """

    request_id: int
    device_hit: int
    host_hit: int
    extend_tokens: int
    is_chunked: bool = False
    age_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("request_id", "device_hit", "host_hit"):
            non_negative_int("Candidate", name, getattr(self, name))
        non_negative_int("Candidate", "extend_tokens", self.extend_tokens)
        if self.extend_tokens == 0:
            raise InvalidArgumentError(
                f"Candidate.extend_tokens must be > 0 (request {self.request_id} has nothing to compute)"
            )
        flag("Candidate", "is_chunked", self.is_chunked)
        if self.age_s is not None and (
            isinstance(self.age_s, bool) or not isinstance(self.age_s, (int, float)) or not math.isfinite(self.age_s)
        ):
            raise InvalidArgumentError(f"Candidate.age_s must be a finite number or None, got {self.age_s!r}")

    @property
    def matched_tokens(self) -> int:
        """The cached prefix: device plus host hit."""
        return self.device_hit + self.host_hit
