"""Mooncake-format request traces (JSONL, 512-token blocks as chained hash ids).

One record per line: ``timestamp`` (ms), ``input_length``, ``output_length``,
``hash_ids``. Equal ids at position ``i`` mean equal prefixes up to block ``i``.

:func:`load_trace` checks every record it reads, because a replay over a bad
trace does not fail, it silently reports wrong hit rates: every problem is a
:class:`~cpkv.errors.TraceError` with a one-line message ``PATH:LINE: what``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from cpkv.errors import InvalidArgumentError, TraceError

__all__ = ["BLOCK_TOKENS", "MAX_BLOCK_ID", "MAX_LINE_BYTES", "TraceRequest", "load_trace", "blocks_for"]

BLOCK_TOKENS = 512
# Block ids become int64 token ids (numpy's and the engines' token type); a larger id would wrap
# or fail deep inside a run, so it is refused where it enters.
MAX_BLOCK_ID = 2**63 - 1
# One record per line; 1 MiB holds ~50k 20-digit ids (25M tokens). Lines are read at most this
# long, so a file without newlines (/dev/zero) fails at once instead of filling memory.
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class TraceRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def blocks_for(input_length: int) -> int:
    """Blocks a prompt of ``input_length`` tokens spans (the last one usually partial)."""
    return -(-input_length // BLOCK_TOKENS)


def _is_int(value: Any) -> bool:
    # JSON true/false load as bool, which is an int subclass; a flag is not a count.
    return type(value) is int


def _record(rec: Any, prev_ts: int) -> TraceRequest:
    """One record, checked; raises ``ValueError`` with what is wrong (no location)."""
    if not isinstance(rec, dict):
        raise ValueError(f"record is a JSON {type(rec).__name__}, not an object")
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in rec]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(missing)}")
    ts, inp, out, ids = rec["timestamp"], rec["input_length"], rec["output_length"], rec["hash_ids"]
    if not _is_int(ts) or ts < 0:
        raise ValueError(f"timestamp must be a non-negative integer (ms), got {ts!r}")
    if ts < prev_ts:
        raise ValueError(f"timestamp {ts} is before the previous record's {prev_ts} (must be non-decreasing)")
    if not _is_int(inp) or inp < 1:
        raise ValueError(f"input_length must be a positive integer, got {inp!r}")
    if not _is_int(out) or out < 0:
        raise ValueError(f"output_length must be a non-negative integer, got {out!r}")
    if not isinstance(ids, list):
        raise ValueError(f"hash_ids must be a list of block ids, got a JSON {type(ids).__name__}")
    for i, h in enumerate(ids):
        if not _is_int(h) or not 0 <= h <= MAX_BLOCK_ID:
            raise ValueError(f"hash_ids[{i}] = {h!r} is not a block id (an integer from 0 to 2**63-1)")
    if len(ids) != blocks_for(inp):
        raise ValueError(
            f"{len(ids)} hash_ids for input_length {inp}, expected ceil({inp}/{BLOCK_TOKENS}) = {blocks_for(inp)}"
        )
    return TraceRequest(ts, inp, out, tuple(ids))


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Reads the first ``limit`` (default all) records of a trace, checking each.

    Raises :class:`TraceError` for a file that cannot be read, one with no
    records, and the first bad record: bad JSON or UTF-8, a missing key, a
    count that is not a non-negative integer, ``len(hash_ids) !=
    ceil(input_length / 512)``, a timestamp before the previous one, or a
    block id outside ``[0, 2**63)``, a line longer than
    :data:`MAX_LINE_BYTES`, or a block id that breaks the chain (it followed
    another id earlier in the file, so "equal id means equal prefix" would
    not hold).
    """
    if limit is not None and (not _is_int(limit) or limit < 1):
        raise InvalidArgumentError(f"limit must be a positive integer or None, got {limit!r}")
    p = Path(path)
    if p.is_dir():
        raise TraceError(f"{path}: is a directory, not a trace file")
    requests: list[TraceRequest] = []
    parent: dict[int, int] = {}  # block id -> the id before it (-1 at position 0)
    prev_ts = 0
    try:
        f = open(p, "rb")  # noqa: SIM115 -- the with below closes it
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
    with f:
        line_no = 0
        try:
            while limit is None or len(requests) < limit:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    break
                line_no += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise TraceError(f"{path}:{line_no}: line longer than {MAX_LINE_BYTES:,} bytes "
                                     "(one JSON record per line)")
                try:
                    line = raw.decode("utf-8")
                    if not line.strip():
                        continue
                    req = _record(json.loads(line), prev_ts)
                    before = -1
                    for h in req.hash_ids:
                        seen = parent.setdefault(h, before)
                        if seen != before:
                            raise ValueError(
                                f"block id {h} follows {before if before >= 0 else 'the start'} here but "
                                f"{seen if seen >= 0 else 'the start'} earlier (ids must be chained)"
                            )
                        before = h
                except json.JSONDecodeError as exc:  # its own "line 1" would read as the file's line
                    raise TraceError(f"{path}:{line_no}: bad JSON at column {exc.colno}: {exc.msg}") from exc
                except UnicodeDecodeError as exc:
                    raise TraceError(f"{path}:{line_no}: not UTF-8 text (byte {exc.start + 1})") from exc
                except (ValueError, RecursionError) as exc:
                    raise TraceError(f"{path}:{line_no}: bad trace record: {_one_line(exc)}") from exc
                prev_ts = req.timestamp_ms
                requests.append(req)
        except OSError as exc:  # e.g. EIO mid-file
            raise TraceError(f"{path}:{line_no + 1}: cannot read trace: {exc.strerror or exc}") from exc
    if not requests:
        raise TraceError(f"{path}: no trace records (the file is empty)")
    return requests


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def block_tokens(hash_ids: Sequence[int] | np.ndarray, page_tokens: int) -> np.ndarray:
    """Token ids standing for a request's blocks at ``page_tokens`` tokens per block (one page each).

    Every token of a block's page is the block id itself: no arithmetic, so no id can wrap onto
    another's tokens (``id * page_tokens`` did in int64), and distinct ids give distinct pages.
    Since ids chain, equal token prefixes mean equal block prefixes.
    """
    if isinstance(page_tokens, bool) or not isinstance(page_tokens, (int, np.integer)) or page_tokens < 1:
        raise InvalidArgumentError(f"page_tokens must be a positive integer, got {page_tokens!r}")
    blocks = np.asarray(hash_ids)
    if blocks.ndim != 1 or (blocks.size and (blocks.dtype.kind not in "iu" or int(blocks.min()) < 0
                                             or int(blocks.max()) > MAX_BLOCK_ID)):
        raise InvalidArgumentError(f"hash_ids must be block ids from 0 to 2**63-1, got {hash_ids!r:.80}")
    return np.repeat(blocks.astype(np.int64), int(page_tokens))
