"""The backup floor rule: which of a request's pages a forward backs up.

After a forward the engine copies the request's newly computed KV pages to
the host pool. An intermediate chunk backs up only up to its last page
boundary -- its partial last page is still being filled and the next chunk
completes it. The final chunk backs up its whole tail, partial page included.
The caller says which it is (``is_final``, set for this step by the scan);
nothing here reads a counter that another phase may already have advanced --
the predecessor lost the tail page of long prompts exactly that way.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling._validate import flag, non_negative_int, positive_int
from cpkv.scheduling.budget import ceil_div


@dataclass(frozen=True, slots=True)
class BackupRange:
    """Tokens ``[start_token, end_token)``, i.e. pages ``first_page ..
    first_page + page_count - 1``; the last page may be partial (final chunk)."""

    start_token: int
    end_token: int
    first_page: int
    page_count: int

    @property
    def empty(self) -> bool:
        return self.page_count == 0


def backup_range(*, backed_up_tokens: int, computed_tokens: int, page_size: int, is_final: bool) -> BackupRange:
    """The range to back up after a forward.

    ``backed_up_tokens``: tokens of this request already in the host pool (a
    page boundary: every earlier backup ended on one). ``computed_tokens``:
    tokens whose KV exists after this forward (carried prefix + this chunk).
    """
    non_negative_int("backup_range", "backed_up_tokens", backed_up_tokens)
    non_negative_int("backup_range", "computed_tokens", computed_tokens)
    positive_int("backup_range", "page_size", page_size)
    flag("backup_range", "is_final", is_final)
    if backed_up_tokens % page_size:
        raise InvalidArgumentError(
            f"backed_up_tokens {backed_up_tokens} is not on a page boundary (page_size {page_size})"
        )
    if backed_up_tokens > computed_tokens:
        raise InvalidArgumentError(
            f"backed_up_tokens {backed_up_tokens} exceeds computed_tokens {computed_tokens}"
        )
    end = computed_tokens if is_final else computed_tokens // page_size * page_size
    end = max(end, backed_up_tokens)
    return BackupRange(
        start_token=backed_up_tokens,
        end_token=end,
        first_page=backed_up_tokens // page_size,
        page_count=ceil_div(end - backed_up_tokens, page_size),
    )
