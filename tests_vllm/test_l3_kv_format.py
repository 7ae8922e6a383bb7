"""cpkv's L3 under vLLM serves a chunk only under the KV cache format it was written in
(``--kv-cache-dtype``, vLLM's ``cache_config.cache_dtype``): an engine fills a directory under one
format and stops cleanly; engines reopened on copies of it under the same format are served, byte
for byte, and under another (fp8_e5m2 for fp8_e4m3; for fp8, ``auto`` on a float16 model, which
vLLM resolves to the model's dtype) recover and serve nothing. The blocks keep their bytes across formats (more head elements in a narrower dtype), so
only the format tells the pages apart. Through vLLM's real Scheduler and OffloadingConnector
(tests_vllm/engine.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine import Engine, prompt
from test_l3 import BLOCKS, assert_exact, l3_extra, serve

SEEDS = (1, 2, 3)  # one prompt each on a 4-block host: each evicts the one before into L3


MODEL_DTYPE = "float16"  # a 16-bit model: "auto" is float16


def _fill(directory: Path, cache_dtype: str) -> int:
    eng = Engine(l3_extra(directory), model_dtype=MODEL_DTYPE, cache_dtype=cache_dtype)
    for seed in SEEDS:
        eng.add(f"r{seed}", prompt(seed, blocks=BLOCKS))
        eng.run()
    page_bytes = eng.page_bytes
    eng.close()
    return page_bytes


def _reopen(filled: Path, copy: Path, cache_dtype: str, page_bytes: int) -> tuple[int, int]:
    """(chunks recovered, blocks served) of an engine on a copy of ``filled`` under ``cache_dtype``;
    every block it serves is checked byte for byte."""
    shutil.copytree(filled, copy)
    eng = Engine(l3_extra(copy, host_blocks=16), model_dtype=MODEL_DTYPE, cache_dtype=cache_dtype)
    assert eng.page_bytes == page_bytes, "only the format differs, not the block's bytes"
    recovered = eng.manager.stats()["l3_recovered"]
    tokens = prompt(SEEDS[0], blocks=BLOCKS)
    hits, blocks = serve(eng, "again", tokens)
    assert_exact(eng, tokens, blocks, BLOCKS)
    eng.close()
    print(f"reopened under {cache_dtype}: {recovered} chunks recovered, {hits} blocks served")
    return recovered, hits


@pytest.mark.parametrize(("written", "other"), [("fp8_e4m3", "fp8_e5m2"), ("fp8_e5m2", "fp8_e4m3"),
                                                ("fp8_e4m3", "auto"), ("auto", "fp8_e4m3")])
def test_a_chunk_is_served_only_under_the_format_it_was_written_in(tmp_path: Path, written: str, other: str) -> None:
    filled = tmp_path / "filled"
    filled.mkdir()
    page_bytes = _fill(filled, written)
    recovered, hits = _reopen(filled, tmp_path / "same", written, page_bytes)
    assert recovered > 0 and hits > 0
    assert _reopen(filled, tmp_path / "other", other, page_bytes) == (0, 0)
