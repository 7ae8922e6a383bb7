"""Ranks whose stores differ: the digest check raises DivergenceError on every rank."""

from __future__ import annotations

import pytest

from harness import launch


@pytest.mark.timeout(300)
def test_divergent_store_raises_on_every_rank() -> None:
    results = launch(2, "diverged")
    for res in results:
        assert res["error_seen"] is not None and res["error_seen"].startswith("DivergenceError"), res
        assert res["stats"]["broken"].startswith("DivergenceError")
