"""The ``cpkv`` command line (``python -m cpkv COMMAND ...``).

Each command lives in its own module exposing ``configure(parser)`` and
``run(args) -> int``, with its heavy imports inside ``run``. Only the module of
the command a command line names is imported (to define its arguments, then to
run it): ``cpkv --help`` imports none, and ``cpkv bench allocator`` never pays
for importing torch or any other command.

Bad input never ends in a traceback: a command's ``CpkvError``, ``OSError``
or ``ValueError`` is printed as one line ``cpkv: error: ...`` and exits 2;
argparse's own errors (a bad option, a value its ``type=`` from
:mod:`cpkv._args` refuses) are one such line too, without the usage block.
Ctrl-C exits 130 with one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn, Sequence

from cpkv import __version__
from cpkv.errors import CpkvError

# The top-level help shows this as it is: plain text, no markup.
DESCRIPTION = "cpkv: context-parallel ranks sharing one KV cache. Run a benchmark, a trace replay or an analysis."

# (command words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("bench", "allocator"), "cpkv.bench.allocator", "PageAllocator against the pure-Python reference"),
    (("hitrate",), "cpkv.hitrate", "Replay a trace through PrefixTree: prefix hit rate per policy vs Belady"),
    (("bench", "evict"), "cpkv.bench.evict", "PrefixTree.evict against SGLang-shaped heapify-once eviction and an O(1) LRU list"),
    (("schedsim",), "cpkv.scheduling.sim", "Replay a trace through the prefill batch-admission policies"),
    (("bench", "compose"), "cpkv.bench.compose", "Staged single-gather CP compose against the all-reduce compose"),
    (("bench", "compose-gpu"), "cpkv.bench.compose_gpu", "The compose on one GPU: 1..8 ranks, CUDA IPC + Triton gather"),
    (("bench", "tree-memory"), "cpkv.bench.tree_memory", "PrefixTree RSS under insert+evict churn at a fixed live size"),
    (("bench", "tier"), "cpkv.bench.tier", "Two-tier cache: backup/load-back vs a plain copy, decisions vs PrefixTree"),
    (("bench", "l3"), "cpkv.bench.l3", "The L3 disk tier: write/read vs plain O_DIRECT I/O of the same bytes, recovery at 1M pages"),
    (("replay",), "cpkv.replay", "The main job: CP ranks run the two-tier cache over a trace, every byte verified"),
    (("sweep",), "cpkv.sweep", "Hit rate over a grid of capacities x policies, Belady as the ceiling: PNG + CSV"),
    (("bench", "vllm"), "cpkv.bench.vllm", "cpkv's vLLM offloading manager vs vLLM's LRU and ARC CPU managers on a trace"),
    (("cluster", "serve"), "cpkv.tier.cluster.serve", "A local Mooncake cluster (master + one store server) for the cluster tier, in the foreground"),
    (("bench", "cluster"), "cpkv.bench.cluster", "The cluster tier's put/get on a local Mooncake store against raw batch_put_from/batch_get_into of the same pages"),
    (("bench", "sglang"), "cpkv.bench.sglang", "cpkv's HiCache storage backend vs SGLang's file backend and per-rank host pool: bytes, MIN-cut hits, copy speed"),
]


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line (no usage block): ``cpkv: error: COMMAND: ...``."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("cpkv").strip()
        text = " ".join(message.split())
        sys.stderr.write(f"cpkv: error: {command + ': ' if command else ''}{text}\n")
        sys.exit(2)


def _chosen_module(argv: Sequence[str]) -> str | None:
    """The module of the command ``argv`` names, if any. The top level has no options but --help and
    --version, so a command's words come first."""
    for words, module, _ in COMMANDS:
        if tuple(argv[: len(words)]) == words:
            return module
    return None


def _parser(chosen_module: str | None) -> argparse.ArgumentParser:
    """Every command is listed (for the help and for argparse's choices), but only the chosen one's
    arguments are defined: no other command module is imported."""
    parser = _OneLineParser(prog="cpkv", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"cpkv {__version__}")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module, help_text in COMMANDS:
        sub = top
        for word in words[:-1]:
            if word not in groups:
                group = top.add_parser(word, help=f"{word} commands")
                groups[word] = group.add_subparsers(dest=f"{word}_command", required=True, metavar="NAME")
            sub = groups[word]
        cmd = sub.add_parser(words[-1], help=help_text, description=help_text)
        cmd.set_defaults(_module=module)
        if module == chosen_module:
            importlib.import_module(module).configure(cmd)
    return parser


def error_line(exc: BaseException) -> str:
    """The one line shown for ``exc``: its message with newlines folded, never empty."""
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        text = f"{where}: {exc.strerror}" if where else exc.strerror
    else:
        text = str(exc)
    text = " ".join(text.split())
    return text or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            # argparse reports its own errors (one line, exit 2)
            args = _parser(_chosen_module(words)).parse_args(words)
        except SystemExit as stop:  # --help (0) or a bad command line (2): a code, for callers of main()
            return stop.code if isinstance(stop.code, int) else 2
        try:
            return int(importlib.import_module(args._module).run(args) or 0)
        except (CpkvError, OSError, ValueError) as exc:
            print(f"cpkv: error: {error_line(exc)}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print("cpkv: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
