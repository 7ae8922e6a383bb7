"""``load_trace`` refuses every malformed trace with a typed one-line error naming path and line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc

import pytest

from cpkv.errors import CpkvError, CpkvValueError, InvalidArgumentError, TraceError
from cpkv.traces import MAX_BLOCK_ID, MAX_LINE_BYTES, TraceRequest, block_tokens, load_trace


def rec(ts=9, inp=1000, out=10, ids=None, **extra):
    r = {"timestamp": ts, "input_length": inp, "output_length": out,
         "hash_ids": [0, 1] if ids is None else ids}
    r.update(extra)
    return json.dumps(r)


GOOD = [rec(0, 1000, 10, [0, 1]), rec(5, 1024, 3, [0, 1]), rec(5, 1025, 0, [0, 1, 2]), rec(9, 300, 1, [3])]


def write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_good_trace_loads_with_limit_and_blank_lines(tmp_path):
    path = write(tmp_path, [GOOD[0], "", "   ", *GOOD[1:]])
    reqs = load_trace(path)
    assert reqs[0] == TraceRequest(0, 1000, 10, (0, 1))
    assert [r.hash_ids for r in reqs] == [(0, 1), (0, 1), (0, 1, 2), (3,)]
    assert load_trace(str(path), limit=2) == reqs[:2]


def test_records_past_the_limit_are_not_read(tmp_path):
    path = write(tmp_path, [GOOD[0], "{not json"])
    assert len(load_trace(path, limit=1)) == 1
    with pytest.raises(TraceError, match=":2:"):
        load_trace(path)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_limit(tmp_path, limit):
    with pytest.raises(InvalidArgumentError):
        load_trace(write(tmp_path, GOOD), limit=limit)


def check(exc: TraceError, path, line: int | None) -> None:
    msg = str(exc)
    assert isinstance(exc, CpkvValueError) and isinstance(exc, ValueError) and isinstance(exc, CpkvError)
    assert "\n" not in msg
    assert str(path) in msg
    if line is not None:
        assert msg.startswith(f"{path}:{line}: "), msg


def test_missing_file_directory_and_empty_file(tmp_path):
    for path in (tmp_path / "nope.jsonl", tmp_path):
        with pytest.raises(TraceError) as e:
            load_trace(path)
        check(e.value, path, None)
    for lines in ([], ["", "  "]):
        path = write(tmp_path, lines, "empty.jsonl")
        with pytest.raises(TraceError, match="no trace records") as e:
            load_trace(path)
        check(e.value, path, None)


# Each line after two good ones (timestamps 0 and 5; rec's default 9 keeps the order), and a
# fragment of the message it must give, so a case cannot pass on some other complaint.
BAD_LINES = {
    "bad json": ("{\"timestamp\": 1,", "bad JSON"),
    "not an object": ("[1, 2, 3]", "not an object"),
    "missing key": (json.dumps({"timestamp": 1, "input_length": 10, "output_length": 1}), "missing key"),
    "negative input_length": (rec(inp=-512, ids=[]), "input_length"),
    "zero input_length": (rec(inp=0, ids=[]), "input_length"),
    "float input_length": (rec(inp=1000.0), "input_length"),
    "string input_length": (rec(inp="1000"), "input_length"),
    "bool output_length": (rec(out=True), "output_length"),
    "negative output_length": (rec(out=-1), "output_length"),
    "negative timestamp": (rec(ts=-1), "timestamp must be"),
    "too few hash_ids": (rec(inp=1025, ids=[0, 1]), "2 hash_ids"),
    "too many hash_ids": (rec(inp=512, ids=[0, 1]), "2 hash_ids"),
    "hash_ids not a list": (rec(ids="0,1"), "hash_ids must be a list"),
    "hash_id not an int": (rec(ids=[0, "1"]), "hash_ids[1] = '1'"),
    "negative hash_id": (rec(ids=[0, -1]), "hash_ids[1] = -1"),
    "hash_id 2**63": (rec(ids=[0, 2**63]), "hash_ids[1] = 9223372036854775808"),
    "hash_id 2**64": (rec(ids=[0, 2**64]), "hash_ids[1] = 18446744073709551616"),
    # Python refuses to parse an int this long at all (its 4300-digit guard): still one line.
    "hash_id with 5000 digits": (rec(ids=[0, 7]).replace("7]", "1" + "0" * 4999 + "]"), "bad trace record"),
    "decreasing timestamp": (rec(ts=4), "before the previous"),
    "broken chain": (rec(ids=[1, 0]), "chained"),  # 1 followed 0 on line 1; now it starts a request
    "nested too deep": ("[" * 100_000, "bad trace record"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_malformed_line_names_path_and_line(tmp_path, case):
    line, fragment = BAD_LINES[case]
    path = write(tmp_path, [GOOD[0], rec(5, 1024, 3, [0, 1]), line])
    with pytest.raises(TraceError) as e:
        load_trace(path)
    check(e.value, path, 3)
    assert fragment in str(e.value)


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes((GOOD[0] + "\n").encode() + b"\xff\xfe\x00garbage\n")
    with pytest.raises(TraceError) as e:
        load_trace(path)
    check(e.value, path, 2)


def test_both_shared_traces_pass_every_check(traces):
    # Mooncake's format: len(hash_ids) == ceil(input_length / 512) for every record, ids chained.
    assert len(load_trace(traces / "conversation_trace.jsonl")) == 12_031
    assert len(load_trace(traces / "synthetic_trace.jsonl")) == 3_993


def test_block_ids_up_to_2_63_minus_1_load_and_the_next_is_named(tmp_path):
    path = write(tmp_path, [rec(ids=[0, MAX_BLOCK_ID]), rec(inp=512, ids=[2**63])])
    with pytest.raises(TraceError) as e:
        load_trace(path)
    check(e.value, path, 2)
    assert "hash_ids[0] = 9223372036854775808" in str(e.value)
    assert load_trace(path, limit=1)[0].hash_ids == (0, 2**63 - 1)


def test_block_tokens_never_wrap_and_keep_distinct_ids_apart():
    # id * 16 wraps in int64 for these: 1 and 1 + 2**60 once became the same 16 tokens.
    ids = [1, 1 + 2**60, 2**63 - 1, 0]
    tokens = block_tokens(ids, 16)
    assert tokens.dtype.name == "int64" and tokens.shape == (64,)
    pages = {tuple(page) for page in tokens.reshape(4, 16).tolist()}
    assert len(pages) == 4
    assert tokens.reshape(4, 16)[:, 0].tolist() == ids
    for bad in ([2**63], [-1], [1.5]):
        with pytest.raises(InvalidArgumentError):
            block_tokens(bad, 16)
    with pytest.raises(InvalidArgumentError):
        block_tokens([1], 0)


def test_a_line_without_end_is_refused_at_the_cap_without_reading_on(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_bytes(GOOD[0].encode() + b"\n" + b" " * (MAX_LINE_BYTES + 10))
    with pytest.raises(TraceError, match="longer than") as e:
        load_trace(path)
    check(e.value, path, 2)
    # A line of exactly the cap (its newline included) still loads.
    fits = tmp_path / "fits.jsonl"
    line = GOOD[0].encode()
    fits.write_bytes(line + b" " * (MAX_LINE_BYTES - len(line) - 1) + b"\n")
    assert len(load_trace(fits)) == 1


def test_dev_zero_ends_at_the_first_line_in_bounded_memory():
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="longer than") as e:
            load_trace("/dev/zero")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    check(e.value, "/dev/zero", 1)
    assert peak < 8 * MAX_LINE_BYTES, peak


@pytest.mark.parametrize("argv", [["replay", "--trace", "/dev/zero"], ["hitrate", "/dev/zero"],
                                  ["sweep", "/dev/zero"], ["schedsim", "/dev/zero"]],
                         ids=lambda a: a[0])
def test_dev_zero_on_the_command_line_is_one_line_and_exit_2(argv):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cpkv", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"cpkv: error: /dev/zero:1: line longer than {MAX_LINE_BYTES:,} bytes "
                                        "(one JSON record per line)"]
    assert time.monotonic() - started < 60
