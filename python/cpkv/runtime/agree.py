"""Cross-rank agreement: one encoding, one collective, one timeout rule, for every digest cpkv checks.

Every rank calls :func:`agree` with its 64-bit digest at the same point of the replicated call
sequence; it returns on every rank when all digests are equal, and otherwise raises
:class:`~cpkv.errors.DivergenceError` on every rank, naming which ranks hold which digest. A peer
that died or stalled is :class:`~cpkv.errors.CollectiveTimeoutError` within ``timeout_s``.

The encoding keeps all 64 bits in ONE MIN all-reduce of two int64 words: the unsigned digest
``d`` is biased to ``s = d - 2**63`` (order-preserving, always an int64), and the second word is
``~s`` (bitwise not, ``-s - 1``, never overflows). ``MIN(~s) == ~MAX(s)``, so one MIN gives the
lowest and the highest digest exactly; they are equal only when every rank's is. Earlier
encodings each lost something: ``d >> 1`` dropped the bottom bit, ``[d, -d]`` needed ``d < 2**63``
(the top bit), and MIN over 32-bit halves reported a "lowest" and "highest" mixed from different
ranks. On a disagreement (every rank sees the same bounds, so every rank takes that branch) one
all-gather names each rank's digest.

Users: :meth:`cpkv.tier.CacheController.check_agreement` (the cache's digest every
``check_every`` forwards), the compose groups' plan agreement (:mod:`cpkv.compose.groups.base`)
and the SGLang backend's index check (its own checker thread and gloo group, every
``cpkv_check_every`` stores).

:func:`all_reduce_min` is the collective under it, the same timeout rule for any host int64 MIN
(the controller's commit frontier).
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

from cpkv.errors import ArgumentTypeError, DivergenceError, InvalidArgumentError
from cpkv.runtime.timeouts import as_timedelta, guarded

_BIAS = 1 << 63
_SPAN = 1 << 64


def _checked_digest(digest: Any) -> int:
    """``digest`` as an int in ``[0, 2**64)``; a typed error naming it otherwise."""
    if isinstance(digest, bool):
        raise ArgumentTypeError(f"digest must be an int in [0, 2**64), got {digest!r}")
    try:
        value = operator.index(digest)
    except TypeError:
        raise ArgumentTypeError(f"digest must be an int in [0, 2**64), got {digest!r}") from None
    if not 0 <= value < _SPAN:
        raise InvalidArgumentError(f"digest must be an int in [0, 2**64), got {value}")
    return value


def encode(digest: int) -> tuple[int, int]:
    """The two int64 words a rank contributes: ``(d - 2**63, ~(d - 2**63))``."""
    biased = _checked_digest(digest) - _BIAS
    return biased, ~biased


def decode(reduced: Sequence[int]) -> tuple[int, int]:
    """The element-wise MIN of every rank's :func:`encode` as ``(lowest, highest)`` digest."""
    low_biased, not_high_biased = (int(v) for v in reduced)
    return low_biased + _BIAS, ~not_high_biased + _BIAS


def all_reduce_min(values: Sequence[int], *, group: Any, rank: int, step: str, timeout_s: float) -> list[int]:
    """C over ``group`` (gloo): the element-wise MIN of every rank's int64 ``values``.

    Host tensors only (no device sync). Bounded by ``timeout_s`` whatever the group's own timeout;
    a peer that died or stalled is :class:`~cpkv.errors.CollectiveTimeoutError` naming ``step``.
    """
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(list(values), dtype=torch.int64)
    timeout = as_timedelta(timeout_s)

    def reduce() -> None:
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group, async_op=True)
        work.wait(timeout)

    guarded(step, rank, None, timeout_s, reduce)
    return [int(v) for v in tensor.tolist()]


def agree(digest: int, *, group: Any, rank: int, step: str, timeout_s: float) -> None:
    """Collective over ``group``: returns when every rank passed the same 64-bit ``digest``.

    Raises :class:`~cpkv.errors.DivergenceError` on every rank when they differ (the message names
    this rank's digest and which ranks hold which), :class:`~cpkv.errors.CollectiveTimeoutError`
    when a peer died or stalled (within ``timeout_s``), and, before any collective, a typed
    :class:`~cpkv.errors.InvalidArgumentError` for a digest outside ``[0, 2**64)``. ``step`` says
    what is agreed and when (``"digest check at forward 16"``); ``rank`` is this rank's number in
    ``group``, for the messages.
    """
    mine = _checked_digest(digest)
    lowest, highest = decode(all_reduce_min(encode(mine), group=group, rank=rank, step=step, timeout_s=timeout_s))
    if lowest == highest:
        return
    held = _who_holds_what(mine, group=group, rank=rank, step=step, timeout_s=timeout_s)
    raise DivergenceError(f"rank {rank}: {step}: the ranks hold different digests: this rank's is {mine:016x}; "
                          f"{held}")


def _who_holds_what(mine: int, *, group: Any, rank: int, step: str, timeout_s: float) -> str:
    """C (every rank saw the same bounds, so every rank issues it): each rank's digest, grouped."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    timeout = as_timedelta(timeout_s)

    def gather() -> None:
        dist.all_gather(gathered, torch.tensor([mine - _BIAS], dtype=torch.int64), group=group,
                        async_op=True).wait(timeout)

    guarded(f"{step} (naming the digests)", rank, None, timeout_s, gather)
    by_digest: dict[int, list[int]] = {}
    for member, word in enumerate(gathered):
        by_digest.setdefault(int(word[0]) + _BIAS, []).append(member)
    return "; ".join(f"ranks {members} hold {d:016x}" for d, members in sorted(by_digest.items()))
