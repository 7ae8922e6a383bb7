"""Runs everywhere: without SGLang the suite says why it is skipped (a skip, not an error); inside
.venv-sglang a missing or wrong SGLang is a failure."""

import sys
from pathlib import Path

import pytest

from conftest import sglang_ready


def test_sglang_environment() -> None:
    reason = sglang_ready()
    if reason is None:
        return
    if Path(sys.prefix).name == ".venv-sglang":
        pytest.fail(f".venv-sglang is broken: {reason}")
    pytest.skip(reason)
