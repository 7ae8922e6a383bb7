"""A writer killed in the middle of a write: the others get a typed error within the timeout, no
torn page is served, and /dev/shm keeps nothing of the run."""

from __future__ import annotations

import os

import pytest

from harness import launch


@pytest.mark.timeout(600)
def test_writer_killed_mid_write() -> None:
    timeout_s = 5
    results = launch(2, "killed", kind="dsa", timeout_s=timeout_s)
    survivor, dead = results
    assert dead is None  # SIGKILLed before it could report
    assert survivor["broken"] is not None and survivor["broken"].startswith("CollectiveTimeoutError"), survivor
    assert survivor["after"] == "CollectiveTimeoutError"  # every later call refused: nothing served
    # The victim's first row was left mid-write, marked invalid (-handle), never readable.
    assert survivor["torn_rows"] >= 1, survivor
    # Within the backend's timeout (plus the stores before the kill), never SGLang's 30-minute one.
    assert survivor["seconds"] < timeout_s + 30, survivor
    leftovers = [n for n in os.listdir("/dev/shm") if survivor["run_id"] in n]
    assert leftovers == []
