"""Slot spans: the one canonical description of a batch's dense buffer.

Per request, ``prefix`` spans (cached pages, already in their owners' pools)
and ``current`` spans (pages computed in this forward), each a
``(dense slot start, first logical page, page count)`` triple. Both lists are
required: ``None`` is an error and ``[]`` means "none". Nothing else may
describe the same regions, so there is nothing to disagree with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, cast

import numpy as np

from cpkv.errors import SpanError

Span = tuple[int, int, int]


def _span_tuple(kind: str, span: object) -> Span:
    try:
        slot, page, count = cast("Iterable[object]", span)  # not a triple: refused just below
    except (TypeError, ValueError):
        raise SpanError(f"{kind} span {span!r} is not a (slot, page, count) triple") from None
    values = []
    for name, value in (("slot", slot), ("page", page), ("count", count)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise SpanError(f"{kind} span {span!r}: {name} must be an integer, got {value!r}")
        values.append(int(value))
    # Values (signs, counts, bounds) are checked with the batch, where the request can be named.
    return (values[0], values[1], values[2])


@dataclass(frozen=True)
class SlotSpans:
    """One request's prefix and current spans (both required; ``[]`` means none)."""

    prefix: tuple[Span, ...]
    current: tuple[Span, ...]

    def __init__(self, prefix: Iterable[Span] | None, current: Iterable[Span] | None) -> None:
        for kind, spans in (("prefix", prefix), ("current", current)):
            if spans is None:
                raise SpanError(f"{kind} spans are None; pass [] for no {kind} pages")
            if isinstance(spans, (str, bytes)):
                raise SpanError(f"{kind} spans must be a list of (slot, page, count), got {spans!r}")
        # Frozen dataclass: normalised once here, immutable (and hashable) afterwards.
        prefix_spans = tuple(_span_tuple("prefix", s) for s in prefix)  # type: ignore[union-attr]
        current_spans = tuple(_span_tuple("current", s) for s in current)  # type: ignore[union-attr]
        object.__setattr__(self, "prefix", prefix_spans)
        object.__setattr__(self, "current", current_spans)

    @property
    def current_pages(self) -> range:
        """The request's current logical pages, in order (contiguous by validation)."""
        if not self.current:
            return range(0)
        first = self.current[0][1]
        return range(first, first + sum(c for _, _, c in self.current))


def validate_requests(requests: Sequence[SlotSpans], num_slots: int) -> None:
    """Raises :class:`SpanError` naming the request at fault; returns None when the batch is sound."""
    if isinstance(num_slots, bool) or not isinstance(num_slots, (int, np.integer)) or num_slots < 0:
        raise SpanError(f"num_slots must be an integer >= 0, got {num_slots!r}")
    slot_ranges: list[tuple[int, int, int]] = []  # (start, end, request)
    prefix_pages: list[tuple[int, int, int]] = []
    current_pages: list[tuple[int, int, int]] = []
    for index, request in enumerate(requests):
        if not isinstance(request, SlotSpans):
            raise SpanError(f"request {index}: expected SlotSpans, got {type(request).__name__}")
        for kind, spans in (("prefix", request.prefix), ("current", request.current)):
            for slot, page, count in spans:
                if slot < 0 or page < 0:
                    raise SpanError(f"request {index}: {kind} span {(slot, page, count)}: slot and page must be >= 0")
                if count <= 0:
                    # A zero-length span carries nothing and would only hide a mistake.
                    raise SpanError(f"request {index}: {kind} span {(slot, page, count)}: count must be >= 1 "
                                    "(omit empty spans)")
                if slot + count > num_slots:
                    raise SpanError(
                        f"request {index}: {kind} span {(slot, page, count)} covers slots "
                        f"[{slot}, {slot + count}) outside the buffer [0, {num_slots})"
                    )
                slot_ranges.append((slot, slot + count, index))
        _check_current_continues(index, request)
        prefix_pages += [(p, p + c, index) for _, p, c in request.prefix]
        if request.current:
            pages = request.current_pages
            current_pages.append((pages.start, pages.stop, index))
    _check_disjoint("dense slots", slot_ranges)
    # A current page has exactly one writer: it may appear once, and never as a cached page.
    _check_disjoint("current pages", current_pages)
    _check_apart("current pages", current_pages, "prefix pages", prefix_pages)


def _check_current_continues(index: int, request: SlotSpans) -> None:
    expected = request.prefix[-1][1] + request.prefix[-1][2] if request.prefix else None
    for slot, page, count in request.current:
        if expected is not None and page != expected:
            raise SpanError(
                f"request {index}: current span {(slot, page, count)} starts at logical page {page}, "
                f"but the pages before it end at {expected - 1} (expected page {expected})"
            )
        expected = page + count


def _check_disjoint(what: str, ranges: list[tuple[int, int, int]]) -> None:
    if len(ranges) < 2:
        return
    arr = np.array(ranges, dtype=np.int64)
    order = np.lexsort((arr[:, 1], arr[:, 0]))
    arr = arr[order]
    running_end = np.maximum.accumulate(arr[:-1, 1])
    clash = np.nonzero(arr[1:, 0] < running_end)[0]
    if clash.size:
        i = int(clash[0]) + 1
        j = int(np.nonzero(arr[:i, 1] > arr[i, 0])[0][-1])
        a, b = arr[j], arr[i]
        raise SpanError(
            f"request {int(b[2])}: {what} [{b[0]}, {b[1]}) overlap {what} [{a[0]}, {a[1]}) "
            f"of request {int(a[2])}"
        )


def _check_apart(what: str, ranges: list[tuple[int, int, int]], other: str, others: list[tuple[int, int, int]]) -> None:
    if not ranges or not others:
        return
    a = np.array(ranges, dtype=np.int64)
    b = np.array(others, dtype=np.int64)
    # Pairwise over spans (not pages): a batch has few spans.
    hit = (a[:, None, 0] < b[None, :, 1]) & (b[None, :, 0] < a[:, None, 1])
    if hit.any():
        i, j = (int(x[0]) for x in np.nonzero(hit))
        raise SpanError(
            f"request {int(a[i, 2])}: {what} [{a[i, 0]}, {a[i, 1]}) are also {other} "
            f"[{b[j, 0]}, {b[j, 1]}) of request {int(b[j, 2])}"
        )
