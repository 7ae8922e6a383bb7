"""Mooncake-format request traces (JSONL, 512-token blocks as chained hash ids).

One record per line: ``timestamp`` (ms), ``input_length``, ``output_length``,
``hash_ids``. Equal ids at position ``i`` mean equal prefixes up to block ``i``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Reads a trace; raises ``ValueError`` naming the line of a bad record."""
    requests: list[TraceRequest] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if limit is not None and len(requests) >= limit:
                break
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                req = TraceRequest(
                    int(rec["timestamp"]),
                    int(rec["input_length"]),
                    int(rec["output_length"]),
                    tuple(int(h) for h in rec["hash_ids"]),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{line_no}: bad trace record: {exc}") from exc
            requests.append(req)
    return requests
