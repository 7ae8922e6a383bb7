"""``cpkv bench cluster`` at a tiny size under .venv-sglang: both halves run, and the second has both
columns, cpkv's cluster tier and SGLang 0.5.23's own ``mooncake`` backend, each with exactly the hits
the trace allows (every backend, every request) and the objects each keeps per token page. Structure
and counts only: no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cpkv.bench.cluster_share import INSTANCES, page_bytes, trace, trace_hits
from cpkv.bench.sglang import DSA_PAGE

pytestmark = pytest.mark.slow

REQUESTS = 12


@pytest.mark.timeout(1200)
def test_bench_cluster_compares_cpkv_with_sglangs_mooncake_backend_on_one_store(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    done = subprocess.run([sys.executable, "-m", "cpkv", "bench", "cluster", "--batch", "4", "--batches", "1",
                           "--requests", str(REQUESTS), "--json", str(out)],
                          capture_output=True, text=True, timeout=1100, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(out.read_text())
    assert report["sglang"] == "compared"
    figures = report["figures"]
    for page in ("64KiB", "4KiB"):  # the first half: both directions measured
        assert figures[page]["put_ratio"] > 0 and figures[page]["get_ratio"] > 0
    shared = figures["shared"]
    chains = trace(REQUESTS, 0)
    expected = trace_hits(chains)
    assert shared["trace_hits"] == expected and sum(expected) > 0  # the trace has hits to find
    unique_pages = len({key for keys in chains for key in keys})
    # cpkv: one record per token page (KV, indexer, 64-byte trailer); SGLang: a KV and an indexer object.
    for backend, objects_per_page, bytes_per_page in (("cpkv", 1, sum(page_bytes()) + 64),
                                                      ("sglang", 2, sum(page_bytes()))):
        assert shared[backend]["hits"] == expected, backend
        assert shared[backend]["objects"] == objects_per_page * unique_pages, backend
        assert shared[backend]["bytes"] == bytes_per_page * unique_pages, backend
    table = report["tables"][1]
    rows = {row["backend"]: row for row in table["rows"]}
    assert set(rows) == {"cpkv cluster tier", "SGLang 0.5.23 mooncake"}
    for row in rows.values():
        assert row["hit tokens"] == sum(expected) * DSA_PAGE
        assert sum(row[f"instance {i} hit tokens"] for i in range(INSTANCES)) == row["hit tokens"]
