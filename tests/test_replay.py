"""``cpkv replay``: the whole system end to end, its failure modes and its command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import default_sigint, descendants, maps_shm, process_alive, wait_for
from cpkv.replay import ReplayOptions
from cpkv.replay.options import parse_payloads
from cpkv.runtime.launch import run_ranks
from cpkv.workload import generate

pytestmark = pytest.mark.slow


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpkv", *args], capture_output=True, text=True, timeout=timeout)


def _shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("cpkv")}


def test_the_default_replay_end_to_end(tmp_path: Path) -> None:
    before = _shm_names()
    out = tmp_path / "report.json"
    done = _cli("replay", "--limit", "120", "--device-pages", "96", "--host-pages", "400", "--quiet",
                "--json", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())["report"]
    assert report["verification failures (pages)"] == 0
    assert report["verified_bytes"] == report["composed_bytes"] > 0
    assert report["agreement checks passed"] > 0
    assert 0 <= report["prefix hit rate: total"] <= 1
    assert report["prefix hit rate: host"] > 0, "the run should exercise the host tier"
    assert "ranks differ" not in report["final digest"]
    # What the device path adds to the report, measured on the CPU path the same way.
    for key in ("ms per forward (slowest rank)", "compose GB/s per rank",
                "ms in compose barriers per forward (slowest rank)", "backup GB/s per rank", "load-back GB/s per rank"):
        assert report[key] > 0, key
    again = _cli("replay", "--limit", "120", "--device-pages", "96", "--host-pages", "400", "--quiet")
    assert report["final digest"] in again.stdout, "same seed and options, same digest"
    assert _shm_names() <= before


def _options(**changes) -> ReplayOptions:
    base = dict(payloads=parse_payloads("kv:4x8:float8_e4m3fn,index:16:bfloat16"), device_pages=64, host_pages=256,
                check_every=1, progress=False, timeout_s=20.0)
    base.update(changes)
    return ReplayOptions(**base)


def _corrupting_rank(rank: int, world: int, options: ReplayOptions, requests: list) -> dict:
    from cpkv.replay import rank as replay_rank_module

    def corrupt(forward: int, payload: str, layer: int, dense) -> None:
        if rank == 1 and forward == 3 and payload == "index" and layer == 1:
            dense[0, 5] ^= 0xFF  # one byte of one composed page

    replay_rank_module.after_compose = corrupt
    return replay_rank_module.replay_rank(rank, world, options, requests)


def test_a_corrupted_page_is_reported_as_a_verification_failure() -> None:
    from cpkv.replay.report import report

    requests = [r.hash_ids for r in generate(40, 3)]
    options = _options()
    results = run_ranks(_corrupting_rank, 2, options, requests, timeout_s=120)
    assert [r["verification_failures"] for r in results] == [0, 1]
    assert results[1]["verified_bytes"] < results[1]["composed_bytes"]
    assert report(options, requests, results, 1.0, None) == 1  # the command's exit code


def test_one_rank_on_another_workload_is_stopped_by_the_agreement_check() -> None:
    from cpkv.replay import run_replay

    ours = [r.hash_ids for r in generate(40, 1)]
    theirs = [r.hash_ids for r in generate(40, 2)]
    started = time.monotonic()
    results = run_replay(_options(), [ours, theirs])
    assert time.monotonic() - started < 60, "not a hang"
    assert all(isinstance(r, str) and r.startswith("DivergenceError") for r in results), results


# A trace that once fooled replay: a 3-block request, six one-block fillers, then a 3-block request whose
# ids differ from the first's by 2**60 (id * 16 wrapped in int64 onto the first's tokens, a false 0.250
# device hit rate with no failed byte). LAST_CONTROL repeats the first request, LAST_PLAIN is an unrelated one.
LAST_ALIASED, LAST_PLAIN, LAST_CONTROL = [1 + 2**60, 2 + 2**60, 3 + 2**60], [21, 22, 23], [1, 2, 3]


def _aliasing_trace(last: list[int]) -> list[tuple[int, ...]]:
    return [(1, 2, 3), *((100 + i,) for i in range(6)), tuple(last)]


def _write_trace(path: Path, requests: list[tuple[int, ...]]) -> Path:
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(ids), "output_length": 1,
                                        "hash_ids": list(ids)}) + "\n" for i, ids in enumerate(requests)))
    return path


def test_block_ids_past_int64_token_arithmetic_do_not_alias(tmp_path: Path) -> None:
    reports = {}
    for name, last in (("aliased", LAST_ALIASED), ("plain", LAST_PLAIN), ("control", LAST_CONTROL)):
        trace = _write_trace(tmp_path / f"{name}.jsonl", _aliasing_trace(last))
        out = tmp_path / f"{name}.json"
        done = _cli("replay", "--quiet", "--trace", str(trace), "--json", str(out))
        assert done.returncode == 0, done.stderr
        reports[name] = json.loads(out.read_text())["report"]
        assert reports[name]["verification failures (pages)"] == 0
    rates = ("prefix hit rate: device", "prefix hit rate: host", "prefix hit rate: total",
             "prefix hit rate with no host tier")
    assert [reports["aliased"][k] for k in rates] == [reports["plain"][k] for k in rates] == [0.0] * 4
    # Not vacuous: the same run does see the repeated request (3 of 12 blocks on the device).
    assert reports["control"]["prefix hit rate: device"] == 0.25
    assert reports["control"]["prefix hit rate with no host tier"] == 0.25


def _wrapping_rank(rank: int, world: int, options: ReplayOptions, requests: list) -> dict:
    import numpy as np

    from cpkv.replay import rank as replay_rank_module

    def wrapping_tokens(hash_ids, page):  # the old mapping: id * page in int64, which wraps
        blocks = np.asarray(hash_ids, dtype=np.int64)
        with np.errstate(over="ignore"):
            return (blocks[:, None] * page + np.arange(page, dtype=np.int64)[None, :]).reshape(-1)

    replay_rank_module.block_tokens = wrapping_tokens
    return replay_rank_module.replay_rank(rank, world, options, requests)


def test_the_byte_check_sees_a_page_served_for_another_block() -> None:
    # With tokens that alias again, the cache serves block 1's pages for block 1 + 2**60: the
    # expected bytes (computed without that arithmetic) must disagree with them.
    results = run_ranks(_wrapping_rank, 2, _options(), _aliasing_trace(LAST_ALIASED), timeout_s=120)
    assert sum(r["verification_failures"] for r in results) > 0
    assert sum(r["device_hit_blocks"] for r in results[:1]) == 3


def test_expected_rows_tell_every_block_layer_and_payload_apart() -> None:
    import numpy as np

    from cpkv.replay.kv_rows import kv_rows
    from cpkv.replay.options import KV_ROW_MIN_BYTES

    ids = np.array([0, 1, 2, 1 + 2**60, 2**32 + 1, 2**63 - 1, 251, 252, 2**8, 2**16], dtype=np.int64)
    seen = {}
    for row_bytes in (KV_ROW_MIN_BYTES, 17, 64):
        for layer in (0, 1, 97, 2**32 - 1):
            for payload in (0, 1, 13):
                for block, row in zip(ids.tolist(), kv_rows(ids, layer, payload, row_bytes)):
                    key = (row_bytes, row.tobytes())
                    assert seen.setdefault(key, (block, layer, payload)) == (block, layer, payload)
    assert len(seen) == 3 * 4 * 3 * len(ids)
    with pytest.raises(ValueError):
        kv_rows(ids, 0, 0, KV_ROW_MIN_BYTES - 1)


@pytest.mark.parametrize("args, message", [
    (["--trace", "/nonexistent/trace.jsonl"], "nonexistent"),
    (["--trace", "/tmp"], "directory"),
    (["--ranks", "0"], "--ranks"),
    (["--device-pages", "4"], "cannot hold one request"),
    (["--host-pages", "2"], "cannot hold one request"),
    (["--policy", "nope"], "nope"),
    (["--payloads", "kv:8x16:float9"], "float9"),
    (["--payloads", "kv:8xq:bfloat16"], "shape"),
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "1e15"], "--timeout must be a finite number of seconds in"),  # the one timeout rule
    (["--l3-dir", "/tmp", "--l3-bytes", str(2**63)], "--l3-bytes must be an int in [1, 2**63)"),  # the one L3 rule
    (["--limit", "-3"], "--limit"),
    (["--json", "/nonexistent/dir/out.json"], "does not exist"),
    (["--payloads", "kv:4:uint8"], "at least 16"),
])
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    done = _cli("replay", "--quiet", *args, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert message in lines[0]


def test_empty_and_malformed_traces(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n{oops\n')
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [9223372036854775808]}\n')
    for path, message in ((empty, "no"), (bad, ":2"), (huge, "huge.jsonl:1: bad trace record: hash_ids[0]")):
        done = _cli("replay", "--quiet", "--trace", str(path), timeout=120)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert message in done.stderr


def _start_replay(ranks: int, stderr) -> tuple[subprocess.Popen, list[int]]:
    """A long ``cpkv replay`` and its rank pids, once every rank maps its shared-memory segments
    (registration is done: the replay is running)."""
    proc = subprocess.Popen([sys.executable, "-m", "cpkv", "replay", "--quiet", "--ranks", str(ranks),
                             "--requests", "20000"], stdout=subprocess.DEVNULL, stderr=stderr,
                            preexec_fn=default_sigint)
    try:
        found = wait_for(lambda: (proc.poll() is None or _failed_early(proc))
                         and len(r := [d for d in descendants(proc.pid) if maps_shm(d)]) == ranks and r,
                         180, f"{ranks} ranks mapping their segments")
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return proc, sorted(found)


def _failed_early(proc: subprocess.Popen) -> bool:
    raise AssertionError(f"the replay ended before its ranks were up: exit {proc.returncode}")


def test_ctrl_c_stops_every_rank_and_leaves_no_shared_memory(tmp_path: Path) -> None:
    before = _shm_names()
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc, ranks = _start_replay(2, err)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    err = err_path.read_text()
    assert proc.returncode == 130, err
    assert err.splitlines() == ["cpkv: interrupted"], err
    wait_for(lambda: not any(process_alive(pid) for pid in ranks), 10, "the ranks to exit")
    wait_for(lambda: _shm_names() <= before, 10, "the run's /dev/shm names to go")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_the_replay_leaves_no_rank_alive_and_nothing_in_dev_shm(tmp_path: Path, sig: int) -> None:
    before = _shm_names()
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc, ranks = _start_replay(4, err)
    proc.send_signal(sig)
    proc.wait(timeout=30)
    started = time.monotonic()
    try:
        wait_for(lambda: not any(process_alive(pid) for pid in ranks), 10, f"ranks {ranks} to exit")
    finally:
        for pid in ranks:  # only if the test failed: no orphan outlives it
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - started < 10
    assert _shm_names() <= before
    assert err_path.read_text() == ""  # quietly: no BrokenPipeError, no traceback


def test_a_killed_rank_is_named_within_seconds(tmp_path: Path) -> None:
    before = _shm_names()
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc, ranks = _start_replay(4, err)
    os.kill(ranks[2], signal.SIGKILL)
    started = time.monotonic()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    elapsed = time.monotonic() - started
    err = err_path.read_text()
    assert proc.returncode == 1, err
    assert "Traceback" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("cpkv:")]
    assert len(ours) == 1 and ours[0].startswith("cpkv: replay failed: rank 2 died: killed by SIGKILL; "), err
    assert "did not complete within" not in ours[0], ours[0]  # the peers lost a connection, not a race
    assert elapsed < 20, elapsed  # the collective timeout is 60 s
    wait_for(lambda: not any(process_alive(pid) for pid in ranks), 10, "the other ranks to exit")
    assert _shm_names() <= before
