from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster_serve import served  # noqa: F401 (one `cluster serve` per module, for the cluster tier's tests)
from small_fs import small_disk  # noqa: F401 (the small tmpfs fixture of the disk tests)
from waiting import process_alive, wait_for  # noqa: F401 (every suite's; re-exported for this one's tests)

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


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] not in ("Z", "X"):
                parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def maps_shm(pid: int, prefix: str = "/dev/shm/cpkv") -> bool:
    """Whether ``pid`` maps a file whose path starts with ``prefix`` (a rank with its segments)."""
    try:
        return any(prefix in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    except OSError:
        return False
