"""Runs everywhere: without vLLM the suite says why it is skipped (a skip, not an error); inside
.venv-vllm a missing or wrong vLLM is a failure."""

import sys
from pathlib import Path

import pytest

from conftest import vllm_ready


def test_vllm_environment() -> None:
    reason = vllm_ready()
    if reason is None:
        return
    if Path(sys.prefix).name == ".venv-vllm":
        pytest.fail(f".venv-vllm is broken: {reason}")
    pytest.skip(reason)
