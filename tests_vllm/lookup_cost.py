"""What L3 adds to the manager's ``lookup`` (the README's figure): ns per lookup of 512 host-resident
keys and of 512 keys in neither tier, least of 5 passes of 20 rounds, with L3 off and on.

    .venv-vllm/bin/python tests_vllm/lookup_cost.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from vllm.v1.kv_offload.base import ReqContext, make_offload_key

from cpkv.integrations.vllm.l3 import L3Catalog, L3Geometry
from cpkv.integrations.vllm.manager import CpkvOffloadingManager

KEYS, ROUNDS, PASSES = 512, 20, 5


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        geometry = L3Geometry(directory=Path(directory), cap_bytes=1 << 24, model="m", dtype="d", layout="l",
                              tokens_per_chunk=16, world=1, page_bytes=4096)
        for with_l3 in (False, True):
            manager = CpkvOffloadingManager(2 * KEYS, "lru", tokens_per_chunk=(16,),
                                            l3=L3Catalog(geometry) if with_l3 else None)
            ctx = ReqContext(req_id="a")
            resident = [make_offload_key(i.to_bytes(32, "big"), 0) for i in range(KEYS)]
            absent = [make_offload_key((1 << 40 | i).to_bytes(32, "big"), 0) for i in range(KEYS)]
            for i, key in enumerate(resident):
                ctx.set_offload_key_position(key, (i + 1) * 16)
            manager.prepare_store(resident, ctx)
            manager.complete_store(resident, ctx)
            for name, keys in (("host hit", resident), ("in neither tier", absent)):
                best = float("inf")
                for _ in range(PASSES):
                    started = time.perf_counter()
                    for _ in range(ROUNDS):
                        for key in keys:
                            manager.lookup(key, ctx)
                    best = min(best, (time.perf_counter() - started) / (ROUNDS * len(keys)))
                print(f"L3 {'on ' if with_l3 else 'off'}  {name:16s} {best * 1e9:7.0f} ns per lookup")
            manager.shutdown()


if __name__ == "__main__":
    main()
