"""The ``cpkv`` command line (``python -m cpkv COMMAND ...``).

Each command lives in its own module exposing ``configure(parser)`` and
``run(args) -> int``; modules are imported only when their command runs, so
``cpkv bench allocator`` never pays for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# (command words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("bench", "allocator"), "cpkv.bench.allocator", "PageAllocator against the pure-Python reference"),
    (("hitrate",), "cpkv.hitrate", "Replay a trace through PrefixTree: prefix hit rate per policy vs Belady"),
    (("bench", "evict"), "cpkv.bench.evict", "PrefixTree eviction against a heap rebuilt over all leaves per call"),
    (("schedsim",), "cpkv.scheduling.sim", "Replay a trace through the prefill batch-admission policies"),
    (("bench", "compose"), "cpkv.bench.compose", "Staged single-gather CP compose against the all-reduce compose"),
    (("bench", "compose-gpu"), "cpkv.bench.compose_gpu", "The compose on one GPU: 1..8 ranks, CUDA IPC + Triton gather"),
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cpkv", description=__doc__.splitlines()[0])
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
        _configure(cmd, module)
    return parser


def _configure(parser: argparse.ArgumentParser, module: str) -> None:
    # Argument definitions are cheap; the module keeps heavy imports inside run().
    importlib.import_module(module).configure(parser)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
