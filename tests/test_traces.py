"""``load_trace`` refuses every malformed trace with a typed one-line error naming path and line."""

from __future__ import annotations

import json

import pytest

from cpkv.errors import CpkvError, CpkvValueError, InvalidArgumentError, TraceError
from cpkv.traces import TraceRequest, load_trace


def rec(ts=0, inp=1000, out=10, ids=None, **extra):
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


BAD_LINES = {
    "bad json": "{\"timestamp\": 1,",
    "not an object": "[1, 2, 3]",
    "missing key": json.dumps({"timestamp": 1, "input_length": 10, "output_length": 1}),
    "negative input_length": rec(inp=-512, ids=[]),
    "zero input_length": rec(inp=0, ids=[]),
    "float input_length": rec(inp=1000.0),
    "string input_length": rec(inp="1000"),
    "bool output_length": rec(out=True),
    "negative output_length": rec(out=-1),
    "negative timestamp": rec(ts=-1),
    "too few hash_ids": rec(inp=1025, ids=[0, 1]),
    "too many hash_ids": rec(inp=512, ids=[0, 1]),
    "hash_ids not a list": rec(ids="0,1"),
    "hash_id not an int": rec(ids=[0, "1"]),
    "negative hash_id": rec(ids=[0, -1]),
    "decreasing timestamp": rec(ts=4),
    "broken chain": rec(ts=9, ids=[1, 0]),  # 1 followed 0 on line 1; now it starts a request
    "nested too deep": "[" * 100_000,
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_malformed_line_names_path_and_line(tmp_path, case):
    path = write(tmp_path, [GOOD[0], rec(5, 1024, 3, [0, 1]), BAD_LINES[case]])
    with pytest.raises(TraceError) as e:
        load_trace(path)
    check(e.value, path, 3)


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes((GOOD[0] + "\n").encode() + b"\xff\xfe\x00garbage\n")
    with pytest.raises(TraceError) as e:
        load_trace(path)
    check(e.value, path, 2)


def test_both_shared_traces_pass_every_check(traces):
    # SOURCES.md: len(hash_ids) == ceil(input_length / 512) for every record, ids chained.
    assert len(load_trace(traces / "conversation_trace.jsonl")) == 12_031
    assert len(load_trace(traces / "synthetic_trace.jsonl")) == 3_993
