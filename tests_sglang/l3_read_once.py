"""The README's figure for the L3 read-staging area: disk reads per page per node and the prefetch
time of a restarted server, at CP 2 and CP 4 on one node, through SGLang's own controller stack.

    .venv-sglang/bin/python tests_sglang/l3_read_once.py --cp 2,4 [--page-kb 64] [--json PATH]

One fill (the harness's ``l3`` scenario: stores under a small slab, spills to L3, a clean stop), then
new processes on a copy of the directory prefetch every request (``phase="warm"``) and check every
byte; printed per CP: pages each rank loaded from L3, the node's disk reads of records and per
distinct page, and each rank's prefetch seconds. Run it with ``PYTHONPATH`` pointing at another
checkout's ``python/`` to measure that code the same way (the "before" of the README's table: there
every page a rank loaded was a disk read of its own).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import launch  # noqa: E402


def run(cp: int, page_kb: int, requests: int) -> dict:
    # 4-token pages of heads x head_dim fp16 K and V per layer: page_kb KiB.
    heads, head_dim, layers = 8, 128, max(1, page_kb // 16)
    geometry = {"heads": heads, "head_dim": head_dim, "layers": layers}
    opts = dict(kind="gqa", pages=32, model="bench-model", l3_bytes=256 << 20, geometry=geometry)
    with tempfile.TemporaryDirectory(prefix="cpkv-l3-once-") as root:
        fill_dir, warm_dir = Path(root) / "fill", Path(root) / "warm"
        fill_dir.mkdir()
        launch(cp, "l3", args={"phase": "fill", "requests": requests}, l3_dir=str(fill_dir), **opts)
        shutil.copytree(fill_dir, warm_dir)
        warm = launch(cp, "l3", args={"phase": "warm", "requests": requests}, l3_dir=str(warm_dir), **opts)
    served = [r["stats"]["l3_pages_read"] for r in warm]
    disk = [r["stats"].get("l3_disk_reads", r["stats"]["l3_pages_read"]) for r in warm]  # before: every load
    distinct = warm[0]["distinct_loaded"]
    return {"cp": cp, "page_bytes": warm[0]["page_bytes"], "distinct_pages": distinct, "served_per_rank": served,
            "disk_reads_per_rank": disk, "disk_reads_per_page_per_node": sum(disk) / max(1, distinct),
            "staging": "l3_disk_reads" in warm[0]["stats"],
            "prefetch_s_per_rank": [round(r["prefetch_s"], 3) for r in warm],
            "wrong_pages": sum(f["wrong"] for r in warm for f in r["fetched"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cp", default="2,4")
    parser.add_argument("--page-kb", type=int, default=64)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [run(int(cp), args.page_kb, args.requests) for cp in args.cp.split(",")]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
