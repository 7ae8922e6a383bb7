"""Chunked-prefill budgeting: what one forward may hold.

Three caps bound a batch: extend tokens (the chunk size), cached prefix tokens
(what the forward must read back), and staging pages (the buffer the extend
writes into, sized by the pages actually written). Every admitted request
charges all three; a chunked request charges its true carried prefix -- the
cached match plus every chunk already computed -- never 0, or the requests
mixed in after it overrun the cached-token cap.

The batch leader is always admitted (its extend is cut to a chunk that fits);
the caps bound what joins it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling._validate import flag, non_negative_int, positive_int


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """The caps of one forward.

    ``staging_pages`` is the staging buffer; each request charges
    ``ceil(extend / page_size) + slack_pages`` of it (the slack covers an extend
    that starts mid-page). ``mixing`` admits requests after a chunked one while
    the caps allow. With mixing on, the staging identity
    ``extend_cap / page_size + slack_pages == staging_pages`` must hold: a full
    chunk then fills the buffer exactly as it fills the extend cap, so the two
    caps describe the same room and neither silently shadows the other.
    """

    page_size: int = 64
    extend_cap: int = 16384
    cached_cap: int = 262144
    staging_pages: int = 257
    slack_pages: int = 1
    mixing: bool = False
    chunking: bool = True

    def __post_init__(self) -> None:
        for name in ("page_size", "extend_cap", "cached_cap", "staging_pages"):
            positive_int("BudgetConfig", name, getattr(self, name))
        non_negative_int("BudgetConfig", "slack_pages", self.slack_pages)
        flag("BudgetConfig", "mixing", self.mixing)
        flag("BudgetConfig", "chunking", self.chunking)
        if self.extend_cap % self.page_size:
            raise InvalidArgumentError(
                f"BudgetConfig.extend_cap {self.extend_cap} is not a multiple of page_size {self.page_size}"
            )
        full_chunk = self.extend_cap // self.page_size + self.slack_pages
        if self.mixing and full_chunk != self.staging_pages:
            raise InvalidArgumentError(
                f"staging identity broken with mixing on: extend_cap {self.extend_cap} / page_size "
                f"{self.page_size} + slack_pages {self.slack_pages} = {full_chunk} != staging_pages "
                f"{self.staging_pages}"
            )
        if full_chunk > self.staging_pages:
            raise InvalidArgumentError(
                f"staging_pages {self.staging_pages} cannot hold a full chunk: extend_cap {self.extend_cap} / "
                f"page_size {self.page_size} + slack_pages {self.slack_pages} = {full_chunk}"
            )

    def pages_for(self, extend_tokens: int) -> int:
        """Staging pages one request's extend charges."""
        return ceil_div(extend_tokens, self.page_size) + self.slack_pages


class FitKind(Enum):
    WHOLE = "whole"  # the whole remaining extend fits
    CHUNK = "chunk"  # a page-aligned chunk of it fits; the request continues next pass
    NONE = "none"  # nothing of it fits


@dataclass(frozen=True, slots=True)
class Fit:
    kind: FitKind
    extend_tokens: int  # the tokens this pass computes (0 for NONE)


@dataclass(frozen=True, slots=True)
class Budget:
    """What is left of the caps in the batch being formed."""

    config: BudgetConfig
    extend_left: int
    cached_left: int
    pages_left: int

    @staticmethod
    def open(config: BudgetConfig) -> Budget:
        return Budget(config, config.extend_cap, config.cached_cap, config.staging_pages)

    @property
    def exhausted(self) -> bool:
        """No extend token or no page with room for one: the scan can end."""
        return self.extend_left == 0 or self.pages_left <= self.config.slack_pages

    def charge(self, extend_tokens: int, cached_tokens: int) -> Budget:
        """The budget after admitting a request. The leader may exceed a cap
        (it is always admitted); what is left then clamps at 0."""
        return replace(
            self,
            extend_left=max(0, self.extend_left - extend_tokens),
            cached_left=max(0, self.cached_left - cached_tokens),
            pages_left=max(0, self.pages_left - self.config.pages_for(extend_tokens)),
        )

    def fit(self, extend_tokens: int, cached_tokens: int, *, may_chunk: bool) -> Fit:
        """How much of a request fits: whole, a chunk (when allowed), or none.

        A chunk ends on a page boundary of the request (prefix + chunk is a
        page multiple) so its next pass can still mix; a chunk that cannot
        end on one is not started.
        """
        cfg = self.config
        if cached_tokens > self.cached_left:
            return Fit(FitKind.NONE, 0)
        if extend_tokens <= self.extend_left and cfg.pages_for(extend_tokens) <= self.pages_left:
            return Fit(FitKind.WHOLE, extend_tokens)
        if not (may_chunk and cfg.chunking):
            return Fit(FitKind.NONE, 0)
        room = min(self.extend_left, (self.pages_left - cfg.slack_pages) * cfg.page_size)
        chunk = chunk_tokens(cached_tokens, room, cfg.page_size)
        if chunk == 0:
            return Fit(FitKind.NONE, 0)
        return Fit(FitKind.CHUNK, chunk)


def chunk_tokens(prefix_tokens: int, room: int, page_size: int) -> int:
    """The largest chunk <= room that ends on a page boundary (0 if none)."""
    end = (prefix_tokens + room) // page_size * page_size
    return max(0, end - prefix_tokens)


def lead_fit(config: BudgetConfig, extend_tokens: int, prefix_tokens: int) -> Fit:
    """The leader's share: all of it, or a chunk of the extend cap.

    The leader ignores the cached cap (it is always admitted). The chunk ends
    on a page boundary of the request; one always lies within the cap, since
    the cap is a page multiple.
    """
    non_negative_int("lead_fit", "extend_tokens", extend_tokens)
    non_negative_int("lead_fit", "prefix_tokens", prefix_tokens)
    if extend_tokens <= config.extend_cap:
        return Fit(FitKind.WHOLE, extend_tokens)
    if not config.chunking:
        raise InvalidArgumentError(
            f"extend of {extend_tokens} tokens exceeds extend_cap {config.extend_cap} and chunking is off"
        )
    return Fit(FitKind.CHUNK, chunk_tokens(prefix_tokens, config.extend_cap, config.page_size))
