from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def trace_dir() -> Path | None:
    """The bundled Mooncake traces: $CPKV_TRACES, else ../shared/traces beside the repo."""
    for candidate in (os.environ.get("CPKV_TRACES"), REPO_ROOT.parent / "shared" / "traces"):
        if candidate and (Path(candidate) / "conversation_trace.jsonl").exists():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def traces() -> Path:
    found = trace_dir()
    if found is None:
        pytest.skip("Mooncake traces not found (set CPKV_TRACES)")
    return found


def default_sigint() -> None:
    """`preexec_fn` for children the tests interrupt: a harness that started the suite in the
    background (where a shell ignores SIGINT) would pass that on, and a Python started with SIGINT
    ignored never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
