"""One scheduling pass: ``form_batch`` over the queue and the replicated scan state.

The engine calls :func:`form_batch` once per pass with its waiting queue (in
queue order), the chunked request it is carrying (if any) and the
:class:`ScanState` the previous pass returned. Everything it reads is
replicated -- the queue, each candidate's match, the state -- so every CP rank
forms the same batch without talking. It reads no clock: a candidate's age is
an input, and CP mode ignores it.

The queue may be any iterable; the scan pulls candidates lazily and stops
early, so an engine can match each request only when the scan reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling._validate import non_negative_int
from cpkv.scheduling.affinity import Action, AffinityPolicy, BatchClass, Bounds, Decision, Reason, decide
from cpkv.scheduling.budget import Budget, BudgetConfig, Fit, FitKind, lead_fit
from cpkv.scheduling.candidate import Candidate
from cpkv.scheduling.classify import RequestClass, classify


@dataclass(frozen=True, slots=True)
class ScanState:
    """Replicated state carried from pass to pass: how many passes the queue
    head (``head_id``) has been skipped. It changes only through form_batch."""

    head_id: int | None = None
    head_defers: int = 0

    def __post_init__(self) -> None:
        if self.head_id is not None:
            non_negative_int("ScanState", "head_id", self.head_id)
        non_negative_int("ScanState", "head_defers", self.head_defers)
        if self.head_id is None and self.head_defers:
            raise InvalidArgumentError(f"ScanState.head_defers is {self.head_defers} with no head_id")

    def defers_for(self, request_id: int) -> int:
        return self.head_defers if request_id == self.head_id else 0


class ChunkRole(Enum):
    WHOLE = "whole"  # the whole request in this forward
    INTERMEDIATE = "intermediate"  # a chunk; the request continues next pass
    FINAL = "final"  # the last chunk of a chunked request


@dataclass(frozen=True, slots=True)
class Admission:
    """One request in the batch: what this forward computes and reads for it."""

    request_id: int
    extend_tokens: int
    cached_tokens: int
    role: ChunkRole
    klass: RequestClass

    @property
    def is_final(self) -> bool:
        """The authoritative flag for :func:`~cpkv.scheduling.backup_range`:
        True unless this forward computes an intermediate chunk."""
        return self.role is not ChunkRole.INTERMEDIATE


@dataclass(frozen=True, slots=True)
class Step:
    """One scan decision (the audit trail of a pass)."""

    request_id: int
    decision: Decision


@dataclass(frozen=True, slots=True)
class Pass:
    """What :func:`form_batch` returns.

    ``batch`` lists the forward's requests, the leader first. ``carried`` is
    the chunked request to pass back next time (``None`` when no chunk
    continues). ``state`` is the scan state for the next pass. ``stop`` says
    why the scan ended early, ``None`` when it reached the end of the queue.
    """

    batch: tuple[Admission, ...]
    batch_class: BatchClass
    carried: Candidate | None
    state: ScanState
    steps: tuple[Step, ...] = field(default=())
    stop: Reason | None = None
    leader_was_carried: bool = False

    @property
    def taken_from_queue(self) -> tuple[int, ...]:
        """Ids the engine removes from its waiting queue (a carried leader was not in it)."""
        rest = self.batch[1:] if self.leader_was_carried else self.batch
        return tuple(a.request_id for a in rest)

    @property
    def extend_tokens(self) -> int:
        return sum(a.extend_tokens for a in self.batch)

    @property
    def cached_tokens(self) -> int:
        return sum(a.cached_tokens for a in self.batch)

    def record(self) -> dict:
        """A plain, order-preserving description (for digests and JSON)."""
        return {
            "batch": [[a.request_id, a.extend_tokens, a.cached_tokens, a.role.value, a.klass.value] for a in self.batch],
            "class": self.batch_class.value,
            "carried": None if self.carried is None else [self.carried.request_id, self.carried.matched_tokens,
                                                           self.carried.extend_tokens],
            "state": [self.state.head_id, self.state.head_defers],
            "steps": [[s.request_id, s.decision.action.value, s.decision.reason.value] for s in self.steps],
            "stop": None if self.stop is None else self.stop.value,
        }


def _continuation(candidate: Candidate, chunk: int) -> Candidate:
    """The chunked request after this chunk: its carried prefix grows by the chunk."""
    return Candidate(
        request_id=candidate.request_id,
        device_hit=candidate.device_hit + chunk,
        host_hit=candidate.host_hit,
        extend_tokens=candidate.extend_tokens - chunk,
        is_chunked=True,
        age_s=candidate.age_s,
    )


class _Batch:
    """The batch being formed within one pass (never escapes form_batch)."""

    def __init__(self, config: BudgetConfig) -> None:
        self.left = Budget.open(config)
        self.admitted: list[Admission] = []
        self.steps: list[Step] = []
        self.klass = BatchClass.EMPTY
        self.carried: Candidate | None = None

    def admit(self, cand: Candidate, fit: Fit, klass: RequestClass, role: ChunkRole) -> None:
        self.admitted.append(Admission(cand.request_id, fit.extend_tokens, cand.matched_tokens, role, klass))
        # A chunked request charges its true carried prefix (its matched_tokens), never 0.
        self.left = self.left.charge(fit.extend_tokens, cand.matched_tokens)
        if self.klass is BatchClass.EMPTY:
            self.klass = BatchClass.led_by(klass)
        if role is ChunkRole.INTERMEDIATE:
            self.carried = _continuation(cand, fit.extend_tokens)


def form_batch(
    queue: Iterable[Candidate],
    state: ScanState,
    policy: AffinityPolicy,
    budget: BudgetConfig,
    chunked: Candidate | None = None,
) -> Pass:
    """Forms one batch. Pure: the same arguments give the same Pass.

    Order of the pass:

    1. A carried chunked request leads; the batch takes its class from the
       chunk. Its chunk is the rest of it or a page-aligned chunk of the extend
       cap; it charges its true carried prefix against the cached cap. Without
       mixing, or with a carried prefix off a page boundary, it runs alone; a
       full chunk consumes the extend cap and so ends the scan too.
    2. Otherwise the queue head leads (always admitted; a long one starts a
       chunk of the extend cap).
    3. The rest of the queue, in order: the affinity decision (ADMIT, SKIP or
       STOP) and then the budget -- a request that does not fit ends the scan,
       except that one that overflows the room may start a chunk when no
       request in the batch continues yet (then the scan ends).
    """
    if chunked is not None and not chunked.is_chunked:
        raise InvalidArgumentError(f"chunked request {chunked.request_id} does not have is_chunked set")
    batch = _Batch(budget)
    stop: Reason | None = None
    if chunked is not None:
        fit = lead_fit(budget, chunked.extend_tokens, chunked.matched_tokens)
        role = ChunkRole.FINAL if fit.kind is FitKind.WHOLE else ChunkRole.INTERMEDIATE
        batch.admit(chunked, fit, classify(chunked, policy.floor_tokens), role)
        batch.steps.append(Step(chunked.request_id, Decision(Action.ADMIT, Reason.LEADS)))
        if not budget.mixing:
            stop = Reason.MIXING_OFF
        elif chunked.matched_tokens % budget.page_size:
            stop = Reason.UNALIGNED_PREFIX
        elif batch.left.exhausted:
            stop = Reason.BUDGET

    head_id: int | None = None
    head_action: Action | None = None
    if stop is None:
        stop, head_id, head_action = _scan(queue, state, policy, budget, batch)
    return Pass(tuple(batch.admitted), batch.klass, batch.carried, _next_state(state, head_id, head_action),
                tuple(batch.steps), stop, chunked is not None)


def _scan(
    queue: Iterable[Candidate], state: ScanState, policy: AffinityPolicy, budget: BudgetConfig, batch: _Batch
) -> tuple[Reason | None, int | None, Action | None]:
    """Steps 2 and 3 of form_batch: (why the scan ended, the queue head, what it got)."""
    head_id: int | None = None
    head_action: Action | None = None
    skips = 0
    seen = {a.request_id for a in batch.admitted}
    for index, cand in enumerate(queue):
        if cand.is_chunked:
            raise InvalidArgumentError(f"request {cand.request_id} is chunked; pass it as `chunked`, not in the queue")
        if cand.request_id in seen:
            raise InvalidArgumentError(f"request {cand.request_id} appears twice (queue and/or chunked)")
        seen.add(cand.request_id)
        if index == 0:
            head_id = cand.request_id
        klass = classify(cand, policy.floor_tokens)
        if not batch.admitted:
            decision = Decision(Action.ADMIT, Reason.LEADS)
            fit = lead_fit(budget, cand.extend_tokens, cand.matched_tokens)
        else:
            bounds = Bounds(skips, state.defers_for(cand.request_id) if index == 0 else None, cand.age_s)
            decision = decide(policy, batch.klass, klass, bounds)
            if decision.action is Action.ADMIT:
                # One request continues past a batch: a new chunk may start
                # behind a final chunk, never behind an intermediate one.
                fit = batch.left.fit(cand.extend_tokens, cand.matched_tokens, may_chunk=batch.carried is None)
                if fit.kind is FitKind.NONE:
                    decision = Decision(Action.STOP, Reason.BUDGET)
        if index == 0:
            head_action = decision.action
        batch.steps.append(Step(cand.request_id, decision))
        if decision.action is Action.SKIP:
            skips += 1
            continue
        if decision.action is Action.STOP:
            return decision.reason, head_id, head_action
        role = ChunkRole.WHOLE if fit.kind is FitKind.WHOLE else ChunkRole.INTERMEDIATE
        batch.admit(cand, fit, klass, role)
        if role is ChunkRole.INTERMEDIATE:
            return Reason.CHUNK_STARTED, head_id, head_action
        if batch.left.exhausted:
            return Reason.BUDGET, head_id, head_action
    return None, head_id, head_action


def _next_state(state: ScanState, head_id: int | None, head_action: Action | None) -> ScanState:
    """The replicated defer count: +1 when the queue head was skipped, kept when
    the scan stopped at it, reset when it was admitted, unchanged when unseen."""
    if head_id is None:
        return state
    if head_action is Action.SKIP:
        return ScanState(head_id, state.defers_for(head_id) + 1)
    if head_action is Action.ADMIT:
        return ScanState()
    return ScanState(head_id, state.defers_for(head_id))
