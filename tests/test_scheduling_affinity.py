"""The affinity decision table, its bounds, and the policy's configuration."""

from __future__ import annotations

import itertools

import pytest

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling import (
    Action,
    AffinityPolicy,
    BatchClass,
    Bounds,
    Candidate,
    Decision,
    Reason,
    RequestClass,
    classify,
    decide,
)

W, C = RequestClass.WARM, RequestClass.COLD
ADMIT, SKIP, STOP = Action.ADMIT, Action.SKIP, Action.STOP

# Bound scenarios against a policy with skip_window=4, defer_limit=2, age_bound_s=5.
POLICY = dict(skip_window=4, defer_limit=2, age_bound_s=5.0)
BOUND_SCENARIOS = {
    "none": (False, Bounds(skips=3, head_defers=1, age_s=4.9)),  # each one short of its bound
    "skip window": (False, Bounds(skips=4, head_defers=None, age_s=0.0)),
    "defer limit": (False, Bounds(skips=0, head_defers=2, age_s=0.0)),
    "age bound": (False, Bounds(skips=0, head_defers=None, age_s=5.0)),
    "age in CP mode": (True, Bounds(skips=0, head_defers=None, age_s=1e9)),
}
# What a cold candidate meets in a warm-led batch, per scenario.
COLD_INTO_WARM = {
    "none": Decision(SKIP, Reason.COLD_INTO_WARM),
    "skip window": Decision(STOP, Reason.SKIP_WINDOW),
    "defer limit": Decision(STOP, Reason.DEFER_LIMIT),
    "age bound": Decision(STOP, Reason.AGE_BOUND),
    "age in CP mode": Decision(SKIP, Reason.COLD_INTO_WARM),
}


def expected(batch: BatchClass, klass: RequestClass, scenario: str) -> Decision:
    if batch is BatchClass.EMPTY:
        return Decision(ADMIT, Reason.LEADS)
    if klass is W:
        return Decision(ADMIT, Reason.WARM)
    if batch is BatchClass.COLD:
        return Decision(ADMIT, Reason.COLD_LED)
    return COLD_INTO_WARM[scenario]


@pytest.mark.parametrize(
    "batch,klass,scenario", list(itertools.product(BatchClass, RequestClass, BOUND_SCENARIOS))
)
def test_decision_table(batch: BatchClass, klass: RequestClass, scenario: str) -> None:
    cp_mode, bounds = BOUND_SCENARIOS[scenario]
    policy = AffinityPolicy(cp_mode=cp_mode, **POLICY)
    assert decide(policy, batch, klass, bounds) == expected(batch, klass, scenario)


@pytest.mark.parametrize(
    "bounds,reason",
    [
        (Bounds(skips=4, head_defers=2, age_s=9.0), Reason.DEFER_LIMIT),
        (Bounds(skips=4, head_defers=None, age_s=9.0), Reason.AGE_BOUND),
        (Bounds(skips=4, head_defers=0, age_s=0.0), Reason.SKIP_WINDOW),
    ],
)
def test_first_bound_hit_names_the_stop(bounds: Bounds, reason: Reason) -> None:
    policy = AffinityPolicy(cp_mode=False, **POLICY)
    assert decide(policy, BatchClass.WARM, C, bounds) == Decision(STOP, reason)


@pytest.mark.parametrize("field", ["skip_window", "defer_limit"])
def test_zero_bound_never_skips(field: str) -> None:
    policy = AffinityPolicy(**{**POLICY, field: 0})
    bounds = Bounds(skips=0, head_defers=0 if field == "defer_limit" else None)
    assert decide(policy, BatchClass.WARM, C, bounds).action is STOP


@pytest.mark.parametrize(
    "off", [dict(enabled=False), dict(priority_scheduling=True), dict(prefiltered=True)], ids=str
)
@pytest.mark.parametrize("batch,klass", list(itertools.product(BatchClass, RequestClass)))
def test_policy_off_admits_everything(off: dict, batch: BatchClass, klass: RequestClass) -> None:
    policy = AffinityPolicy(cp_mode=False, **POLICY, **off)
    assert not policy.active
    # Even with every bound hit, an inactive policy is plain FCFS.
    bounds = Bounds(skips=99, head_defers=99, age_s=99.0)
    assert decide(policy, batch, klass, bounds) == Decision(ADMIT, Reason.POLICY_OFF)


def test_cp_mode_ignores_age_and_needs_none() -> None:
    cp = AffinityPolicy(cp_mode=True, **POLICY)
    for age in (None, 0.0, 5.0, 1e12):
        assert decide(cp, BatchClass.WARM, C, Bounds(age_s=age)) == Decision(SKIP, Reason.COLD_INTO_WARM)
    single = AffinityPolicy(cp_mode=False, **POLICY)
    with pytest.raises(InvalidArgumentError, match="age_s is required"):
        decide(single, BatchClass.WARM, C, Bounds(age_s=None))


def test_classify_uses_device_plus_host_hit_against_the_floor() -> None:
    assert classify(Candidate(1, device_hit=63, host_hit=0, extend_tokens=5)) is C
    assert classify(Candidate(1, device_hit=32, host_hit=32, extend_tokens=5)) is W  # default floor 64
    assert classify(Candidate(1, device_hit=0, host_hit=64, extend_tokens=5)) is W
    assert classify(Candidate(1, device_hit=1000, host_hit=0, extend_tokens=5), floor_tokens=1001) is C
    with pytest.raises(InvalidArgumentError, match="floor_tokens"):
        classify(Candidate(1, 0, 0, 5), floor_tokens=-1)


def test_defaults_match_the_spec() -> None:
    p = AffinityPolicy()
    assert (p.floor_tokens, p.skip_window, p.defer_limit, p.age_bound_s) == (64, 16, 3, 5.0)
    assert p.active and p.cp_mode


@pytest.mark.parametrize(
    "field,value",
    [("floor_tokens", -1), ("skip_window", -1), ("defer_limit", -3), ("age_bound_s", -0.5),
     ("age_bound_s", float("nan")), ("skip_window", 1.5), ("cp_mode", 1), ("prefiltered", None)],
)
def test_bad_policy_names_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=field) as err:
        AffinityPolicy(**{field: value})
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "kwargs,field",
    [(dict(request_id=-1), "request_id"), (dict(device_hit=-1), "device_hit"), (dict(host_hit=-2), "host_hit"),
     (dict(extend_tokens=0), "extend_tokens"), (dict(is_chunked=1), "is_chunked"),
     (dict(age_s=float("inf")), "age_s")],
)
def test_bad_candidate_names_the_field(kwargs: dict, field: str) -> None:
    base = dict(request_id=1, device_hit=0, host_hit=0, extend_tokens=10)
    with pytest.raises(InvalidArgumentError, match=field):
        Candidate(**{**base, **kwargs})
