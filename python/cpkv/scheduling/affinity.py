"""The warm/cold affinity decision: one candidate, the batch so far, the bounds.

Mixing a cold prefill into a batch of cache hits turns a 1-2 s forward into a
5-10 s one. So a warm-led batch skips cold candidates -- but only within three
bounds, and when a bound is hit the scan STOPS instead of force-admitting: the
cold request then leads its own clean batch on the next pass.

Decision table (policy active; ``bound`` = any bound hit for this candidate):

=============  ==========  =======  ==================
batch so far   candidate   bound    decision
=============  ==========  =======  ==================
empty          any         any      ADMIT (leads)
warm-led       warm        any      ADMIT
cold-led       any         any      ADMIT
warm-led       cold        none     SKIP
warm-led       cold        hit      STOP (the bound)
=============  ==========  =======  ==================

With the policy off (disabled, priority scheduling, or requests the engine has
already pre-filtered) every candidate is ADMIT: the scan is plain FCFS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling._validate import flag, non_negative_int
from cpkv.scheduling.classify import DEFAULT_FLOOR_TOKENS, RequestClass


class BatchClass(Enum):
    EMPTY = "empty"
    WARM = "warm-led"
    COLD = "cold-led"

    @staticmethod
    def led_by(leader: RequestClass) -> BatchClass:
        return BatchClass.WARM if leader is RequestClass.WARM else BatchClass.COLD


class Action(Enum):
    ADMIT = "admit"
    SKIP = "skip"  # leave it queued, look at the next candidate
    STOP = "stop"  # end the scan here; this batch is done


class Reason(Enum):
    POLICY_OFF = "policy off"
    LEADS = "leads the batch"
    WARM = "warm"
    COLD_LED = "cold-led batch"
    COLD_INTO_WARM = "cold into warm-led batch"
    SKIP_WINDOW = "skip window full"
    DEFER_LIMIT = "queue head deferred too often"
    AGE_BOUND = "age bound"
    # Budget and chunk reasons come from the scan, not from the affinity table.
    BUDGET = "batch budget full"
    CHUNK_STARTED = "started a chunk"
    MIXING_OFF = "chunk runs alone (mixing off)"
    UNALIGNED_PREFIX = "chunk prefix not page-aligned"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: Reason


@dataclass(frozen=True, slots=True)
class AffinityPolicy:
    """Configuration of the affinity rule; validated on construction.

    ``cp_mode`` ignores ``age_bound_s`` (wall time differs per rank; the
    replicated defer count bounds the wait instead). ``priority_scheduling``
    and ``prefiltered`` (LoRA, storage-tier prefetch: the engine already chose
    the set) turn the rule off, as does ``enabled=False``.
    """

    floor_tokens: int = DEFAULT_FLOOR_TOKENS
    skip_window: int = 16
    defer_limit: int = 3
    age_bound_s: float = 5.0
    cp_mode: bool = True
    enabled: bool = True
    priority_scheduling: bool = False
    prefiltered: bool = False

    def __post_init__(self) -> None:
        for name in ("floor_tokens", "skip_window", "defer_limit"):
            non_negative_int("AffinityPolicy", name, getattr(self, name))
        age = self.age_bound_s
        if isinstance(age, bool) or not isinstance(age, (int, float)) or not math.isfinite(age) or age < 0:
            raise InvalidArgumentError(f"AffinityPolicy.age_bound_s must be a finite number >= 0, got {age!r}")
        for name in ("cp_mode", "enabled", "priority_scheduling", "prefiltered"):
            flag("AffinityPolicy", name, getattr(self, name))

    @property
    def active(self) -> bool:
        return self.enabled and not self.priority_scheduling and not self.prefiltered


@dataclass(frozen=True, slots=True)
class Bounds:
    """The scan state one decision reads.

    ``skips`` is how many cold candidates this pass has skipped so far;
    ``head_defers`` is the replicated number of passes the queue head has been
    skipped, or ``None`` when the candidate is not the queue head; ``age_s``
    is the candidate's age (read only outside CP mode).
    """

    skips: int = 0
    head_defers: int | None = None
    age_s: float | None = None


def decide(policy: AffinityPolicy, batch: BatchClass, candidate: RequestClass, bounds: Bounds) -> Decision:
    """The affinity decision for one candidate. Pure: same inputs, same decision."""
    if not policy.active:
        return Decision(Action.ADMIT, Reason.POLICY_OFF)
    if batch is BatchClass.EMPTY:
        return Decision(Action.ADMIT, Reason.LEADS)
    if candidate is RequestClass.WARM:
        return Decision(Action.ADMIT, Reason.WARM)
    if batch is BatchClass.COLD:
        return Decision(Action.ADMIT, Reason.COLD_LED)
    # A cold candidate and a warm-led batch: skip, unless a bound says stop.
    if bounds.head_defers is not None and bounds.head_defers >= policy.defer_limit:
        return Decision(Action.STOP, Reason.DEFER_LIMIT)
    if not policy.cp_mode:
        if bounds.age_s is None:
            raise InvalidArgumentError("age_s is required outside CP mode (the age bound reads it)")
        if bounds.age_s >= policy.age_bound_s:
            return Decision(Action.STOP, Reason.AGE_BOUND)
    if bounds.skips >= policy.skip_window:
        return Decision(Action.STOP, Reason.SKIP_WINDOW)
    return Decision(Action.SKIP, Reason.COLD_INTO_WARM)
