"""`cpkv bench tier` runs end to end at tiny sizes and writes every number it prints (no timing
thresholds: machines are noisy)."""

from __future__ import annotations

import json

import pytest
import torch

from cpkv.cli import main


def test_bench_tier_writes_json(tmp_path, capsys):
    out = tmp_path / "tier.json"
    argv = ["bench", "tier", "--pages", "8", "--node-pages", "4", "--layers", "2", "--repeats", "1",
            "--requests", "60", "--page-size", "4", "--device-fraction", "0.1", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["command"] == "bench tier"
    backup, load, decisions = data["tables"]
    for table in (backup, load):
        assert len(table["rows"]) == 2  # K+V 32 KB rows, one 4 KB payload
        for row in table["rows"]:
            assert row["cpkv GB/s"] > 0 and row["plain GB/s"] > 0 and row["ratio"] > 0
            assert row["MB/layer"] == pytest.approx(8 * (65_536 if "K+V" in row["rows"] else 4_096) / 1e6)
    tier, tree = decisions["rows"]
    assert tier["requests/s"] > 0 and tier["calls/s"] > 0 and tier["ratio"] > 0 and tree["ratio"] == 1.0
    assert tier["device-hit pages"] > 0
    assert {"s", "calls", "hit_pages", "misses"} <= set(data["tier_replay"]) & set(data["tree_replay"])
    assert {c["label"] for c in data["copies"]} == {row["rows"] for row in backup["rows"]}
    assert "ratio" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--pages", "0"], "--pages must be a positive integer"),
    (["--pages", "10", "--node-pages", "4"], "--node-pages 4 must divide --pages 10"),
    (["--device-fraction", "nan"], "--device-fraction must be in (0, 1]"),
    (["--seed", "-1"], "--seed must be a non-negative integer"),
])
def test_bench_tier_refuses_bad_options_in_one_line(argv, message, capsys):
    assert main(["bench", "tier", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_bench_tier_on_cuda_refuses_without_a_gpu(capsys):
    assert main(["bench", "tier", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
