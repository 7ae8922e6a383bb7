"""An L3 page is served only under the KV cache format it was written in (``--kv-cache-dtype``).

SGLang's host pools hold every FP8 format as ``uint8``: a namespace built from the host pool alone
was the same under ``fp8_e4m3`` and ``fp8_e5m2``, and a server restarted under the other format
loaded the first one's pages. Each test fills an L3 directory through SGLang's own controller stack
(two gloo ranks) under one format, stops cleanly, then reopens copies of it under the same format
(every page served, byte-exact) and under another (nothing recovered, nothing served), each with
the ``ServerArgs`` SGLang publishes and the device pool its model runner makes of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import launch

L3_BYTES = 8 << 20


def _life(kv_cache_dtype: str, kv_dtype: str, **geometry: int) -> dict:
    return {"kv_cache_dtype": kv_cache_dtype, "kv_dtype": kv_dtype, "geometry": geometry}


def _run(tmp_path: Path, kind: str, fill: dict, reopen: list[dict]) -> list[dict]:
    (tmp_path / "l3").mkdir()
    results = launch(2, "l3_formats", kind=kind, pages=4096, model="test-model", l3_dir=str(tmp_path / "l3"),
                     l3_bytes=L3_BYTES, args={"fill": fill, "reopen": reopen})
    assert results[0]["reopened"] == results[1]["reopened"], "the ranks agree"
    filled, reopened = results[0]["filled"], results[0]["reopened"]
    for life in reopened:
        print(f"{kind}: filled under {fill['kv_cache_dtype']} ({fill['kv_dtype']}), reopened under "
              f"{life['kv_cache_dtype']} ({life['kv_dtype']}): {life['recovered']} pages recovered, "
              f"{life['hit_tokens']} hit tokens")
        assert life["page_bytes"] == filled["page_bytes"], "only the format differs, not the page's size"
        assert life["wrong"] == 0
    return reopened


def _served(life: dict) -> None:
    assert life["recovered"] > 0 and life["hit_tokens"] > 0, life


def _cold(life: dict) -> None:
    assert life["recovered"] == 0 and life["hit_tokens"] == 0, life


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_fp8_e4m3_pages_are_never_served_under_fp8_e5m2(tmp_path: Path, kind: str) -> None:
    same, other = _run(tmp_path, kind, _life("fp8_e4m3", "float8_e4m3fn"),
                       [_life("fp8_e4m3", "float8_e4m3fn"), _life("fp8_e5m2", "float8_e5m2")])
    _served(same)
    _cold(other)


@pytest.mark.timeout(900)
def test_auto_on_an_fp8_checkpoint_is_fp8_e4m3(tmp_path: Path) -> None:
    """``auto`` on a checkpoint that quantizes its KV cache to FP8 computes in float8_e4m3fn (SGLang's
    rule): its pages are served under an explicit ``fp8_e4m3`` and never under ``fp8_e5m2``."""
    same, other = _run(tmp_path, "gqa", _life("auto", "float8_e4m3fn"),
                       [_life("fp8_e4m3", "float8_e4m3fn"), _life("fp8_e5m2", "float8_e5m2")])
    _served(same)
    _cold(other)


@pytest.mark.timeout(900)
def test_fp8_pages_are_never_served_under_the_16_bit_dtype(tmp_path: Path) -> None:
    """fp8 with head_dim 16 and the model's float16 with head_dim 8: the same bytes per page, other
    formats (the host pools' store dtypes, uint8 and float16, told these two apart before too)."""
    same, other = _run(tmp_path, "gqa", _life("fp8_e4m3", "float8_e4m3fn", head_dim=16),
                       [_life("fp8_e4m3", "float8_e4m3fn", head_dim=16), _life("auto", "float16", head_dim=8)])
    _served(same)
    _cold(other)


@pytest.mark.parametrize(("stated", "kv_store_dtype", "named"), [
    ("fp8_e4m3", "uint8", "fp8_e4m3"), ("fp8_e5m2", "uint8", "fp8_e5m2"),
    ("auto", "uint8", "fp8_e4m3"),  # SGLang's auto on an FP8-quantized checkpoint
    ("auto", "bfloat16", "bfloat16"), ("bf16", "bfloat16", "bfloat16"), ("bfloat16", "bfloat16", "bfloat16"),
    ("auto", "float16", "float16")])
def test_each_format_has_one_name(stated: str, kv_store_dtype: str, named: str) -> None:
    import torch

    from cpkv.integrations.sglang.kv_format import kv_cache_format

    assert kv_cache_format(stated, getattr(torch, kv_store_dtype)) == named


def test_l3_without_sglangs_runtime_config_is_refused_by_name() -> None:
    """A backend built where SGLang published no runtime config (not in a scheduler) cannot name the
    KV format: refused, naming the setting, never a namespace without it."""
    import subprocess
    import sys

    code = ("from cpkv.errors import InvalidArgumentError\n"
            "from cpkv.integrations.sglang.kv_format import stated_kv_cache_dtype\n"
            "try:\n    stated_kv_cache_dtype()\nexcept InvalidArgumentError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "'cpkv_l3_dir'" in done.stdout and "--kv-cache-dtype" in done.stdout, done.stdout
