"""Chunked-prefill budgeting: seeding, mixing after full and tail chunks,
the unaligned-prefix rule and the staging identity."""

from __future__ import annotations

import pytest

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling import (
    AffinityPolicy,
    Budget,
    BudgetConfig,
    Candidate,
    ChunkRole,
    Fit,
    FitKind,
    Reason,
    ScanState,
    form_batch,
)

# page 64, extend cap 16384 (256 pages), cached cap 262144, staging 256 + 1 slack.
MIXED = BudgetConfig(mixing=True)
SOLO = BudgetConfig(mixing=False)
FCFS = AffinityPolicy(enabled=False)


def chunk(prefix: int, remaining: int, rid: int = 7) -> Candidate:
    return Candidate(rid, device_hit=prefix, host_hit=0, extend_tokens=remaining, is_chunked=True)


def warm(rid: int, extend: int, cached: int = 4096) -> Candidate:
    return Candidate(rid, device_hit=cached, host_hit=0, extend_tokens=extend)


def test_defaults_and_pages() -> None:
    assert (MIXED.page_size, MIXED.extend_cap, MIXED.cached_cap, MIXED.staging_pages, MIXED.slack_pages) == (
        64, 16384, 262144, 257, 1)
    assert [MIXED.pages_for(n) for n in (1, 64, 65, 5000, 16384)] == [2, 2, 3, 80, 257]


def test_seeding_charges_the_true_carried_prefix() -> None:
    # A tail chunk of 5000 tokens over a carried prefix of 20480 (a 16384-token
    # chunk already computed over a 4096-token match).
    seeded = Budget.open(MIXED).charge(5000, 20480)
    assert seeded == Budget(MIXED, extend_left=16384 - 5000, cached_left=262144 - 20480, pages_left=257 - 80)
    step = form_batch([], ScanState(), FCFS, MIXED, chunked=chunk(20480, 5000))
    assert step.batch[0].cached_tokens == 20480 and step.batch[0].extend_tokens == 5000
    assert step.batch[0].role is ChunkRole.FINAL


@pytest.mark.parametrize(
    "follower,admitted",
    [
        (Candidate(8, device_hit=241664, host_hit=0, extend_tokens=64), True),  # exactly the cached room left
        (Candidate(8, device_hit=241665, host_hit=0, extend_tokens=64), False),  # one token over
        (warm(8, extend=176 * 64), True),  # 177 pages: exactly the staging room left
    ],
)
def test_followers_of_a_tail_chunk_fit_the_seeded_budget(follower: Candidate, admitted: bool) -> None:
    step = form_batch([follower], ScanState(), FCFS, MIXED, chunked=chunk(20480, 5000))
    assert [a.request_id for a in step.batch] == ([7, 8] if admitted else [7])
    if not admitted:
        assert step.stop is Reason.BUDGET


def test_a_new_chunk_may_start_behind_a_final_chunk() -> None:
    # 176 * 64 + 1 tokens need 178 pages; 177 are left, so 176 pages' worth starts a chunk.
    step = form_batch([warm(8, extend=176 * 64 + 1)], ScanState(), FCFS, MIXED, chunked=chunk(20480, 5000))
    assert [(a.request_id, a.extend_tokens, a.role) for a in step.batch] == [
        (7, 5000, ChunkRole.FINAL), (8, 176 * 64, ChunkRole.INTERMEDIATE)]
    assert step.stop is Reason.CHUNK_STARTED and step.carried == Candidate(8, 4096 + 176 * 64, 0, 1, is_chunked=True)


def test_prefix_charged_not_zero_keeps_followers_within_the_cached_cap() -> None:
    cfg = BudgetConfig(cached_cap=30000, mixing=True)
    step = form_batch([warm(8, 100, cached=10000)], ScanState(), FCFS, cfg, chunked=chunk(20480, 5000))
    # Had the chunk charged 0, 10000 cached tokens would have fit next to it.
    assert [a.request_id for a in step.batch] == [7] and step.stop is Reason.BUDGET
    assert sum(a.cached_tokens for a in step.batch) <= cfg.cached_cap


def test_full_chunk_consumes_the_extend_cap_and_ends_the_scan() -> None:
    step = form_batch([warm(8, 10)], ScanState(), FCFS, MIXED, chunked=chunk(20480, 40000))
    assert [(a.request_id, a.extend_tokens, a.role) for a in step.batch] == [(7, 16384, ChunkRole.INTERMEDIATE)]
    assert step.stop is Reason.BUDGET and step.steps[-1].request_id == 7  # 8 was never looked at
    assert step.carried == chunk(20480 + 16384, 40000 - 16384)
    assert step.taken_from_queue == ()


def test_tail_chunk_leaves_room_for_mixing() -> None:
    queue = [warm(8, 3000), warm(9, 3000), warm(10, 6000), warm(11, 1)]
    step = form_batch(queue, ScanState(), FCFS, MIXED, chunked=chunk(20480, 5000))
    # After 7, 8 and 9: 5384 extend tokens and 257 - 80 - 48 - 48 = 81 pages left,
    # so 10 starts an 80-page chunk and the scan ends there.
    assert [(a.request_id, a.extend_tokens, a.role) for a in step.batch] == [
        (7, 5000, ChunkRole.FINAL), (8, 3000, ChunkRole.WHOLE), (9, 3000, ChunkRole.WHOLE),
        (10, 5120, ChunkRole.INTERMEDIATE)]
    assert step.stop is Reason.CHUNK_STARTED and step.taken_from_queue == (8, 9, 10)
    assert step.carried == Candidate(10, 4096 + 5120, 0, 880, is_chunked=True)
    assert step.extend_tokens <= MIXED.extend_cap


def test_mixing_off_runs_a_chunk_alone() -> None:
    step = form_batch([warm(8, 10)], ScanState(), FCFS, SOLO, chunked=chunk(20480, 5000))
    assert [a.request_id for a in step.batch] == [7] and step.stop is Reason.MIXING_OFF


@pytest.mark.parametrize("prefix", [20481, 20480 + 63, 100])
def test_unaligned_chunk_prefix_keeps_the_batch_solo(prefix: int) -> None:
    step = form_batch([warm(8, 10)], ScanState(), FCFS, MIXED, chunked=chunk(prefix, 5000))
    assert [a.request_id for a in step.batch] == [7] and step.stop is Reason.UNALIGNED_PREFIX


def test_intermediate_chunk_realigns_an_unaligned_prefix() -> None:
    step = form_batch([], ScanState(), FCFS, MIXED, chunked=chunk(20481, 40000))
    assert step.batch[0].extend_tokens == 16383  # ends on page boundary 36864
    assert step.carried is not None and step.carried.matched_tokens == 36864


def test_new_request_over_the_cap_leads_as_a_chunk() -> None:
    step = form_batch([Candidate(3, 128, 0, 50000), warm(4, 10)], ScanState(), FCFS, SOLO)
    assert [(a.request_id, a.extend_tokens, a.role) for a in step.batch] == [(3, 16384, ChunkRole.INTERMEDIATE)]
    assert step.stop is Reason.CHUNK_STARTED and step.taken_from_queue == (3,)
    assert step.carried == Candidate(3, 128 + 16384, 0, 50000 - 16384, is_chunked=True)


def test_follower_over_the_room_starts_a_page_aligned_chunk() -> None:
    step = form_batch([warm(3, 1000), Candidate(4, 640, 0, 50000)], ScanState(), FCFS, SOLO)
    # room after request 3: 15384 extend tokens, 257 - 17 = 240 pages (239 * 64 = 15296 tokens).
    assert [(a.request_id, a.extend_tokens, a.role) for a in step.batch] == [
        (3, 1000, ChunkRole.WHOLE), (4, 15296 - 0, ChunkRole.INTERMEDIATE)]
    assert (640 + 15296) % 64 == 0 and step.stop is Reason.CHUNK_STARTED


def test_fit_kinds() -> None:
    left = Budget.open(SOLO).charge(16000, 0)  # 384 extend tokens and 257 - 251 = 6 pages left
    assert (left.extend_left, left.pages_left) == (384, 6)
    assert left.fit(320, 0, may_chunk=False) == Fit(FitKind.WHOLE, 320)  # 5 pages + 1 slack
    assert left.fit(500, 0, may_chunk=True) == Fit(FitKind.CHUNK, 320)  # the pages bind before the extend
    assert left.fit(500, 0, may_chunk=False) == Fit(FitKind.NONE, 0)
    assert left.fit(500, 10, may_chunk=True) == Fit(FitKind.CHUNK, 310)  # ends on page boundary 320
    assert Budget.open(BudgetConfig(chunking=False)).fit(20000, 0, may_chunk=True).kind is FitKind.NONE
    assert Budget.open(SOLO).fit(10, 262145, may_chunk=True).kind is FitKind.NONE  # over the cached cap


def test_leader_over_the_cap_without_chunking_is_an_error() -> None:
    cfg = BudgetConfig(chunking=False)
    with pytest.raises(InvalidArgumentError, match="20000 tokens exceeds extend_cap 16384"):
        form_batch([Candidate(1, 0, 0, 20000)], ScanState(), FCFS, cfg)


@pytest.mark.parametrize("staging", [256, 258, 300])
def test_staging_identity_checked_with_mixing(staging: int) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        BudgetConfig(mixing=True, staging_pages=staging)
    msg = str(err.value)
    for number in ("16384", "64", "slack_pages 1", "257", str(staging)):
        assert number in msg, msg


def test_staging_without_mixing_needs_only_room_for_a_full_chunk() -> None:
    assert BudgetConfig(mixing=False, staging_pages=300).staging_pages == 300
    with pytest.raises(InvalidArgumentError, match="staging_pages 200 cannot hold a full chunk"):
        BudgetConfig(mixing=False, staging_pages=200)
    assert BudgetConfig(page_size=16, extend_cap=1024, staging_pages=66, slack_pages=2, mixing=True)


@pytest.mark.parametrize(
    "kwargs,needle",
    [(dict(page_size=0), "page_size"), (dict(extend_cap=-64), "extend_cap"), (dict(cached_cap=-1), "cached_cap"),
     (dict(staging_pages=0), "staging_pages"), (dict(slack_pages=-1), "slack_pages"),
     (dict(mixing="yes"), "mixing"), (dict(extend_cap=1000, staging_pages=300), "extend_cap 1000 is not a multiple")],
)
def test_bad_budget_names_the_field(kwargs: dict, needle: str) -> None:
    with pytest.raises(InvalidArgumentError, match=needle):
        BudgetConfig(**kwargs)
