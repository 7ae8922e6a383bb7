"""``cpkv replay --device cuda`` on a GPU (skipped without one; ``make gpu-check`` runs it).

The same replay as on the CPU, with the pools in GPU memory shared over CUDA IPC, the pinned slab
and the side streams: every composed byte checked, the digests equal across ranks. (Not equal to a
CPU run's: a backup still in flight at a forward's commit point commits a forward later, which the
CPU's synchronous copies never do, and what the host holds follows from that.) Its device logic
runs on the CPU in ``test_replay_device.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cpkv.runtime.launch import run_ranks
from cpkv.workload import generate

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ARGS = ["--requests", "120", "--layers", "3", "--payloads", "kv:4x8:float8_e4m3fn,index:16:bfloat16",
        "--device-pages", "48", "--host-pages", "512", "--check-every", "2", "--quiet"]


def _replay(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, "-m", "cpkv", "replay", *args, "--json", str(out)], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@needs_cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks, gpus", [(2, 1), (4, 1), (2, 2)], ids=["2-on-1", "4-on-1", "2-on-2"])
def test_replay_on_cuda_checks_every_byte_with_ranks_sharing_or_owning_gpus(tmp_path: Path, ranks: int, gpus: int):
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs, this machine has {torch.cuda.device_count()}")
    cuda = _replay(tmp_path, "cuda", "--device", "cuda", "--ranks", str(ranks), *ARGS)
    report = cuda["report"]
    assert report["verification failures (pages)"] == 0 and "ranks differ" not in report["final digest"]
    assert report["verified_bytes"] == report["composed_bytes"] > 0 and report["agreement checks passed"] > 0
    assert report["prefix hit rate: host"] > 0 and report["MB loaded (all ranks)"] > 0
    devices = [r["device"] for r in cuda["per_rank"]]
    want = [f"cuda:{r}" for r in range(ranks)] if gpus >= ranks else ["cuda:0"] * ranks
    assert devices == want
    for key in ("ms per forward (slowest rank)", "compose GB/s per rank", "backup GB/s per rank",
                "load-back GB/s per rank"):
        assert report[key] > 0, key


def _corrupting_rank(rank: int, world: int, options, requests: list) -> dict:
    from cpkv.replay import rank as replay_rank_module

    def corrupt(forward: int, payload: str, layer: int, dense) -> None:
        if rank == 1 and forward == 3 and payload == "index" and layer == 1:
            dense[0, 5] ^= 0xFF  # one byte of one composed page, in GPU memory

    replay_rank_module.after_compose = corrupt
    return replay_rank_module.replay_rank(rank, world, options, requests)


@needs_cuda
@pytest.mark.timeout(300)
def test_a_corrupted_byte_in_gpu_memory_is_a_verification_failure():
    from cpkv.replay import ReplayOptions
    from cpkv.replay.options import parse_payloads

    options = ReplayOptions(payloads=parse_payloads("kv:4x8:float8_e4m3fn,index:16:bfloat16"), device_pages=64,
                            host_pages=256, check_every=1, progress=False, timeout_s=60.0, device="cuda")
    results = run_ranks(_corrupting_rank, 2, options, [r.hash_ids for r in generate(40, 3)], timeout_s=240,
                        collective_timeout_s=60)
    assert [r["verification_failures"] for r in results] == [0, 1]
    assert results[1]["verified_bytes"] == results[1]["composed_bytes"] - 32
    assert len({r["digest"] for r in results}) == 1 and {r["device"] for r in results} == {"cuda:0"}
