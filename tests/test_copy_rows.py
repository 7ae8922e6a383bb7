"""The native row copy (``cpkv._cpkv.copy_rows``, crate ``cpkv-copy``) against a torch reference.

Byte-exact for uint8, bf16 and fp8 buffers (NaN bit patterns included), through numpy and
torch, with a plain list of sources and a ``RowSources``; every kind of bad table or buffer is
refused with ``CopyTableError`` before a byte of ``out`` changes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compose_reference import DTYPES, random_rows
from cpkv._cpkv import RowSources, copy_rows, row_runs
from cpkv.errors import CopyTableError, InvalidArgumentError


def reference(out: torch.Tensor, sources: list[torch.Tensor], runs: np.ndarray) -> torch.Tensor:
    """One row at a time on uint8 views, in table order."""
    want = as_bytes(out.clone())
    raw = [as_bytes(s) for s in sources]
    for dst, dst_stride, count, source, src, src_stride in runs.tolist():
        for k in range(count):
            want[dst + k * dst_stride] = raw[source][src + k * src_stride]
    return want


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).reshape(t.shape[0], t[0:1].view(torch.uint8).numel())


def table(*runs: tuple[int, ...]) -> np.ndarray:
    return np.array(runs, dtype=np.int64).reshape(-1, 6)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("checked_once", [False, True])
def test_byte_exact_against_torch(dtype, checked_once):
    gen = torch.Generator().manual_seed(len(dtype))
    page = (3, 8)
    sources = [random_rows(gen, rows, page, DTYPES[dtype]) for rows in (9, 4, 1)]
    out = random_rows(gen, 12, page, DTYPES[dtype])
    runs = table(
        (0, 1, 3, 0, 2, 1),  # a contiguous stretch
        (3, 2, 4, 1, 0, 1),  # strided destination (a cp = 2 gather)
        (4, 2, 3, 0, 0, 3),  # strided both sides
        (11, 1, 1, 2, 0, 1),  # a one-row run
        (10, 1, 0, 7, 99, 1),  # no rows: names nothing (not even a real source)
        (1, 4, 2, 2, 0, 0),  # stride 0: one row repeated (the dummy row)
    )
    want = reference(out, sources, runs)
    copy_rows(out, RowSources(sources) if checked_once else sources, runs)
    assert torch.equal(as_bytes(out), want)


def test_numpy_buffers_and_overlapping_reads():
    src = np.arange(5 * 16, dtype=np.uint8).reshape(5, 16)
    out = np.zeros((8, 16), dtype=np.uint8)
    # Every run reads source row 2 (reads may overlap freely; only writes must not).
    runs = table((0, 1, 1, 0, 2, 1), (1, 3, 2, 0, 2, 0), (7, 1, 1, 0, 1, 1), (5, 1, 2, 0, 2, 1))
    copy_rows(out, [src], runs)
    want = np.zeros_like(out)
    for dst, src_row in ((0, 2), (1, 2), (4, 2), (7, 1), (5, 2), (6, 3)):
        want[dst] = src[src_row]
    assert np.array_equal(out, want)


def test_empty_tables_and_empty_buffers():
    out = torch.full((4, 8), 7, dtype=torch.uint8)
    copy_rows(out, [torch.zeros(3, 8, dtype=torch.uint8)], table())
    copy_rows(out, [], np.zeros((0, 6), dtype=np.int64))
    copy_rows(torch.empty(0, 8, dtype=torch.uint8), [torch.zeros(0, 8, dtype=torch.uint8)], table())
    assert torch.equal(out, torch.full((4, 8), 7, dtype=torch.uint8))


def test_a_later_bad_run_writes_nothing():
    out = torch.full((4, 8), 7, dtype=torch.uint8)
    src = torch.zeros(3, 8, dtype=torch.uint8)
    with pytest.raises(CopyTableError, match="run 1 reaches source row 3"):
        copy_rows(out, [src], table((0, 1, 2, 0, 0, 1), (2, 1, 2, 0, 2, 1)))
    assert torch.equal(out, torch.full((4, 8), 7, dtype=torch.uint8))


BAD_RUNS = {
    "destination row past the end": (table((3, 1, 2, 0, 0, 1)), "destination row 4"),
    "source row past the end": (table((0, 1, 1, 0, 3, 1)), "source row 3"),
    "strided past the end": (table((0, 2, 3, 0, 0, 1)), "destination row 4"),
    "unknown source": (table((0, 1, 1, 2, 0, 1)), "reads source 2"),
    "negative entry": (table((0, 1, 1, 0, -1, 1)), "negative"),
    "zero dst stride": (table((0, 0, 2, 0, 0, 1)), "dst_stride 0"),
    "int32 table": (table((0, 1, 1, 0, 0, 1)).astype(np.int32), "int64"),
    "float table": (table((0, 1, 1, 0, 0, 1)).astype(np.float64), "int64"),
    "five columns": (np.zeros((1, 5), dtype=np.int64), "6 columns"),
    "one dimension": (np.zeros(6, dtype=np.int64), "int64"),
    "a list": ([[0, 1, 1, 0, 0, 1]], "numpy array"),
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_bad_tables_are_refused_before_any_write(case):
    runs, message = BAD_RUNS[case]
    out = torch.full((4, 8), 7, dtype=torch.uint8)
    sources = [torch.zeros(3, 8, dtype=torch.uint8), torch.zeros(2, 8, dtype=torch.uint8)]
    with pytest.raises(CopyTableError, match=message):
        copy_rows(out, sources, runs)
    assert torch.equal(out, torch.full((4, 8), 7, dtype=torch.uint8))


class _OnlyDataPtr:
    """Has a tensor's ``data_ptr`` and nothing else."""

    def data_ptr(self) -> int:
        return 0


class _ShapelessTensor(_OnlyDataPtr):
    """Looks like a CPU tensor except that its ``shape`` is no tuple."""

    is_cpu = True
    shape = "8 rows"

    def is_contiguous(self) -> bool:
        return True


class _HugeTensor(_ShapelessTensor):
    """Looks like a CPU uint8 tensor whose shape has more bytes than a machine can address."""

    shape = (1 << 40, 1 << 40)
    dtype = torch.uint8

    def element_size(self) -> int:
        return 1


def _misaligned_int16() -> np.ndarray:
    return np.frombuffer(bytearray(66), dtype=np.int16, count=32, offset=1).reshape(4, 8)


def test_bad_buffers_are_refused_before_any_write():
    runs = table((0, 1, 1, 0, 0, 1))
    out = torch.full((4, 8), 7, dtype=torch.uint8)
    good = torch.zeros(3, 8, dtype=torch.uint8)
    cases = [
        (out, [torch.zeros(3, 4, dtype=torch.uint8)], "source 0 has rows of 4 bytes"),
        (out, [torch.zeros(3, 4, dtype=torch.int16)], "8 bytes of i2, out has rows of 8 bytes of u1"),
        (out, [torch.zeros(3, 16, dtype=torch.uint8)[:, ::2]], "contiguous"),
        (out, [good, torch.zeros(3, 9, dtype=torch.uint8)], "source 1 has rows of 9"),
        (out, [good.numpy()[:, ::2]], "C-contiguous"),
        (out, [torch.zeros(3, 8, dtype=torch.uint8, device="meta")], "on meta"),
        (out, [torch.tensor(3, dtype=torch.uint8)], "at least one dimension"),
        (out, [b"\0" * 24], "numpy array or a CPU torch tensor"),
        (out, [_OnlyDataPtr()], "numpy array or a CPU torch tensor"),
        (out, [_ShapelessTensor()], "shape that is not a tuple"),
        (out, [_HugeTensor()], "size in bytes overflows"),
        (out, [torch.zeros(3, 4, dtype=torch.bfloat16)], "8 bytes of bfloat16, out has rows of 8 bytes of u1"),
        (out, good, "list or tuple"),
        (out, [out[2:]], "overlaps out"),
    ]
    for target, sources, message in cases:
        with pytest.raises(CopyTableError, match=message):
            copy_rows(target, sources, runs)
        assert torch.equal(out, torch.full((4, 8), 7, dtype=torch.uint8))
    read_only = np.full((4, 8), 7, dtype=np.uint8)
    read_only.setflags(write=False)
    with pytest.raises(CopyTableError, match="read-only"):
        copy_rows(read_only, [good.numpy()], runs)
    misaligned = _misaligned_int16()
    with pytest.raises(CopyTableError, match="not aligned"):
        copy_rows(np.zeros((4, 8), dtype=np.int16), [misaligned], runs)
    with pytest.raises(CopyTableError, match="not aligned"):
        RowSources([misaligned])
    assert issubclass(CopyTableError, InvalidArgumentError)


def test_row_sources_is_checked_once_and_describes_itself():
    sources = RowSources([torch.zeros(3, 8, dtype=torch.uint8), np.zeros((5, 8), dtype=np.uint8)])
    assert len(sources) == 2 and sources.rows == [3, 5]
    assert "sources=2" in repr(sources) and "row_bytes=8" in repr(sources)
    with pytest.raises(CopyTableError, match="source 1 has rows"):
        RowSources([torch.zeros(3, 8, dtype=torch.uint8), torch.zeros(3, 8, dtype=torch.int64)])
    for _ in range(2):  # the second time, both dtypes are known by identity
        with pytest.raises(CopyTableError, match="8 bytes of f2, source 0 of 8 bytes of bfloat16"):
            RowSources([torch.zeros(3, 4, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.float16)])


def test_row_runs_merges_constant_steps_and_refuses_bad_rows():
    runs = row_runs(np.array([0, 2, 4, 5, 9]), np.array([10, 11, 12, 20, 3]))
    assert runs.tolist() == [[0, 2, 3, 0, 10, 1], [5, 1, 1, 0, 20, 1], [9, 1, 1, 0, 3, 1]]
    assert row_runs(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).shape == (0, 6)
    with pytest.raises(CopyTableError, match="negative"):
        row_runs(np.array([0, -1]), np.array([0, 1]))
    with pytest.raises(CopyTableError, match="differ in length"):
        row_runs(np.array([0, 1]), np.array([0]))
    with pytest.raises(CopyTableError, match="int64"):
        row_runs(np.array([0, 1], dtype=np.int32), np.array([0, 1]))


@st.composite
def copies(draw):
    row_bytes = draw(st.integers(1, 24))
    source_rows = draw(st.lists(st.integers(0, 12), min_size=1, max_size=4))
    dst_rows = draw(st.integers(0, 16))
    runs = draw(st.lists(st.tuples(st.integers(0, 17), st.integers(0, 3), st.integers(0, 5),
                                   st.integers(0, len(source_rows)), st.integers(0, 13), st.integers(0, 3)),
                         max_size=10))
    return row_bytes, source_rows, dst_rows, runs


@settings(max_examples=150, deadline=None)
@given(copies())
def test_any_table_copies_like_the_reference_or_is_refused_untouched(case):
    row_bytes, source_rows, dst_rows, runs = case
    gen = torch.Generator().manual_seed(row_bytes)
    sources = [torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8, generator=gen) for n in source_rows]
    out = torch.randint(0, 256, (dst_rows, row_bytes), dtype=torch.uint8, generator=gen)
    before = out.clone()
    fits = all(
        count == 0 or (source < len(sources) and not (dst_stride == 0 and count > 1)
                       and dst + (count - 1) * dst_stride < dst_rows
                       and src + (count - 1) * src_stride < source_rows[source])
        for dst, dst_stride, count, source, src, src_stride in runs
    )
    run_table = table(*runs)
    if fits:
        want = reference(out, sources, run_table)
        copy_rows(out, sources, run_table)
        assert torch.equal(as_bytes(out), want)
    else:
        with pytest.raises(CopyTableError):
            copy_rows(out, sources, run_table)
        assert torch.equal(out, before)


@pytest.mark.parametrize("stores", [None, "cached", "streaming"])
@pytest.mark.parametrize("row_bytes", [4, 100, 4096 + 24])
def test_both_kinds_of_stores_are_byte_exact_at_any_alignment(stores, row_bytes):
    """Streaming stores write 16-byte-aligned 64-byte blocks and ordinary stores around them:
    rows that start off a 16-byte boundary (`out` one byte into its buffer) and lengths that
    leave heads and tails must still come out exact, with the byte before `out` untouched."""
    gen = torch.Generator().manual_seed(row_bytes)
    sources = [random_rows(gen, rows, (row_bytes,), torch.uint8) for rows in (7, 5)]
    backing = random_rows(gen, 1, (10 * row_bytes + 1,), torch.uint8).reshape(-1)
    guard = int(backing[0])
    out = backing[1:].view(10, row_bytes)
    runs = table((0, 1, 4, 0, 1, 1), (4, 2, 3, 1, 0, 1), (9, 1, 1, 0, 6, 0), (5, 2, 2, 1, 3, 1))
    want = reference(out, sources, runs)
    copy_rows(out, sources, runs, stores)
    assert torch.equal(out, want)
    assert int(backing[0]) == guard


def test_a_table_past_the_streaming_threshold_is_exact():
    """Chosen by size: a gather moving more than `streaming_threshold()` bytes streams."""
    from cpkv._cpkv import streaming_threshold

    row_bytes = 32768
    rows = streaming_threshold() // row_bytes + 8
    src = np.random.default_rng(5).integers(0, 256, (rows, row_bytes), dtype=np.uint8)
    out = np.zeros((rows, row_bytes), dtype=np.uint8)
    half = rows // 2
    copy_rows(out, [src], table((0, 2, half, 0, 0, 1), (1, 2, rows - half, 0, half, 1)))
    assert np.array_equal(out[0::2], src[:half]) and np.array_equal(out[1::2], src[half:])


@pytest.mark.parametrize("stores", ["fast", "", 1, b"cached", "Cached"])
def test_an_unknown_kind_of_stores_is_refused_and_nothing_is_written(stores):
    out = np.full((2, 8), 9, dtype=np.uint8)
    with pytest.raises(InvalidArgumentError, match="stores must be None, 'cached' or 'streaming'"):
        copy_rows(out, [np.zeros((2, 8), dtype=np.uint8)], table((0, 1, 2, 0, 0, 1)), stores)
    assert (out == 9).all()


def test_gather_runs_writes_numpy_and_tensor_targets_alike_from_any_table_form():
    """``gather_runs`` (what the compose groups call) takes a numpy ``out`` as the cheaper target
    and a run table as an int64 array (passed as it is), a strided or int32 array, or a list."""
    from cpkv.kernels.gather import as_run_table, gather_runs

    gen = torch.Generator().manual_seed(5)
    sources = [random_rows(gen, 6, (16,), torch.uint8) for _ in range(4)]
    runs = table((0, 4, 2, 0, 1, 1), (1, 4, 2, 1, 0, 1), (2, 4, 2, 2, 3, 1), (3, 4, 1, 3, 5, 1), (7, 1, 1, 0, 0, 0))
    want = reference(torch.zeros(8, 16, dtype=torch.uint8), sources, runs)
    assert as_run_table(runs) is runs
    strided = np.repeat(runs, 2, axis=0)[::2]
    for form in (runs, strided, runs.astype(np.int32), runs.tolist()):
        tensor = gather_runs(torch.zeros(8, 16, dtype=torch.uint8), RowSources(sources), form)
        array = gather_runs(np.zeros((8, 16), dtype=np.uint8), RowSources(sources), form)
        assert torch.equal(tensor, want) and np.array_equal(array, want.numpy())
    with pytest.raises(CopyTableError, match="reaches destination row 8"):
        gather_runs(np.zeros((8, 16), dtype=np.uint8), sources, table((7, 1, 2, 0, 0, 1)))
