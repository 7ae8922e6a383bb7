"""`cpkv bench l3` runs end to end at small sizes, checks every page it reads back, and writes every
number it prints; the ratios are quotients of measured times (no timing thresholds)."""

from __future__ import annotations

import json

import pytest

from cpkv.cli import main


def test_bench_l3_writes_json_and_cleans_up(tmp_path):
    out = tmp_path / "l3.json"
    work = tmp_path / "disk"
    work.mkdir()
    argv = ["bench", "l3", "--dir", str(work), "--mib", "8", "--batch-mib", "1", "--commit-mib", "4",
            "--recovery-pages", "5000", "--repeat", "1", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["command"] == "bench l3"
    io, floor, recovery = data["tables"]
    assert [row["page"] for row in floor["rows"]] == ["64KiB", "1024KiB"]
    assert [row["page"] for row in io["rows"]] == ["64KiB", "1024KiB"]
    for name, f in data["sizes"].items():
        assert f["wrong_pages"] == 0 and f["mode"] in ("o_direct", "buffered")
        assert f["write_ratio"] == pytest.approx(f["l3_write_gib_s"] / f["plain_write_gib_s"])
        assert f["group_write_ratio"] == pytest.approx(f["l3_group_write_gib_s"] / f["plain_write_gib_s"])
        assert f["read_ratio"] == pytest.approx(f["l3_read_gib_s"] / f["plain_read_gib_s"])
        assert f["pages"] * (65536 if name == "64KiB" else 1 << 20) == 8 << 20
        # The floor: both syncs measured, CPU measured, and each ceiling is what they leave of the plain time.
        assert f["data_fdatasync_ms"] > 0 and f["log_fdatasync_ms"] > 0
        assert f["l3_write_cpu_ms"] > 0 and f["l3_read_cpu_ms"] > 0 and f["plain_write_ms"] > 0
        syncs = f["data_fdatasync_ms"] + f["log_fdatasync_ms"]
        batches = f["pages"] // f["batch_pages"]
        groups = batches // f["group_commit_batches"]
        cpu_w = max(0.0, f["l3_write_cpu_ms"] - f["plain_write_cpu_ms"])
        cpu_r = max(0.0, f["l3_read_cpu_ms"] - f["plain_read_cpu_ms"])
        plain_w = f["plain_write_ms"]
        assert f["write_ratio"] == pytest.approx(plain_w / 1e3 * f["l3_write_gib_s"] / (8 / 1024))
        assert f["write_ratio_ceiling"] == pytest.approx(plain_w / (plain_w + batches * syncs))
        assert f["write_ratio_serial_ceiling"] == pytest.approx(plain_w / (plain_w + cpu_w + batches * syncs))
        assert f["group_write_ratio_ceiling"] == pytest.approx(plain_w / (plain_w + groups * syncs))
        assert f["group_write_ratio_serial_ceiling"] == pytest.approx(plain_w / (plain_w + cpu_w + groups * syncs))
        assert f["read_ratio_serial_ceiling"] == pytest.approx(f["plain_read_ms"] / (f["plain_read_ms"] + cpu_r))
    assert data["recovery"]["kept"] == 5000 and data["recovery"]["seconds"] > 0 and data["recovery"]["cpu_seconds"] > 0
    assert list(work.iterdir()) == []  # every file it made is gone
