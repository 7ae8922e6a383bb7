"""``cpkv replay --device cuda``'s device logic on the CPU.

The device path runs here with CPU tensors: the controller's streams are the recording double
(``stream_double``; the caller's stream is "busy" until the host synchronises it), and the compose
is CudaIpcGroup's, gathered by the Triton kernel under ``TRITON_INTERPRET=1`` through raw addresses
(``ipc_seam``). Every composed byte is still checked. With a GPU, ``test_replay_cuda.py`` runs the
real thing.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from cpkv.errors import InvalidArgumentError
from cpkv.replay.device import ExpectedRows, ReplayClock, gpu_for_rank
from cpkv.replay.kv_rows import kv_rows
from cpkv.replay.options import KV_ROW_MIN_BYTES
from cpkv.runtime.launch import run_ranks
from cpkv.workload import generate
from stream_double import RecordingStreams

pytest.importorskip("triton")

LAYERS = 2


def _device_path_rank(rank: int, world: int, options, requests: list) -> dict:
    """One replay rank through the device path on CPU tensors; rank 1 corrupts one composed byte."""
    from cpkv.replay import rank as replay_rank_module
    from cpkv.replay.device import ReplayDevice
    from cpkv.tier import streams as streams_module
    from ipc_seam import TritonShmGroup

    double = RecordingStreams()
    # The caller's and the load stream complete nothing until the host synchronises the caller's
    # (which completes the load-backs it waited for). Rank 1's backups, too: they finish later than
    # rank 0's (here 39 backups commit, not 50, and 9 blocks hit the host, not 15), so the commit
    # frontier differs between the ranks until the MIN all-reduce agrees on it.
    double.held = {"caller", "load"} | ({"backup"} if rank == 1 else set())
    streams_module.stream_ops = lambda device: double
    groups = []

    def open_group(timeout_s: float):
        groups.append(TritonShmGroup(double, timeout_s=timeout_s))
        return groups[-1]

    def corrupt(forward: int, payload: str, layer: int, dense) -> None:
        if rank == 1 and forward == 3 and payload == "index" and layer == 1:
            dense[0, 5] ^= 0xFF

    replay_rank_module.after_compose = corrupt
    stats = replay_rank_module.replay_rank(rank, world, options, requests,
                                           device=ReplayDevice(torch.device("cpu"), open_group))
    stats["log"] = double.log
    stats["timed"] = sorted(double.timed)
    stats["triton_gathers"] = groups[0].triton_gathers
    return stats


def _load_layer_events(log: list[tuple]) -> list[int]:
    return [e[2] for before, e in zip(log, log[1:]) if e[:2] == ("record", "load") and before == ("off", "load")]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_device_path_composes_through_triton_orders_load_backs_and_checks_every_byte():
    from cpkv.replay import ReplayOptions
    from cpkv.replay.options import parse_payloads
    from cpkv.replay.report import report

    options = ReplayOptions(payloads=parse_payloads("kv:4x8:float8_e4m3fn,index:16:bfloat16"), layers=LAYERS,
                            device_pages=32, host_pages=256, check_every=1, progress=False, timeout_s=60.0)
    requests = [r.hash_ids for r in generate(60, 3)]  # a small device tier: pages come back from the host
    results = run_ranks(_device_path_rank, 2, options, requests, timeout_s=500, env={"TRITON_INTERPRET": "1"})
    # Every byte checked, on the device, counted once per forward: the one corrupted byte is found.
    assert [r["verification_failures"] for r in results] == [0, 1]
    assert results[0]["verified_bytes"] == results[0]["composed_bytes"] > 0
    assert results[1]["verified_bytes"] == results[1]["composed_bytes"] - 16 * 2  # one bf16 row of 16
    assert len({r["digest"] for r in results}) == 1 and results[0]["agreement_checks"] > 0
    assert results[0]["backups_committed"] == results[1]["backups_committed"] > 0
    forwards = results[0]["forwards"]
    for r in results:
        log = r["log"]
        assert r["triton_gathers"] == sum(e[0] == "compose" for e in log) > 0  # every compose went through Triton
        assert r["host_hit_blocks"] > 0 and r["bytes_loaded"] > 0  # load-backs ran
        # Per layer, the caller's stream waits on that layer's load-back event before the forward
        # composes that layer (a load whose page is freed at admission is waited for whole, earlier).
        loads = _load_layer_events(log)
        layer_of = {n: i % LAYERS for i, n in enumerate(loads)}
        caller_events = {e[2] for e in log if e[:2] == ("record", "caller")}
        main = [e for e in log if e[0] == "compose" or (e[:2] == ("wait", "caller") and e[2] in layer_of)
                or (e[0] == "sync" and e[1] in caller_events)]
        assert sorted(e[2] for e in main if e[0] == "wait") == sorted(loads) and loads
        syncs = [i for i, e in enumerate(main) if e[0] == "sync"]
        for begin, end in zip([0, *[i + 1 for i in syncs]], syncs):  # one forward's entries
            forward = main[begin:end]
            for i, e in enumerate(forward):
                if e[0] == "wait":
                    first = forward.index(("compose", layer_of[e[2]])) if ("compose", layer_of[e[2]]) in forward \
                        else len(forward)
                    assert i < first, forward
        # One host sync of the caller's stream per forward (the composes' times are read after it,
        # else the double refuses to read an incomplete event), and never one inside a forward.
        assert len(syncs) == r["forwards"] == forwards
        assert r["compose_s"] > 0 and r["compose_timed_bytes"] == r["composed_bytes"]
        assert r["forward_s"] > 0
        assert r["backup_copy_bytes"] > 0 and r["backup_copy_ns"] > 0 and r["load_copy_ns"] > 0
    assert report(options, requests, results, 1.0, None) == 1  # a wrong byte fails the command


def test_gpus_are_one_per_rank_when_enough_else_shared():
    assert [gpu_for_rank(r, 2, 8) for r in range(2)] == [0, 1]
    assert [gpu_for_rank(r, 4, 4) for r in range(4)] == [0, 1, 2, 3]
    assert [gpu_for_rank(r, 4, 1) for r in range(4)] == [0, 0, 0, 0]
    assert [gpu_for_rank(r, 4, 2) for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(InvalidArgumentError, match="no CUDA device"):
        gpu_for_rank(0, 2, 0)
    with pytest.raises(InvalidArgumentError, match="rank 2"):
        gpu_for_rank(2, 2, 1)


def test_a_cuda_rank_makes_its_gpu_current_and_opens_its_group_there(monkeypatch):
    from cpkv.replay import device as device_module

    current = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    opened = {}

    class Group:
        def __init__(self, *, timeout_s, device):
            opened.update(timeout_s=timeout_s, device=device)

    monkeypatch.setattr("cpkv.compose.CudaIpcGroup", Group)
    where = device_module.replay_device("cuda", 3, 4)
    assert where.device == torch.device("cuda", 1) and current == [1]
    where.open_group(7.5)
    assert opened == {"timeout_s": 7.5, "device": torch.device("cuda", 1)}
    assert device_module.replay_device("cpu", 3, 4).device == torch.device("cpu")
    with pytest.raises(InvalidArgumentError, match="cpu or cuda"):
        device_module.replay_device("tpu", 0, 1)


@pytest.mark.parametrize("row_bytes", [KV_ROW_MIN_BYTES, 17, 64, 130])
def test_expected_rows_on_the_device_are_kv_rows(row_bytes):
    ids = np.array([0, 1, 2, 1 + 2**60, 2**32 + 1, 2**63 - 1, 251, 256, 7, 7], dtype=np.int64)
    expected = ExpectedRows(torch.device("cpu"), 3, [row_bytes, KV_ROW_MIN_BYTES])
    expected.set_blocks(ids)
    for layer in range(3):
        for payload, rb in enumerate([row_bytes, KV_ROW_MIN_BYTES]):
            got = expected.rows(layer, payload)
            assert got.dtype == torch.uint8 and tuple(got.shape) == (len(ids), rb)
            assert np.array_equal(got.numpy(), kv_rows(ids, layer, payload, rb)), (layer, payload)
    expected.set_blocks(ids[::-1].copy())  # a new batch replaces the ids' term
    assert np.array_equal(expected.rows(2, 0).numpy(), kv_rows(ids[::-1], 2, 0, row_bytes))


def test_the_clock_reads_device_times_only_after_the_forwards_sync():
    double = RecordingStreams()
    double.held = {"caller"}
    clock = ReplayClock(double)
    clock.begin_forward()
    for _ in range(3):
        started = clock.start()
        clock.stop(started, 100)
    assert double.elapsed == [] and double.entries("sync") == []
    clock.sync_forward()
    assert len(double.entries("sync")) == 1 and len(double.elapsed) == 3
    assert clock.compose_bytes == 300 and clock.compose_s == pytest.approx(3e-3)
    clock.end_forward()
    assert clock.forward_s > 0
    cpu = ReplayClock(None)
    cpu.begin_forward()
    cpu.stop(cpu.start(), 10)
    cpu.sync_forward()
    cpu.end_forward()
    assert cpu.compose_bytes == 10 and cpu.compose_s >= 0 and cpu.forward_s > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA refusal")
def test_device_cuda_without_cuda_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "cpkv", "replay", "--device", "cuda", "--quiet", "--limit", "5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["cpkv: error: --device cuda: no CUDA device is available here"]
    assert done.stdout == ""
