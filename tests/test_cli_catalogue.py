"""A catalogue of bad command lines across every ``cpkv`` command.

Each runs the real CLI in a subprocess with a time limit (a NaN that loops forever fails here by
timing out) and must end with exit code 2 and exactly one line on stderr, ``cpkv: error: ...``,
naming what is wrong: never a traceback, never a usage block, never exit 0 on nonsense.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO_ROOT

TIME_LIMIT_S = 90


def _rec(ts, inp=1000, out=5, ids=(0, 1)):
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": list(ids)})


FILES = {
    "good.jsonl": [_rec(0), _rec(10, ids=(0, 2))],
    "empty.jsonl": [],
    "badjson.jsonl": [_rec(0), _rec(1), '{"timestamp": 3, "input_length":'],
    "negative.jsonl": [_rec(0), _rec(1, inp=-5)],
    "unsorted.jsonl": [_rec(100), _rec(50), _rec(10)],
    "missingkey.jsonl": [_rec(0), json.dumps({"timestamp": 1, "input_length": 5})],
    "array.jsonl": [_rec(0), "[1, 2, 3]"],
    "nants.jsonl": [_rec(0), '{"timestamp": NaN, "input_length": 5, "output_length": 1, "hash_ids": [0]}'],
}
BINARY = {"binary.jsonl": b'{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}\n\xff\xfe\n'}

TRACE_FILE_CASES = [
    ("missing file", "{d}/nope.jsonl", "nope.jsonl"),
    ("directory", "{d}", "is a directory"),
    ("empty file", "{d}/empty.jsonl", "no trace records"),
    ("malformed JSON, line 3", "{d}/badjson.jsonl", "badjson.jsonl:3:"),
    ("negative input_length, line 2", "{d}/negative.jsonl", "negative.jsonl:2:"),
    ("unsorted timestamps, line 2", "{d}/unsorted.jsonl", "unsorted.jsonl:2:"),
    ("missing key, line 2", "{d}/missingkey.jsonl", "missingkey.jsonl:2:"),
    ("a JSON array, line 2", "{d}/array.jsonl", "array.jsonl:2:"),
    ("NaN timestamp, line 2", "{d}/nants.jsonl", "nants.jsonl:2:"),
    ("not UTF-8, line 2", "{d}/binary.jsonl", "binary.jsonl:2:"),
]
GOOD = "{d}/good.jsonl"
NO_DIR = "{d}/no/such/dir/out.json"

CASES: list[tuple[str, list[str], str]] = []
# Every trace-reading command, every broken trace.
for _cmd, _argv in (("hitrate", lambda t: ["hitrate", t]), ("sweep", lambda t: ["sweep", t]),
                    ("schedsim", lambda t: ["schedsim", t]), ("replay", lambda t: ["replay", "--trace", t])):
    CASES += [(f"{_cmd}: {name}", _argv(path), want) for name, path, want in TRACE_FILE_CASES]
# --json into a missing folder, or onto a folder, for every command.
_EVERY = {
    "hitrate": ["hitrate", GOOD], "sweep": ["sweep", GOOD], "schedsim": ["schedsim", GOOD],
    "replay": ["replay"], "bench allocator": ["bench", "allocator"], "bench evict": ["bench", "evict"],
    "bench compose": ["bench", "compose"], "bench compose-gpu": ["bench", "compose-gpu"],
    "bench tier": ["bench", "tier"],
}
CASES += [(f"{c}: --json into a missing folder", [*a, "--json", NO_DIR], "does not exist") for c, a in _EVERY.items()]
CASES += [(f"{c}: --json is a folder", [*a, "--json", "{d}"], "is a directory") for c, a in _EVERY.items()]
CASES += [
    # the top level
    ("no command", [], "COMMAND"),
    ("unknown command", ["nope"], "nope"),
    ("bench without a name", ["bench"], "NAME"),
    ("unknown bench", ["bench", "nope"], "nope"),
    ("unknown option", ["hitrate", GOOD, "--frobnicate"], "--frobnicate"),
    # hitrate
    ("hitrate: unknown policy", ["hitrate", GOOD, "--policy", "lru,bogus"], "bogus"),
    ("hitrate: capacity 0", ["hitrate", GOOD, "--capacity=0"], "0"),
    ("hitrate: capacity -5", ["hitrate", GOOD, "--capacity=-5"], "-5"),
    ("hitrate: capacity nan", ["hitrate", GOOD, "--capacity=nan"], "not finite"),
    ("hitrate: limit 0", ["hitrate", GOOD, "--limit", "0"], "--limit"),
    # sweep
    ("sweep: capacities 0", ["sweep", GOOD, "--capacities=0"], "0"),
    ("sweep: grid -3", ["sweep", GOOD, "--grid=-3"], "--grid"),
    ("sweep: unknown policy", ["sweep", GOOD, "--policy", "nope"], "nope"),
    ("sweep: generate nan", ["sweep", "--generate", "nan"], "--generate"),
    ("sweep: generate -1", ["sweep", "--generate=-1"], "--generate"),
    # schedsim: non-finite and out-of-range numbers
    ("schedsim: load nan", ["schedsim", GOOD, "--load", "nan"], "--load"),
    ("schedsim: load inf", ["schedsim", GOOD, "--load", "inf"], "--load"),
    ("schedsim: load 0", ["schedsim", GOOD, "--load", "0"], "--load"),
    ("schedsim: load -1", ["schedsim", GOOD, "--load=-1"], "--load"),
    ("schedsim: load junk", ["schedsim", GOOD, "--load", "high"], "--load"),
    ("schedsim: speedup nan", ["schedsim", GOOD, "--speedup", "nan"], "--speedup"),
    ("schedsim: speedup 0", ["schedsim", GOOD, "--speedup", "0"], "--speedup"),
    ("schedsim: extend-us nan", ["schedsim", GOOD, "--extend-us", "nan"], "--extend-us"),
    ("schedsim: extend-us -1", ["schedsim", GOOD, "--extend-us=-1"], "--extend-us"),
    ("schedsim: fixed-ms inf", ["schedsim", GOOD, "--fixed-ms", "inf"], "--fixed-ms"),
    ("schedsim: cached-us nan", ["schedsim", GOOD, "--cached-us", "nan"], "--cached-us"),
    ("schedsim: all costs zero", ["schedsim", GOOD, "--fixed-ms", "0", "--extend-us", "0", "--cached-us", "0"],
     "cost"),
    ("schedsim: age-bound nan", ["schedsim", GOOD, "--age-bound-s", "nan"], "--age-bound-s"),
    ("schedsim: limit 0", ["schedsim", GOOD, "--limit", "0"], "--limit"),
    ("schedsim: page-size 0", ["schedsim", GOOD, "--page-size", "0"], "--page-size"),
    ("schedsim: extend-cap 0", ["schedsim", GOOD, "--extend-cap", "0"], "--extend-cap"),
    ("schedsim: cached-cap -1", ["schedsim", GOOD, "--cached-cap=-1"], "--cached-cap"),
    ("schedsim: cache-blocks -5", ["schedsim", GOOD, "--cache-blocks=-5"], "--cache-blocks"),
    ("schedsim: floor -1", ["schedsim", GOOD, "--floor=-1"], "--floor"),
    ("schedsim: skip-window -1", ["schedsim", GOOD, "--skip-window=-1"], "--skip-window"),
    ("schedsim: defer-limit -1", ["schedsim", GOOD, "--defer-limit=-1"], "--defer-limit"),
    # replay
    ("replay: ranks 0", ["replay", "--ranks", "0"], "--ranks"),
    ("replay: ranks 99", ["replay", "--ranks", "99"], "--ranks"),
    ("replay: layers 0", ["replay", "--layers", "0"], "--layers"),
    ("replay: unknown policy", ["replay", "--policy", "bogus"], "bogus"),
    ("replay: timeout nan", ["replay", "--timeout", "nan"], "--timeout"),
    ("replay: payloads junk", ["replay", "--payloads", "kv"], "--payloads"),
    ("replay: device-pages 0", ["replay", "--device-pages", "0"], "--device-pages"),
    ("replay: requests 0", ["replay", "--requests", "0"], "--requests"),
    ("replay: requests -1", ["replay", "--requests=-1"], "--requests"),
    ("replay: seed -1", ["replay", "--seed=-1"], "--seed"),
    ("replay: unknown device", ["replay", "--device", "tpu"], "--device"),
    ("replay: l3-dir without l3-bytes", ["replay", "--l3-dir", "/tmp"], "--l3-dir needs --l3-bytes"),
    ("replay: l3-bytes without l3-dir", ["replay", "--l3-bytes", "1000000"], "--l3-bytes needs --l3-dir"),
    ("replay: l3-bytes 0", ["replay", "--l3-dir", "/tmp", "--l3-bytes", "0"], "--l3-bytes: 0 is out of range"),
    ("replay: l3-dir missing", ["replay", "--l3-dir", "/nonexistent/cpkv-l3", "--l3-bytes", "1000000"],
     "not an existing directory"),
    ("replay: l3-bytes below one page", ["replay", "--l3-dir", "/tmp", "--l3-bytes", "4096"], "holds no page"),
    # bench allocator
    ("bench allocator: occupancy 2", ["bench", "allocator", "--occupancy", "2"], "--occupancy"),
    ("bench allocator: occupancy nan", ["bench", "allocator", "--occupancy", "nan"], "--occupancy"),
    ("bench allocator: occupancy -0.1", ["bench", "allocator", "--occupancy=-0.1"], "--occupancy"),
    ("bench allocator: steps -1", ["bench", "allocator", "--steps=-1"], "--steps"),
    ("bench allocator: steps 0", ["bench", "allocator", "--steps", "0"], "--steps"),
    ("bench allocator: batch 0", ["bench", "allocator", "--batch", "0"], "--batch"),
    ("bench allocator: max-pages 0", ["bench", "allocator", "--max-pages", "0"], "--max-pages"),
    ("bench allocator: repeat 0", ["bench", "allocator", "--repeat", "0"], "--repeat"),
    ("bench allocator: seed -1", ["bench", "allocator", "--seed=-1"], "--seed"),
    ("bench allocator: pools junk", ["bench", "allocator", "--pools", "kv"], "--pools"),
    ("bench allocator: pools capacity 0", ["bench", "allocator", "--pools", "kv=0"], "--pools"),
    ("bench allocator: pools capacity -5", ["bench", "allocator", "--pools", "kv=-5"], "--pools"),
    ("bench allocator: unknown workload", ["bench", "allocator", "--workload", "nope"], "--workload"),
    # bench evict
    ("bench evict: leaves 0", ["bench", "evict", "--leaves", "0"], "--leaves"),
    ("bench evict: leaves -5", ["bench", "evict", "--leaves=-5"], "--leaves"),
    ("bench evict: page-size 0", ["bench", "evict", "--page-size", "0"], "--page-size"),
    ("bench evict: calls 0", ["bench", "evict", "--calls", "0"], "--calls"),
    ("bench evict: calls over leaves", ["bench", "evict", "--leaves", "10", "--calls", "20"], "--calls"),
    ("bench evict: baseline-calls -1", ["bench", "evict", "--baseline-calls=-1"], "--baseline-calls"),
    # bench compose (and its GPU sibling, which validates before looking for a GPU)
    ("bench compose: cp 0", ["bench", "compose", "--cp", "0"], "--cp"),
    ("bench compose: cp nan", ["bench", "compose", "--cp", "nan"], "--cp"),
    ("bench compose: cp 99", ["bench", "compose", "--cp", "99"], "--cp"),
    ("bench compose: requests 0", ["bench", "compose", "--requests", "0"], "--requests"),
    ("bench compose: prefix-pages -1", ["bench", "compose", "--prefix-pages=-1"], "--prefix-pages"),
    ("bench compose: page-bytes 0", ["bench", "compose", "--page-bytes", "0"], "--page-bytes"),
    ("bench compose: layers 0", ["bench", "compose", "--layers", "0"], "--layers"),
    ("bench compose: gather-reps 0", ["bench", "compose", "--gather-reps", "0"], "--gather-reps"),
    ("bench compose: out-of-cache-reps 0", ["bench", "compose", "--out-of-cache-reps", "0"], "--out-of-cache-reps"),
    ("bench compose-gpu: cp 0", ["bench", "compose-gpu", "--cp", "0"], "--cp"),
    ("bench compose-gpu: layers -1", ["bench", "compose-gpu", "--layers=-1"], "--layers"),
    # bench tier
    # The core venv has no vLLM: the one line says so (tests_vllm checks its bad arguments).
    ("bench vllm: vllm not installed here", ["bench", "vllm", "--requests", "0"], "vllm==0.33.0"),
    # bench sglang checks its arguments first, then says that the core venv has no SGLang.
    ("bench sglang: sglang not installed here", ["bench", "sglang"], "sglang==0.5.23"),
    ("bench sglang: cp 1", ["bench", "sglang", "--cp", "1"], "--cp"),
    ("bench sglang: page-kb not a power of 2", ["bench", "sglang", "--page-kb", "48"], "--page-kb"),
    ("bench sglang: slab-fraction nan", ["bench", "sglang", "--slab-fraction", "nan"], "--slab-fraction"),
    ("bench sglang: dsa-cp 1", ["bench", "sglang", "--dsa-cp", "1"], "--dsa-cp"),
    ("bench sglang: dsa-cp 16", ["bench", "sglang", "--dsa-cp", "2,16"], "--dsa-cp"),
    ("bench sglang: dsa-requests 0", ["bench", "sglang", "--dsa-requests", "0"], "--dsa-requests"),
    ("bench tree-memory: ops 0", ["bench", "tree-memory", "--ops", "0"], "--ops"),
    ("bench tree-memory: live nan", ["bench", "tree-memory", "--live", "nan"], "--live"),
    ("bench tree-memory: json into a missing folder", ["bench", "tree-memory", "--ops", "1", "--json",
                                                       "/nonexistent/dir/x.json"], "--json"),
    ("bench tier: pages 0", ["bench", "tier", "--pages", "0"], "--pages"),
    ("bench tier: node-pages not dividing pages", ["bench", "tier", "--pages", "10", "--node-pages", "3"],
     "--node-pages"),
    ("bench tier: layers 0", ["bench", "tier", "--layers", "0"], "--layers"),
    ("bench tier: device-fraction nan", ["bench", "tier", "--device-fraction", "nan"], "--device-fraction"),
    ("bench tier: device-fraction 2", ["bench", "tier", "--device-fraction", "2"], "--device-fraction"),
    ("bench tier: page-size 0", ["bench", "tier", "--page-size", "0"], "--page-size"),
    ("bench tier: unknown device", ["bench", "tier", "--device", "tpu"], "--device"),
    ("cluster serve: port 0", ["cluster", "serve", "--port", "0"], "--port"),
    ("cluster serve: metadata-port junk", ["cluster", "serve", "--metadata-port", "x"], "--metadata-port"),
    ("cluster serve: bytes 12", ["cluster", "serve", "--bytes", "12"], "--bytes"),
    ("cluster serve: bytes nan", ["cluster", "serve", "--bytes", "nan"], "--bytes"),
    ("bench cluster: batch 0", ["bench", "cluster", "--batch", "0"], "--batch"),
    ("bench cluster: batches nan", ["bench", "cluster", "--batches", "nan"], "--batches"),
    ("bench cluster: json into a missing folder", ["bench", "cluster", "--json", NO_DIR], "--json"),
    ("bench cluster: requests -1", ["bench", "cluster", "--requests", "-1"], "--requests"),
    ("bench cluster: seed junk", ["bench", "cluster", "--seed", "x"], "--seed"),
    ("replay: cluster-master without its metadata", ["replay", "--cluster-master", "127.0.0.1:1"],
     "--cluster-metadata"),
    ("replay: cluster-master not host:port", ["replay", "--cluster-master", "nohost", "--cluster-metadata",
                                              "http://127.0.0.1:1/metadata"], "--cluster-master"),
    ("replay: cluster-metadata not a url", ["replay", "--cluster-master", "127.0.0.1:1", "--cluster-metadata", "x"],
     "--cluster-metadata"),
    ("replay: cluster-bytes alone", ["replay", "--cluster-bytes", "5"], "--cluster-bytes"),
    ("replay: cluster-bytes -1", ["replay", "--cluster-bytes", "-1"], "--cluster-bytes"),
    ("replay: cluster-put bogus", ["replay", "--cluster-put", "bogus"], "--cluster-put"),
    ("replay: cluster master down", ["replay", "--cluster-master", "127.0.0.1:1", "--cluster-metadata",
                                     "http://127.0.0.1:1/metadata"], "--cluster-master 127.0.0.1:1"),
    ("bench l3: no --dir", ["bench", "l3"], "--dir"),
    ("bench l3: --dir missing", ["bench", "l3", "--dir", "{d}/no/such/dir"], "--dir"),
    ("bench l3: --dir is a file", ["bench", "l3", "--dir", GOOD], "--dir"),
    ("bench l3: mib 0", ["bench", "l3", "--dir", "{d}", "--mib", "0"], "--mib"),
    ("bench l3: batch-mib nan", ["bench", "l3", "--dir", "{d}", "--batch-mib", "nan"], "--batch-mib"),
    ("bench l3: commit-mib 0", ["bench", "l3", "--dir", "{d}", "--commit-mib", "0"], "--commit-mib"),
    ("bench l3: recovery-pages -1", ["bench", "l3", "--dir", "{d}", "--recovery-pages", "-1"], "--recovery-pages"),
    ("bench l3: repeat 0", ["bench", "l3", "--dir", "{d}", "--repeat", "0"], "--repeat"),
    ("bench l3: json into a missing folder", ["bench", "l3", "--dir", "{d}", "--json", NO_DIR], "--json"),
]
assert len({name for name, _, _ in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    d = tmp_path_factory.mktemp("catalogue")
    for name, lines in FILES.items():
        (d / name).write_text("".join(line + "\n" for line in lines))
    for name, data in BINARY.items():
        (d / name).write_bytes(data)

    def one(case):
        name, argv, _ = case
        try:
            proc = subprocess.run([sys.executable, "-m", "cpkv", *(a.format(d=d) for a in argv)], cwd=REPO_ROOT,
                                  text=True, capture_output=True, timeout=TIME_LIMIT_S)
        except subprocess.TimeoutExpired:
            return name, (None, "", f"no answer within {TIME_LIMIT_S} s")
        return name, (proc.returncode, proc.stdout, proc.stderr)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, CASES))


def test_the_catalogue_is_large_and_covers_every_command():
    from cpkv.cli import COMMANDS

    assert len(CASES) >= 60
    for words, _, _ in COMMANDS:
        command = " ".join(words)
        assert any(name.startswith(command + ":") for name, _, _ in CASES), command


@pytest.mark.parametrize("name,argv,want", CASES, ids=[c[0] for c in CASES])
def test_bad_invocation_is_one_line_and_exit_2(outcomes, name, argv, want):
    code, out, err = outcomes[name]
    assert code is not None, err  # answered within the time limit
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("cpkv: error: "), err
    assert want in lines[0], err
    assert code == 2, (code, err)


def _help_command_lines() -> list[tuple[str, ...]]:
    """Every command of the catalogue, every command group, and the top level."""
    from cpkv.cli import COMMANDS

    lines: list[tuple[str, ...]] = [()]
    for words, _, _ in COMMANDS:
        for n in range(1, len(words) + 1):
            if words[:n] not in lines:
                lines.append(words[:n])
    return lines


HELP_LINES = _help_command_lines()


@pytest.fixture(scope="module")
def help_outcomes():
    def one(words):
        try:
            proc = subprocess.run([sys.executable, "-m", "cpkv", *words, "--help"], cwd=REPO_ROOT, text=True,
                                  capture_output=True, timeout=TIME_LIMIT_S)
        except subprocess.TimeoutExpired:
            return words, (None, "", f"no answer within {TIME_LIMIT_S} s")
        return words, (proc.returncode, proc.stdout, proc.stderr)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, HELP_LINES))


def test_help_covers_every_command():
    from cpkv.cli import COMMANDS

    assert {words for words, _, _ in COMMANDS} <= set(HELP_LINES)


@pytest.mark.parametrize("words", HELP_LINES, ids=[" ".join(w) or "cpkv" for w in HELP_LINES])
def test_help_of_every_command_exits_0_without_a_traceback(help_outcomes, words):
    code, out, err = help_outcomes[words]
    assert code == 0, (code, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert err == "", err
    assert out.startswith("usage: cpkv" + "".join(" " + w for w in words)), out[:200]
