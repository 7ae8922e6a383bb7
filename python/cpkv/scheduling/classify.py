"""Warm or cold: does a request's cached prefix reach the floor?"""

from __future__ import annotations

from enum import Enum

from cpkv.scheduling._validate import non_negative_int
from cpkv.scheduling.candidate import Candidate

DEFAULT_FLOOR_TOKENS = 64


class RequestClass(Enum):
    WARM = "warm"  # a short extend over a cached prefix: a cheap forward
    COLD = "cold"  # little or nothing cached: a long, expensive extend


def classify(candidate: Candidate, floor_tokens: int = DEFAULT_FLOOR_TOKENS) -> RequestClass:
    """Warm when the match the scan already did (device + host hit) reaches the floor.

    No extra matching happens here; the candidate carries its match. Pick the
    floor above any prefix every request shares (a common system prompt): at
    64 tokens, a deployment whose requests all share a 512-token system prompt
    would see every request as warm and the affinity rule would never act.
    """
    non_negative_int("classify", "floor_tokens", floor_tokens)
    return RequestClass.WARM if candidate.matched_tokens >= floor_tokens else RequestClass.COLD
