"""form_batch: the scan's behaviour, the scan state, and properties over
engine loops driven by hypothesis."""

from __future__ import annotations

import doctest
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cpkv.scheduling
from cpkv.errors import InvalidArgumentError
from cpkv.scheduling import (
    Action,
    AffinityPolicy,
    BatchClass,
    BudgetConfig,
    Candidate,
    ChunkRole,
    Pass,
    Reason,
    RequestClass,
    ScanState,
    form_batch,
)

AFFINITY = AffinityPolicy(skip_window=2, defer_limit=2)
BUDGET = BudgetConfig(mixing=True)


def warm(rid: int, extend: int = 100) -> Candidate:
    return Candidate(rid, device_hit=4096, host_hit=0, extend_tokens=extend)


def cold(rid: int, extend: int = 100) -> Candidate:
    return Candidate(rid, device_hit=0, host_hit=0, extend_tokens=extend)


def ids(step: Pass) -> list[int]:
    return [a.request_id for a in step.batch]


def test_the_example_in_the_module_docstring_runs() -> None:
    result = doctest.testmod(cpkv.scheduling, raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0


def test_head_always_starts_a_batch_even_cold() -> None:
    step = form_batch([cold(1), warm(2), cold(3)], ScanState(), AFFINITY, BUDGET)
    assert ids(step) == [1, 2, 3] and step.batch_class is BatchClass.COLD and step.stop is None
    assert [a.klass for a in step.batch] == [RequestClass.COLD, RequestClass.WARM, RequestClass.COLD]


def test_warm_led_batch_skips_cold_and_keeps_scanning() -> None:
    step = form_batch([warm(1), cold(2), warm(3)], ScanState(), AFFINITY, BUDGET)
    assert ids(step) == [1, 3] and step.taken_from_queue == (1, 3)
    assert [(s.request_id, s.decision.action) for s in step.steps] == [
        (1, Action.ADMIT), (2, Action.SKIP), (3, Action.ADMIT)]
    assert step.state == ScanState()  # the head left the queue


def test_a_bound_stops_the_scan_rather_than_force_admitting() -> None:
    queue = [warm(1), cold(2), cold(3), cold(4), warm(5)]
    step = form_batch(queue, ScanState(), AFFINITY, BUDGET)  # skip window 2
    assert ids(step) == [1] and step.stop is Reason.SKIP_WINDOW
    assert [s.request_id for s in step.steps] == [1, 2, 3, 4]  # 5 is never looked at
    nxt = form_batch([c for c in queue if c.request_id != 1], step.state, AFFINITY, BUDGET)
    assert ids(nxt) == [2, 3, 4, 5] and nxt.batch_class is BatchClass.COLD  # the cold head leads a clean batch


def test_policy_off_is_fcfs() -> None:
    queue = [warm(1), cold(2), warm(3)]
    for off in (dict(enabled=False), dict(priority_scheduling=True), dict(prefiltered=True)):
        step = form_batch(queue, ScanState(), replace(AFFINITY, **off), BUDGET)
        assert ids(step) == [1, 2, 3]
        assert {s.decision.reason for s in step.steps[1:]} == {Reason.POLICY_OFF}


def test_chunk_led_batch_takes_its_class_from_the_chunk() -> None:
    warm_tail = Candidate(9, device_hit=16384, host_hit=0, extend_tokens=500, is_chunked=True)
    step = form_batch([cold(1), warm(2)], ScanState(), AFFINITY, BUDGET, chunked=warm_tail)
    assert step.batch_class is BatchClass.WARM and ids(step) == [9, 2]
    assert step.state == ScanState(head_id=1, head_defers=1)  # the cold head was skipped
    cold_tail = Candidate(9, device_hit=0, host_hit=0, extend_tokens=500, is_chunked=True)
    step = form_batch([cold(1), warm(2)], ScanState(), AFFINITY, BUDGET, chunked=cold_tail)
    assert step.batch_class is BatchClass.COLD and ids(step) == [9, 1, 2]


def test_defer_count_on_the_queue_head_bounds_the_wait() -> None:
    # Every pass a new warm chunk tail leads; the cold head is skipped until the
    # replicated defer count reaches the limit, then the scan stops at it.
    state = ScanState()
    for n in range(1, 3):
        tail = Candidate(100 + n, device_hit=4096, host_hit=0, extend_tokens=200, is_chunked=True)
        step = form_batch([cold(1), warm(2 * n)], state, AFFINITY, BUDGET, chunked=tail)
        assert ids(step) == [100 + n, 2 * n] and step.state == ScanState(1, n)
        state = step.state
    tail = Candidate(200, device_hit=4096, host_hit=0, extend_tokens=200, is_chunked=True)
    step = form_batch([cold(1), warm(6)], state, AFFINITY, BUDGET, chunked=tail)
    assert ids(step) == [200] and step.stop is Reason.DEFER_LIMIT
    assert step.state == ScanState(1, 2)  # kept: the head is still waiting
    step = form_batch([cold(1), warm(6)], step.state, AFFINITY, BUDGET)
    assert ids(step) == [1, 6] and step.state == ScanState()


def test_defer_count_follows_the_head_not_a_stale_id() -> None:
    stale = ScanState(head_id=1, head_defers=2)  # request 1 is gone (aborted)
    tail = Candidate(9, device_hit=4096, host_hit=0, extend_tokens=200, is_chunked=True)
    step = form_batch([cold(5), warm(6)], stale, AFFINITY, BUDGET, chunked=tail)
    assert ids(step) == [9, 6] and step.state == ScanState(5, 1)


def test_cp_mode_ignores_age_outside_it_the_age_bound_stops() -> None:
    old_cold = Candidate(2, 0, 0, 100, age_s=60.0)
    queue = [replace(warm(1), age_s=0.1), old_cold, replace(warm(3), age_s=0.1)]
    assert ids(form_batch(queue, ScanState(), replace(AFFINITY, cp_mode=True), BUDGET)) == [1, 3]
    step = form_batch(queue, ScanState(), replace(AFFINITY, cp_mode=False), BUDGET)
    assert ids(step) == [1] and step.stop is Reason.AGE_BOUND


def test_misuse_is_rejected() -> None:
    tail = Candidate(9, device_hit=4096, host_hit=0, extend_tokens=200, is_chunked=True)
    with pytest.raises(InvalidArgumentError, match="request 9 is chunked"):
        form_batch([warm(1), tail], ScanState(), AFFINITY, BUDGET)
    with pytest.raises(InvalidArgumentError, match="chunked request 1 does not have is_chunked"):
        form_batch([], ScanState(), AFFINITY, BUDGET, chunked=warm(1))
    with pytest.raises(InvalidArgumentError, match="request 1 appears twice"):
        form_batch([warm(1), warm(2), warm(1)], ScanState(), AFFINITY, BUDGET)
    with pytest.raises(InvalidArgumentError, match="request 9 appears twice"):
        form_batch([warm(9)], ScanState(), AFFINITY, BUDGET, chunked=replace(tail, extend_tokens=10))
    with pytest.raises(InvalidArgumentError, match="head_defers"):
        ScanState(head_id=None, head_defers=1)
    with pytest.raises(InvalidArgumentError, match="head_defers"):
        ScanState(head_id=1, head_defers=-1)


def test_empty_queue_gives_an_empty_batch_and_keeps_the_state() -> None:
    state = ScanState(3, 1)
    step = form_batch([], state, AFFINITY, BUDGET)
    assert step.batch == () and step.state == state and step.batch_class is BatchClass.EMPTY


# ---- properties over engine loops -------------------------------------------------------------

@st.composite
def scenarios(draw, starving: bool = False):
    """A policy, a budget and waves of arrivals. ``starving`` builds the case the
    defer count exists for: mixing on, a long warm request and a cold one
    behind it, then a stream of long warm requests whose chunk tails keep
    leading warm batches past the cold queue head."""
    page = draw(st.sampled_from([16, 64]))
    cap = page * draw(st.integers(1, 8))
    slack = draw(st.integers(0, 2))
    mixing = True if starving else draw(st.booleans())
    staging = cap // page + slack + (0 if mixing else draw(st.integers(0, 3)))
    budget = BudgetConfig(page_size=page, extend_cap=cap, cached_cap=draw(st.integers(1, 6 * cap)),
                          staging_pages=staging, slack_pages=slack, mixing=mixing)
    policy = AffinityPolicy(floor_tokens=64 if starving else draw(st.sampled_from([0, 64, 256])),
                            skip_window=draw(st.integers(1 if starving else 0, 3)),
                            defer_limit=draw(st.integers(0, 3)),
                            enabled=True if starving else draw(st.booleans()))
    if starving:  # a long warm request with a cold one behind it, then a steady stream
        waves = [2] + draw(st.lists(st.integers(1, 2), min_size=6, max_size=12))
    else:
        waves = draw(st.lists(st.integers(0, 4), min_size=1, max_size=12))
    arrivals, rid = [], 0
    for k, size in enumerate(waves):
        wave = []
        for _ in range(size):
            if starving and k == 0 and wave:
                cand = Candidate(rid, 0, 0, draw(st.integers(1, cap)))
            elif starving:
                cand = Candidate(rid, draw(st.integers(1, 4)) * cap, 0, draw(st.integers(cap + 1, 3 * cap)))
            else:
                cand = Candidate(rid, device_hit=draw(st.integers(0, 3 * cap)), host_hit=draw(st.integers(0, page)),
                                 extend_tokens=draw(st.integers(1, 3 * cap)))
            wave.append(cand)
            rid += 1
        arrivals.append(wave)
    return policy, budget, arrivals


def drive(policy: AffinityPolicy, budget: BudgetConfig, arrivals: list[list[Candidate]], max_passes: int):
    """An engine loop: requests arrive in waves, one pass per forward. Returns
    (queue before the pass, pass) per pass, and what is left at the end."""
    queue: list[Candidate] = []
    state, carried, trace = ScanState(), None, []
    for k in range(max_passes):
        if k < len(arrivals):
            queue.extend(arrivals[k])
        if not queue and carried is None:
            if k >= len(arrivals):
                break
            continue
        step = form_batch(queue, state, policy, budget, chunked=carried)
        trace.append((list(queue), step))
        taken = set(step.taken_from_queue)
        queue = [c for c in queue if c.request_id not in taken]
        state, carried = step.state, step.carried
    return trace, queue, carried


def pass_limit(budget: BudgetConfig, policy: AffinityPolicy, arrivals) -> int:
    chunks = sum(-(-c.extend_tokens // (budget.extend_cap - budget.page_size + 1)) + 1 for w in arrivals for c in w)
    return len(arrivals) + chunks * (policy.defer_limit + 2) + 10


PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(scenarios())
def test_batches_respect_the_caps(scenario) -> None:
    policy, budget, arrivals = scenario
    trace, _, _ = drive(policy, budget, arrivals, pass_limit(budget, policy, arrivals))
    for _, step in trace:
        leader = step.batch[0]
        assert step.extend_tokens <= budget.extend_cap
        assert sum(budget.pages_for(a.extend_tokens) for a in step.batch) <= budget.staging_pages
        # The leader is always admitted; only it may exceed the cached cap.
        assert step.cached_tokens <= max(budget.cached_cap, leader.cached_tokens)
        assert sum(a.role is ChunkRole.INTERMEDIATE for a in step.batch) <= 1  # one request continues
        if step.leader_was_carried and (not budget.mixing or leader.cached_tokens % budget.page_size):
            assert len(step.batch) == 1


@PROPERTY_SETTINGS
@given(scenarios())
def test_warm_is_never_skipped_and_every_request_completes_once(scenario) -> None:
    policy, budget, arrivals = scenario
    trace, queue, carried = drive(policy, budget, arrivals, pass_limit(budget, policy, arrivals))
    assert queue == [] and carried is None
    computed: dict[int, int] = {}
    finals: list[int] = []
    for _, step in trace:
        for s in step.steps:
            if s.decision.action is Action.SKIP:
                assert policy.active
                assert next(c for q, _ in trace for c in q if c.request_id == s.request_id).matched_tokens \
                    < policy.floor_tokens
        for a in step.batch:
            computed[a.request_id] = computed.get(a.request_id, 0) + a.extend_tokens
            if a.is_final:
                finals.append(a.request_id)
    everyone = {c.request_id: c for w in arrivals for c in w}
    assert sorted(finals) == sorted(everyone)  # each completes exactly once
    assert computed == {rid: c.extend_tokens for rid, c in everyone.items()}  # every token computed once


@PROPERTY_SETTINGS
@given(st.one_of(scenarios(), scenarios(starving=True)))
def test_a_cold_head_waits_at_most_defer_limit_passes(scenario) -> None:
    policy, budget, arrivals = scenario
    trace, _, _ = drive(policy, budget, arrivals, pass_limit(budget, policy, arrivals))
    waits: dict[int, int] = {}
    for k, (queue, step) in enumerate(trace):
        head = queue[0].request_id if queue else None
        considered = {s.request_id: s.decision for s in step.steps}
        if head is None or head not in considered or head in step.taken_from_queue:
            continue
        # Passed over: at most defer_limit times by a skip, then one stop at most.
        waits[head] = waits.get(head, 0) + 1
        assert waits[head] <= policy.defer_limit + 1
        if considered[head].reason is Reason.DEFER_LIMIT:
            # ... after which it leads the next pass: no chunk is carried past a stop.
            assert step.carried is None
            assert k + 1 < len(trace) and trace[k + 1][1].batch[0].request_id == head


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.lists(st.floats(0, 1e6), min_size=1, max_size=50))
def test_cp_mode_decisions_do_not_depend_on_age(scenario, ages) -> None:
    policy, budget, arrivals = scenario
    queue = [c for w in arrivals for c in w]
    aged = [replace(c, age_s=ages[i % len(ages)]) for i, c in enumerate(queue)]
    a = form_batch(queue, ScanState(), policy, budget)
    b = form_batch(aged, ScanState(), policy, budget)
    assert a.record() == b.record()
