"""cpkv.runtime.agree: one 64-bit digest agreement across real gloo ranks.

The encoding is checked against a plain reference (the MIN all-reduce is an element-wise min over
the ranks' words); the protocol in real processes: equal digests pass, one rank apart fails on every
rank naming both digests, a digest apart only in its top or its bottom bit is caught (each of the
earlier encodings missed one of them), and a stalled peer is a typed timeout within the bound.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpkv.errors import ArgumentTypeError, CollectiveTimeoutError, DivergenceError, InvalidArgumentError
from cpkv.runtime.agree import agree, decode, encode
from cpkv.runtime.launch import run_ranks

U64 = st.integers(min_value=0, max_value=2**64 - 1)
EDGES = [0, 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


@given(st.lists(U64 | st.sampled_from(EDGES), min_size=1, max_size=9))
def test_one_min_of_the_encoded_words_is_the_lowest_and_highest_digest(digests):
    words = [encode(d) for d in digests]
    assert all(-(2**63) <= w < 2**63 for pair in words for w in pair)  # each word is an int64
    reduced = [min(column) for column in zip(*words)]  # what MIN all-reduce computes
    assert decode(reduced) == (min(digests), max(digests))


@pytest.mark.parametrize("bit", [0, 63])
def test_a_digest_apart_in_one_bit_is_seen(bit):
    base = 0x0123_4567_89AB_CDEF
    other = base ^ (1 << bit)
    reduced = [min(column) for column in zip(encode(base), encode(other))]
    low, high = decode(reduced)
    assert low != high and {low, high} == {base, other}


@pytest.mark.parametrize("bad, error", [(-1, InvalidArgumentError), (2**64, InvalidArgumentError),
                                        (1.0, ArgumentTypeError), (True, ArgumentTypeError),
                                        ("7", ArgumentTypeError), (None, ArgumentTypeError)])
def test_a_digest_that_is_no_u64_is_refused_before_any_collective(bad, error):
    # No process group exists here: a refusal must come before the all-reduce is attempted.
    with pytest.raises(error, match="digest must be an int in \\[0, 2\\*\\*64\\)"):
        agree(bad, group=None, rank=0, step="test", timeout_s=1.0)


def _agree_worker(rank: int, world: int, digests: list[int]) -> str:
    try:
        for step in range(3):  # the group stays usable: agreement after agreement
            agree(digests[rank] if step == 2 else digests[0], group=None, rank=rank,
                  step=f"digest check {step}", timeout_s=20.0)
        return "agreed"
    except DivergenceError as err:
        return f"DivergenceError: {err}"


@pytest.mark.timeout(120)
def test_equal_digests_agree_on_every_rank_including_the_extremes():
    for digest in (0, 2**64 - 1, 2**63):
        assert run_ranks(_agree_worker, 3, [digest] * 3, timeout_s=90) == ["agreed"] * 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("differs", ["one rank, anywhere", "top bit only", "bottom bit only"])
def test_one_divergent_digest_is_a_divergence_error_on_every_rank_naming_both(differs):
    base = 0x8000_0000_0000_0001 if differs != "one rank, anywhere" else 0x1234
    odd = {"one rank, anywhere": 0xFEDC_BA98_7654_3210, "top bit only": base ^ (1 << 63),
           "bottom bit only": base ^ 1}[differs]
    digests = [base, odd, base]
    results = run_ranks(_agree_worker, 3, digests, timeout_s=90)
    for rank, text in enumerate(results):
        assert text.startswith(f"DivergenceError: rank {rank}: digest check 2: the ranks hold different digests: "
                               f"this rank's is {digests[rank]:016x}; "), text
        assert f"ranks [0, 2] hold {base:016x}" in text and f"ranks [1] hold {odd:016x}" in text


def _stalled_peer_worker(rank: int, world: int, timeout_s: float) -> dict:
    import torch.distributed as dist

    # A second group only to let the stalled rank go once rank 0 is done (no clock in the test).
    release = dist.new_group(backend="gloo")
    if rank == 1:
        dist.barrier(group=release)  # stalls: never joins the agreement
        return {}
    started = time.monotonic()
    try:
        agree(7, group=None, rank=rank, step="digest check at forward 16", timeout_s=timeout_s)
        outcome = {"error": None}
    except CollectiveTimeoutError as err:
        outcome = {"error": str(err)}
    outcome["elapsed"] = time.monotonic() - started
    dist.barrier(group=release)
    return outcome


@pytest.mark.timeout(120)
def test_a_stalled_peer_is_a_collective_timeout_error_within_the_bound():
    timeout_s = 2.0
    # The process group's own timeout is 60 s: the bound that holds is agree's.
    result = run_ranks(_stalled_peer_worker, 2, timeout_s, timeout_s=100, collective_timeout_s=60)[0]
    assert result["error"] is not None, result
    assert result["error"].startswith(
        f"rank 0: digest check at forward 16 did not complete within {timeout_s:g} s (a peer died or stalled)"), result
    assert 0.9 * timeout_s <= result["elapsed"] < timeout_s + 10, result
