"""The L3 store's native batch I/O (``cpkv._cpkv.l3_write_records`` / ``l3_read_records``): the bytes
it writes are the records ``l3_seal`` builds (the format is unchanged), chunked runs land at their
offsets, each record read back is checked and copied to its row or rejected with its reason (its row
then holds none of its bytes), I/O errors surface as ``OSError`` and bad arguments as typed errors
that leave the file and the output untouched."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cpkv import _cpkv
from cpkv.errors import InvalidArgumentError

HEADER = _cpkv.L3_HEADER_BYTES
NS = 0x5EED
PAYLOAD = 65536  # several records per 1 MiB chunk, and runs longer than one chunk
SLOT = _cpkv.l3_record_bytes(PAYLOAD)


def payload(key: int, length: int = PAYLOAD) -> np.ndarray:
    return np.random.default_rng(key).integers(0, 256, size=length, dtype=np.uint8)


def sealed(key: int, sequence: int, length: int = PAYLOAD) -> bytes:
    """The reference record, built the old way: payload copied, zero padding, ``l3_seal``."""
    record = np.zeros(_cpkv.l3_record_bytes(length), dtype=np.uint8)
    record[HEADER:HEADER + length] = payload(key, length)
    _cpkv.l3_seal(record, NS, key, sequence, length)
    return record.tobytes()


def scratch(records: int, fill: int = 0xAB) -> np.ndarray:
    return np.full(records * SLOT, fill, dtype=np.uint8)  # junk: every byte of a record must be written


@pytest.fixture
def data_fd(tmp_path):
    fd = os.open(tmp_path / "data.bin", os.O_RDWR | os.O_CREAT, 0o644)
    yield fd
    os.close(fd)


def write(fd: int, runs, keys, sequences, length: int = PAYLOAD) -> None:
    _cpkv.l3_write_records(runs, scratch(len(keys)), SLOT, NS, keys, sequences,
                           [payload(k, length) for k in keys])


def test_written_records_are_the_sealed_records_at_their_runs_offsets(data_fd):
    keys = list(range(1, 41))  # 40 records: the first run spans three chunks
    sequences = [100 + k for k in keys]
    runs = [(data_fd, 0, 0, 33), (data_fd, 50 * SLOT, 33, 34), (data_fd, 40 * SLOT, 34, 40)]
    write(data_fd, runs, keys, sequences)
    at = {k: i for i, k in enumerate(keys[:33])}
    at.update({keys[33]: 50})
    at.update({k: 40 + i for i, k in enumerate(keys[34:])})
    for key, sequence in zip(keys, sequences):
        assert os.pread(data_fd, SLOT, at[key] * SLOT) == sealed(key, sequence), f"record of key {key}"
    assert os.pread(data_fd, SLOT, 36 * SLOT) == b"\0" * SLOT  # a gap no run covers stays a hole


def test_a_short_payload_is_padded_with_zeros(data_fd):
    _cpkv.l3_write_records([(data_fd, 0, 0, 1)], scratch(1), SLOT, NS, [9], [1], [payload(9, 1000)])
    assert os.pread(data_fd, SLOT, 0) == sealed(9, 1, 1000) + b"\0" * (SLOT - _cpkv.l3_record_bytes(1000))


def test_reads_serve_good_records_to_their_rows_and_name_each_bad_one(data_fd):
    keys = list(range(1, 31))
    write(data_fd, [(data_fd, 0, 0, 30)], keys, [1] * 30)
    os.pwrite(data_fd, b"\xff", 7 * SLOT + HEADER + 4000)  # a bit flip in key 8's payload
    os.pwrite(data_fd, b"\x02", 3 * SLOT + 8)  # key 4: another format version
    # Slots 0..29 then two slots past the end of the file (short reads: truncated).
    expect_keys = keys + [31, 32]
    expect_seq = [1] * 30 + [1, 1]
    expect_seq[12] = 2  # key 13: the index expects another placement
    rows = list(reversed(range(32)))
    out = np.full((32, PAYLOAD), 0xEE, dtype=np.uint8)
    reasons = _cpkv.l3_read_records([(data_fd, 0, 0, 32)], scratch(32), SLOT, NS, expect_keys, expect_seq,
                                    PAYLOAD, out.reshape(-1), rows)
    bad = {8: "checksum", 4: "version", 13: "stale_sequence", 31: "truncated", 32: "truncated"}
    for j, key in enumerate(expect_keys):
        assert reasons[j] == bad.get(key), f"key {key}"
        row = out[rows[j]]
        if key in bad:
            # No byte of a rejected record reaches its row: zeroed after a failed checksum, else untouched.
            assert (row == (0 if bad[key] == "checksum" else 0xEE)).all(), f"row of key {key}"
        else:
            assert np.array_equal(row, payload(key)), f"row of key {key}"


def test_runs_read_from_their_offsets_across_chunks(data_fd):
    keys = list(range(1, 21))
    runs = [(data_fd, 5 * SLOT, 0, 17), (data_fd, 30 * SLOT, 17, 20)]
    write(data_fd, runs, keys, [3] * 20)
    out = np.zeros((20, PAYLOAD), dtype=np.uint8)
    reasons = _cpkv.l3_read_records(runs, scratch(20), SLOT, NS, keys, [3] * 20, PAYLOAD, out.reshape(-1),
                                    list(range(20)))
    assert reasons == [None] * 20
    assert all(np.array_equal(out[i], payload(k)) for i, k in enumerate(keys))


def test_a_failed_write_or_read_raises_oserror(tmp_path):
    path = tmp_path / "ro.bin"
    path.write_bytes(b"\0" * SLOT * 4)
    ro = os.open(path, os.O_RDONLY)
    wo = os.open(path, os.O_WRONLY)
    try:
        with pytest.raises(OSError):
            write(ro, [(ro, 0, 0, 3)], [1, 2, 3], [1, 1, 1])
        out = np.zeros(3 * PAYLOAD, dtype=np.uint8)
        with pytest.raises(OSError):
            _cpkv.l3_read_records([(wo, 0, 0, 3)], scratch(3), SLOT, NS, [1, 2, 3], [1, 1, 1], PAYLOAD, out,
                                  [0, 1, 2])
    finally:
        os.close(ro)
        os.close(wo)
    assert path.read_bytes() == b"\0" * SLOT * 4


@pytest.mark.parametrize("runs, match", [
    ([(0, 0, 0, 2)], "the runs cover 2 of 3"),
    ([(0, 0, 1, 3)], r"run \[1, 3\) does not continue"),
    ([(0, 0, 0, 2), (0, 0, 2, 2)], r"run \[2, 2\) does not continue"),
    ([(0, 0, 0, 4)], r"run \[0, 4\) does not continue"),
    ([(-1, 0, 0, 3)], "fd -1 is not a file descriptor"),
    ([(0, 2**63 - SLOT, 0, 3)], "past the largest file offset"),
])
def test_bad_runs_are_refused_before_any_byte_moves(data_fd, runs, match):
    runs = [(data_fd if fd == 0 else fd, off, a, b) for fd, off, a, b in runs]
    with pytest.raises(InvalidArgumentError, match=match):
        write(data_fd, runs, [1, 2, 3], [1, 1, 1])
    out = np.full(3 * PAYLOAD, 7, dtype=np.uint8)
    with pytest.raises(InvalidArgumentError, match=match):
        _cpkv.l3_read_records(runs, scratch(3), SLOT, NS, [1, 2, 3], [1, 1, 1], PAYLOAD, out, [0, 1, 2])
    assert os.fstat(data_fd).st_size == 0 and (out == 7).all()


def test_bad_sizes_are_refused_by_name(data_fd):
    run = [(data_fd, 0, 0, 2)]
    with pytest.raises(InvalidArgumentError, match="scratch holds"):
        _cpkv.l3_write_records(run, scratch(1), SLOT, NS, [1, 2], [1, 1], [payload(1), payload(2)])
    with pytest.raises(InvalidArgumentError, match="payload 1 has 69569 bytes, a record of 69632 bytes holds 69568"):
        _cpkv.l3_write_records(run, scratch(2), SLOT, NS, [1, 2], [1, 1], [payload(1), payload(2, SLOT - HEADER + 1)])
    with pytest.raises(InvalidArgumentError, match="differ in length"):
        _cpkv.l3_write_records(run, scratch(2), SLOT, NS, [1, 2], [1], [payload(1), payload(2)])
    with pytest.raises(InvalidArgumentError, match="not a contiguous"):
        _cpkv.l3_write_records(run, scratch(2), SLOT, NS, [1, 2], [1, 1], [payload(1), payload(2, 2 * PAYLOAD)[::2]])
    with pytest.raises(InvalidArgumentError, match="slot_bytes 10"):
        _cpkv.l3_write_records(run, scratch(2), 10, NS, [1, 2], [1, 1], [payload(1), payload(2)])
    assert os.fstat(data_fd).st_size == 0
    out = np.zeros(2 * PAYLOAD, dtype=np.uint8)
    with pytest.raises(InvalidArgumentError, match="row 2 is outside out"):
        _cpkv.l3_read_records(run, scratch(2), SLOT, NS, [1, 2], [1, 1], PAYLOAD, out, [0, 2])
    with pytest.raises(InvalidArgumentError, match="length 69569 does not fit"):
        _cpkv.l3_read_records(run, scratch(2), SLOT, NS, [1, 2], [1, 1], SLOT - HEADER + 1, out, [0, 1])
    with pytest.raises(InvalidArgumentError, match="scratch holds"):
        _cpkv.l3_read_records(run, scratch(1), SLOT, NS, [1, 2], [1, 1], PAYLOAD, out, [0, 1])
