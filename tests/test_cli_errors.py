"""Bad command lines end in one ``cpkv: error:`` line and exit 2, never a traceback.

Each case runs the real CLI in a subprocess (``python -m cpkv``); the cases
run concurrently so the table stays cheap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO_ROOT, default_sigint

GOOD = json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]})
LINES = {
    "good.jsonl": [GOOD, GOOD],
    "empty.jsonl": [],
    "badjson.jsonl": [GOOD, GOOD, '{"timestamp": 3, "input_length":'],
    "negative.jsonl": [GOOD, json.dumps({"timestamp": 1, "input_length": -5, "output_length": 5, "hash_ids": []})],
}

# (name, argv with {d} for the data folder, text the one line must contain)
COMMON = [
    ("missing file", ["{d}/nope.jsonl"], "nope.jsonl"),
    ("directory", ["{d}"], "is a directory"),
    ("empty file", ["{d}/empty.jsonl"], "no trace records"),
    ("bad json, line 3", ["{d}/badjson.jsonl"], "badjson.jsonl:3:"),
    ("negative input_length, line 2", ["{d}/negative.jsonl"], "negative.jsonl:2:"),
    ("unknown policy", ["{d}/good.jsonl", "--policy", "lru,bogus"], "bogus"),
    ("--json into a missing folder", ["{d}/good.jsonl", "--json", "{d}/no/such/dir/out.json"], "does not exist"),
]
CAPACITIES = [("0", "not a positive integer"), ("-5", "not a positive integer"), ("nan", "not finite"),
              ("inf", "not finite"), ("1.5", "not a positive integer"), (",", "at least one")]

# The table the CLI must get right, run as real subprocesses ...
CASES = [(f"hitrate: {name}", ["hitrate", *argv], want) for name, argv, want in COMMON]
CASES += [(f"sweep: {name}", ["sweep", *argv], want) for name, argv, want in COMMON]
CASES += [(f"hitrate: capacity {c}", ["hitrate", "{d}/good.jsonl", f"--capacity={c}"], w) for c, w in CAPACITIES[:3]]
CASES += [(f"sweep: capacity {c}", ["sweep", "{d}/good.jsonl", f"--capacities={c}"], w) for c, w in CAPACITIES[:3]]
# ... and more of the same kind in-process through cpkv.cli.main (an interpreter start each costs ~0.6 s).
IN_PROCESS = [(f"hitrate: capacity {c}", ["hitrate", "{d}/good.jsonl", f"--capacity={c}"], w) for c, w in CAPACITIES[3:]]
IN_PROCESS += [(f"sweep: capacity {c}", ["sweep", "{d}/good.jsonl", f"--capacities={c}"], w) for c, w in CAPACITIES[3:]]
IN_PROCESS += [
    ("hitrate: limit 0", ["hitrate", "{d}/good.jsonl", "--limit", "0"], "--limit"),
    ("sweep: limit -1", ["sweep", "{d}/good.jsonl", "--limit=-1"], "--limit"),
    ("hitrate: second trace missing", ["hitrate", "{d}/good.jsonl", "{d}/nope.jsonl"], "nope.jsonl"),
    ("sweep: --out-png into a missing folder", ["sweep", "{d}/good.jsonl", "--out-png", "{d}/no/p.png"], "--out-png"),
    ("sweep: --out-csv is a folder", ["sweep", "{d}/good.jsonl", "--out-csv", "{d}"], "is a directory"),
    ("sweep: grid 0", ["sweep", "{d}/good.jsonl", "--grid", "0"], "--grid"),
    ("sweep: grid -3", ["sweep", "{d}/good.jsonl", "--grid=-3"], "--grid"),
    ("sweep: generate 0", ["sweep", "--generate", "0"], "--generate"),
    ("sweep: generate and a trace", ["sweep", "{d}/good.jsonl", "--generate", "10"], "not both"),
    ("sweep: neither", ["sweep"], "neither"),
    ("sweep: unknown mix", ["sweep", "--generate", "10", "--mix", "nope"], "--mix"),
    ("sweep: negative seed", ["sweep", "--generate", "10", "--seed=-1"], "--seed"),
    ("sweep: a capacity list with junk", ["sweep", "--generate", "10", "--capacities", "10,x"], "'x'"),
]
# hitrate's multi-instance simulation: every value checked, and the options that need --instances
_SIM = ["hitrate", "{d}/good.jsonl"]
IN_PROCESS += [
    ("hitrate: instances 0", [*_SIM, "--instances", "0"], "--instances: 0 is out of range"),
    ("hitrate: instances -2", [*_SIM, "--instances=-2"], "--instances: -2 is out of range"),
    ("hitrate: instances above the limit", [*_SIM, "--instances", "1,100000"], "100000 is out of range"),
    ("hitrate: instances junk", [*_SIM, "--instances", "2,x"], "'x' is not an integer"),
    ("hitrate: instances nan", [*_SIM, "--instances", "nan"], "'nan' is not an integer"),
    ("hitrate: instances empty", [*_SIM, "--instances", ","], "has no value"),
    ("hitrate: cluster pages -1", [*_SIM, "--instances", "2", "--cluster-pages=-1"], "--cluster-pages: -1"),
    ("hitrate: cluster pages 1.5", [*_SIM, "--instances", "2", "--cluster-pages", "1.5"], "--cluster-pages: '1.5'"),
    ("hitrate: cluster pages inf", [*_SIM, "--instances", "2", "--cluster-pages", "inf"], "--cluster-pages: 'inf'"),
    ("hitrate: cluster pages above MAX_PAGES", [*_SIM, "--instances", "2", "--cluster-pages", str(1 << 62)],
     f"--cluster-pages: {1 << 62} is out of range"),
    ("hitrate: host pages -3", [*_SIM, "--instances", "2", "--host-pages=-3"], "--host-pages: -3"),
    ("hitrate: unknown split", [*_SIM, "--instances", "2", "--split", "session"], "'session'"),
    ("hitrate: root blocks 0", [*_SIM, "--instances", "2", "--root-blocks", "0"], "--root-blocks: 0"),
    ("hitrate: cluster pages without instances", [*_SIM, "--cluster-pages", "10"], "--cluster-pages needs --instances"),
    ("hitrate: split without instances", [*_SIM, "--split", "request"], "--split needs --instances"),
    ("hitrate: instances with grid", ["hitrate", "--generate", "10", "--grid", "--instances", "2"],
     "exclude each other"),
    ("hitrate: root blocks with round robin", [*_SIM, "--instances", "2", "--split", "request", "--root-blocks", "3"],
     "--root-blocks applies to --split prefix only"),
]


def cpkv(*argv: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cpkv", *argv], cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    for name, lines in LINES.items():
        (d / name).write_text("".join(line + "\n" for line in lines))
    return d


@pytest.fixture(scope="module")
def results(data):
    def one(case):
        proc = cpkv(*(a.format(d=data) for a in case[1]))
        out, err = proc.communicate(timeout=120)
        return proc.returncode, out, err

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip((c[0] for c in CASES), pool.map(one, CASES)))


def check(code: int, out: str, err: str, want: str) -> None:
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("cpkv: error: "), err
    assert want in lines[0], err
    assert code == 2, (code, err)


@pytest.mark.parametrize("name,argv,want", CASES, ids=[c[0] for c in CASES])
def test_bad_command_line_is_one_line_exit_2(results, name, argv, want):
    check(*results[name], want)


@pytest.mark.parametrize("name,argv,want", IN_PROCESS, ids=[c[0] for c in IN_PROCESS])
def test_bad_command_line_in_process(data, capsys, name, argv, want):
    from cpkv.cli import main

    code = main([a.format(d=data) for a in argv])
    out, err = capsys.readouterr()
    check(code, out, err, want)


def test_the_good_trace_runs(tmp_path):
    # The small trace the table uses is fine: the errors above come from the bad input alone.
    good = tmp_path / "good.jsonl"
    good.write_text("".join(line + "\n" for line in LINES["good.jsonl"]))
    proc = cpkv("sweep", str(good), "--capacities", "1,2", "--policy", "lru")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "belady" in out


def test_keyboard_interrupt_is_one_line_exit_130(monkeypatch, capsys):
    import cpkv.sweep
    from cpkv.cli import main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cpkv.sweep, "run", interrupted)
    assert main(["sweep", "--generate", "5"]) == 130
    err = capsys.readouterr().err
    assert err.splitlines() == ["cpkv: interrupted"]


def test_sigint_exits_130_with_one_line(tmp_path):
    # The child blocks opening a FIFO nobody writes to, so the signal lands in the command's run
    # (not in interpreter start-up, and not inside an extension call) every time. The loader's
    # open says "ready" just before it blocks: any signal after that line lands inside the command.
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    code = ("import builtins, sys, cpkv.traces; from cpkv.cli import main\n"
            "def announcing_open(*args, **kwargs):\n"
            "    print('ready', flush=True)\n"
            "    return builtins.open(*args, **kwargs)\n"
            "cpkv.traces.open = announcing_open\n"
            f"sys.exit(main(['hitrate', {str(fifo)!r}]))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, text=True, preexec_fn=default_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.splitlines() == ["cpkv: interrupted"]
