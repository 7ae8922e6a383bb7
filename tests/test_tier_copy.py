"""The one tier copy (cpkv.tier.copy) and the one ownership rule (owned_rows) behind it.

Every copy is checked byte for byte against a plain loop over the row pairs, on both of the
helper's paths (the native copy for plain CPU rows, torch's copies for anything else: a strided
view here, a CUDA pool in test_tier_cuda.py), in both directions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv._cpkv import MAX_PAGES, owned_rows, row_runs
from cpkv.errors import ArgumentTypeError, InvalidArgumentError
from cpkv.runtime.layout import CpLayout
from cpkv.tier.copy import MIN_MEAN_RUN, RowCopy, SlabCopier, word_dtype

ROWS = 64


@settings(max_examples=200, deadline=None)
@given(cp=st.integers(1, 5), rank_pick=st.integers(0, 4),
       pairs=st.lists(st.tuples(st.integers(0, 199), st.integers(0, 199)), max_size=50, unique_by=lambda p: p[0]),
       sort=st.booleans())
def test_owned_rows_is_the_modulo_rule_and_its_runs_move_exactly_the_owned_pairs(cp, rank_pick, pairs, sort):
    rank = rank_pick % cp
    if sort:
        pairs = sorted(pairs)
    pages = np.array([p for p, _ in pairs], dtype=np.int64)
    slab = np.array([s for _, s in pairs], dtype=np.int64)
    owned = CpLayout(cp, rank, 16).owned_rows(pages, slab)
    mine = [(p, s) for p, s in pairs if p % cp == rank]
    assert owned.mask.tolist() == [p % cp == rank for p, _ in pairs]
    assert owned.pool_rows.tolist() == [p // cp for p, _ in mine]
    assert owned.slab_rows.tolist() == [s for _, s in mine]
    assert np.array_equal(owned.runs, row_runs(owned.pool_rows, owned.slab_rows))
    # The backup's table is the load's with the sides swapped: the same as compressing the other way.
    copy = RowCopy.owned(owned)
    assert np.array_equal(copy.run_table(to_slab=True), row_runs(owned.slab_rows, owned.pool_rows))


@pytest.mark.parametrize("args, message", [
    ((2, 2, [0], [0]), "rank 2 is not in 0..2"),
    ((0, 0, [0], [0]), "cp_size 0 "),
    ((0, 2, [0, 1], [0]), "slab_rows has 1 rows for 2 pages"),
    ((0, 2, [MAX_PAGES], [0]), f"device page {MAX_PAGES} "),
    ((0, 2, [0], [MAX_PAGES]), f"slab_rows [0] = {MAX_PAGES} "),
    ((0, 2, [-1], [0]), "pages[0] = -1 "),
])
def test_owned_rows_refuses_bad_input_naming_the_value(args, message):
    with pytest.raises(InvalidArgumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        owned_rows(*args)


def test_owned_rows_refuses_a_bool_rank_and_a_str_of_pages():
    with pytest.raises(ArgumentTypeError, match="rank"):
        owned_rows(True, 2, [0], [0])
    with pytest.raises(ArgumentTypeError, match="pages"):
        owned_rows(0, 2, "01", [0, 1])


def test_owned_rows_takes_int_likes_and_iterables_as_the_one_argument_rule_says():
    class Index:
        def __index__(self) -> int:
            return 1

    by_rule = owned_rows(Index(), np.int32(2), range(4), (x for x in [7, 8, 9, 10]))
    plain = owned_rows(1, 2, np.arange(4), np.array([7, 8, 9, 10]))
    for name in ("mask", "pool_rows", "slab_rows", "runs"):
        assert np.array_equal(getattr(by_rule, name), getattr(plain, name))
    assert plain.pool_rows.tolist() == [0, 1] and plain.slab_rows.tolist() == [8, 10]


def _rows_case(rng: np.random.Generator, case: int) -> tuple[np.ndarray, np.ndarray]:
    n = int(rng.integers(1, 40))
    if case % 3 == 0:  # arbitrary rows: usually no runs
        return rng.choice(ROWS, n, replace=False), rng.choice(ROWS, n, replace=False)
    if case % 3 == 1:  # runs at a constant step each, as owned pages of contiguous objects are
        step = int(rng.integers(1, 4))
        return np.arange(n) + 3 * (np.arange(n) // 7), step * np.arange(n) + int(rng.integers(0, 5))
    return rng.choice(ROWS, n, replace=False), int(rng.integers(0, 20)) + rng.permutation(n)  # a permuted object


def _buffers(rng: np.random.Generator, strided: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool and a slab layer of ROWS * 2 rows of 3 words; strided: views of every row's first 3
    of 5 words (no native copy can take them)."""
    width = 5 if strided else 3
    pool = torch.from_numpy(rng.integers(0, 1 << 60, (ROWS * 2, width)))[:, :3]
    slab = torch.from_numpy(rng.integers(0, 1 << 60, (ROWS * 2, width)))[:, :3]
    assert pool.is_contiguous() != strided
    return pool, slab


@pytest.mark.parametrize("strided", [False, True], ids=["native", "torch"])
def test_slab_copier_moves_exactly_the_paired_rows_both_ways(strided):
    rng = np.random.default_rng(5)
    copier = SlabCopier()
    for case in range(300):
        pool_rows, slab_rows = (a.astype(np.int64) for a in _rows_case(rng, case))
        copy = RowCopy(pool_rows, slab_rows)
        n = len(copy)
        if case % 3 == 1 and n >= MIN_MEAN_RUN:
            assert copy.slices(), (pool_rows, slab_rows)  # long constant-step runs take the slice path
        if case % 3 == 2:
            assert len(copy.slab_stretches(torch.device("cpu"))[1]) == 1  # one contiguous object: one stretch
        pool, slab = _buffers(rng, strided)
        want_slab = slab.clone()
        for p, s in zip(pool_rows, slab_rows):
            want_slab[s] = pool[p]
        copier.copy(copy, pool, slab, to_slab=True)
        assert torch.equal(slab, want_slab)
        pool.zero_()
        want_pool = pool.clone()
        for p, s in zip(pool_rows, slab_rows):
            want_pool[p] = slab[s]
        copier.copy(copy, pool, slab, to_slab=False)
        assert torch.equal(pool, want_pool)


def test_merged_copies_move_what_each_would():
    rng = np.random.default_rng(11)
    owned = [RowCopy.owned(owned_rows(1, 2, np.arange(10 * k, 10 * k + 8), np.arange(8) + 30 * k)) for k in range(3)]
    merged = RowCopy.merged(owned)
    assert len(merged) == sum(len(c) for c in owned) == 12
    pool, slab = _buffers(rng, strided=False)
    want = slab.clone()
    copier = SlabCopier()
    for c in owned:
        copier.copy(c, pool, want, to_slab=True)
    copier.copy(merged, pool, slab, to_slab=True)
    assert torch.equal(slab, want)


def test_word_dtype_is_the_widest_word_every_view_allows():
    rows = torch.zeros((4, 24), dtype=torch.uint8)
    assert word_dtype(rows) == torch.int64
    assert word_dtype(rows, rows[:, :12]) == torch.int32  # a 12-byte row
    assert word_dtype(rows[1:, :8]) == torch.int64  # 8 bytes in, every row 24 bytes apart
    assert word_dtype(rows[:, 1:9]) == torch.uint8  # one byte in: no wider word is aligned
    assert word_dtype(torch.zeros((4, 7), dtype=torch.uint8)) == torch.uint8
