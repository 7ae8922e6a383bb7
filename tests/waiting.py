"""Waiting on a condition, and whether a process runs: helpers every suite shares (the engine
suites put this folder on their path)."""

from __future__ import annotations

from pathlib import Path


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.05):
    """Polls ``condition()`` until it returns something truthy (returned) or ``timeout_s`` passes
    (an AssertionError naming ``what``): tests wait on a state, never on the clock alone."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


def process_alive(pid: int) -> bool:
    """Running (a zombie is dead: it only waits to be reaped, which a container's init may never do)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
