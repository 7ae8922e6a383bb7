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
    copies = {c["label"]: c for c in data["copies"]}
    for direction, table in (("backup", backup), ("load", load)):
        assert len(table["rows"]) == 2  # K+V 32 KB rows, one 4 KB payload
        for row in table["rows"]:
            c = copies[row["rows"]]
            assert row["cpkv GB/s"] > 0 and row["plain GB/s"] > 0
            # The ratio is the two measured times' quotient, not a constant.
            assert row["ratio"] == pytest.approx(c[f"plain_{direction}_s"] / c[f"{direction}_s"])
            assert row["MB/layer"] == pytest.approx(8 * (65_536 if "K+V" in row["rows"] else 4_096) / 1e6)
    for c in copies.values():  # every byte that came back was compared, and none differed
        assert c["bytes_checked"] == 2 * 8 * c["row_bytes"] and c["bytes_wrong"] == 0
    tier, tree = decisions["rows"]
    tier_s, tree_s, tree_again_s = data["tier_replay"]["s"], data["tree_replay"]["s"], data["tree_replay"]["s_again"]
    assert min(tier_s, tree_s, tree_again_s) > 0
    assert tier["requests/s"] == pytest.approx(60 / tier_s) and tier["calls/s"] > 0
    assert tier["ratio"] == pytest.approx(tree_s / tier_s)
    # The plain tree's own row: its first timing over a second, independent one (the noise floor);
    # it was written as the literal 1.0 before.
    assert tree["ratio"] == pytest.approx(tree_s / tree_again_s)
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


def test_a_load_back_that_did_not_land_fails_the_bench(monkeypatch, capsys):
    """The byte check can fail: load-backs that copy nothing leave the inverted rows in the pool."""
    from cpkv.tier.controller import CacheController

    real = CacheController._copy_layer

    def no_load_back(self, layer, copy, *, to_slab):
        if to_slab:
            real(self, layer, copy, to_slab=to_slab)

    monkeypatch.setattr(CacheController, "_copy_layer", no_load_back)
    argv = ["bench", "tier", "--pages", "8", "--node-pages", "4", "--layers", "2", "--repeats", "1",
            "--requests", "20", "--page-size", "4"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cpkv bench tier: K+V, 2 x 32 KB rows, cpu pools: " in err and "bytes loaded back differ" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_tier_on_cuda_checks_every_byte(tmp_path):
    out = tmp_path / "tier.json"
    argv = ["bench", "tier", "--device", "cuda", "--pages", "256", "--node-pages", "32", "--layers", "4",
            "--repeats", "2", "--requests", "60", "--page-size", "4", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    for c in data["copies"]:
        assert c["bytes_checked"] == 4 * 256 * c["row_bytes"] and c["bytes_wrong"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_bench_tier_on_cuda_refuses_without_a_gpu(capsys):
    assert main(["bench", "tier", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
