"""`bench compose-gpu`'s gather check, on the CPU: the Triton kernel runs under ``TRITON_INTERPRET=1``
with the device swapped to ``cpu`` and a tiny batch. On a GPU, ``make gpu-check`` runs the bench itself."""

from __future__ import annotations

import argparse

import pytest
import torch

from cpkv.bench import compose_gpu
from cpkv.kernels import gather

pytest.importorskip("triton")

TINY = argparse.Namespace(requests=2, prefix_pages=3, current_pages=1, page_bytes=16)


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(gather, "_triton_kernel", None)  # compiled afresh under the interpreter
    yield
    gather._triton_kernel = None


@pytest.mark.parametrize("cp", [1, 2, 3])
def test_the_gather_is_checked_before_the_copy_overwrites_anything(interpreted, cp):
    # Before the fix the timed copy wrote random bytes into the gather's output before the check,
    # so this ended in "gathered slot 0 differs" on every run.
    gather_s, copy_s, slots = compose_gpu._gather_vs_copy(cp, TINY, device="cpu", reps=1)
    assert slots == TINY.requests * (TINY.prefix_pages + TINY.current_pages)
    assert gather_s > 0 and copy_s > 0


def test_a_wrong_gather_is_still_caught(interpreted, monkeypatch):
    real = compose_gpu.gather_triton if hasattr(compose_gpu, "gather_triton") else gather.gather_triton

    def off_by_one(out, *args, **kwargs):
        real(out, *args, **kwargs)
        out[1, 0] ^= 1  # one bit of slot 1
        return out

    monkeypatch.setattr(gather, "gather_triton", off_by_one)
    with pytest.raises(SystemExit, match=r"cp 2: gathered slot 1 differs from its source row \(1 of 8 slots"):
        compose_gpu._gather_vs_copy(2, TINY, device="cpu", reps=1)


def test_the_cpu_timer_times_the_calls():
    calls = []
    seconds = compose_gpu._timer(torch.device("cpu"))(lambda: calls.append(1), 4)
    assert len(calls) == 3 + 4 and seconds >= 0
