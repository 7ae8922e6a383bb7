"""The backup floor rule at aligned and unaligned lengths."""

from __future__ import annotations

import pytest

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling import BackupRange, backup_range


@pytest.mark.parametrize(
    "backed,computed,is_final,expected",
    [
        # aligned end: intermediate and final agree
        (0, 1024, False, BackupRange(0, 1024, 0, 16)),
        (0, 1024, True, BackupRange(0, 1024, 0, 16)),
        # unaligned end: the intermediate chunk stops at its last page boundary ...
        (0, 1000, False, BackupRange(0, 960, 0, 15)),
        # ... the final chunk backs up its whole tail, partial page included
        (0, 1000, True, BackupRange(0, 1000, 0, 16)),
        # continuing from an earlier backup
        (960, 2000, False, BackupRange(960, 1984, 15, 16)),
        (960, 2000, True, BackupRange(960, 2000, 15, 17)),
        # less than a page since the last backup: nothing for an intermediate chunk
        (960, 1000, False, BackupRange(960, 960, 15, 0)),
        (960, 1000, True, BackupRange(960, 1000, 15, 1)),
        (0, 0, True, BackupRange(0, 0, 0, 0)),
    ],
)
def test_floor_rule(backed: int, computed: int, is_final: bool, expected: BackupRange) -> None:
    got = backup_range(backed_up_tokens=backed, computed_tokens=computed, page_size=64, is_final=is_final)
    assert got == expected
    assert got.empty == (expected.page_count == 0)


def test_chunks_back_up_every_token_exactly_once() -> None:
    # A 3000-token prompt in chunks of 1000: the tail page is backed up by the final chunk.
    backed, covered = 0, []
    for end, final in ((1000, False), (2000, False), (3000, True)):
        r = backup_range(backed_up_tokens=backed, computed_tokens=end, page_size=64, is_final=final)
        covered.append((r.start_token, r.end_token))
        backed = r.end_token
    assert covered == [(0, 960), (960, 1984), (1984, 3000)]


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(backed_up_tokens=10), "backed_up_tokens 10 is not on a page boundary"),
        (dict(backed_up_tokens=2048), "backed_up_tokens 2048 exceeds computed_tokens 1000"),
        (dict(is_final=None), "is_final must be a bool"),
        (dict(is_final=1), "is_final must be a bool"),
        (dict(page_size=0), "page_size"),
        (dict(computed_tokens=-1), "computed_tokens"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict, needle: str) -> None:
    base = dict(backed_up_tokens=0, computed_tokens=1000, page_size=64, is_final=False)
    with pytest.raises(InvalidArgumentError, match=needle):
        backup_range(**{**base, **kwargs})
