"""``cpkv replay``: a multi-rank CP cache run over a trace, every composed byte verified.

``--ranks`` real processes (gloo + shared memory, or with ``--device cuda`` GPU memory shared
over CUDA IPC, gloo for control: :mod:`cpkv.replay.device`) replay one Mooncake-format trace (by
default a workload generated from ``--seed``) through the engine's call sequence on cpkv's public
API only (:mod:`cpkv.replay.rank`): batch admission, replicated lookups, load-back from the shared
host slab, compose, a check of every composed byte, insert, write-through backup, eviction in both
tiers and the periodic digest agreement check. The report puts the hit rate by tier next to what
the same device capacity gives with no host tier, and the time per forward and the rates of
compose, backup and load-back. Exit code 1 if any byte was wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from cpkv.replay.options import DEFAULT_PAYLOADS, ReplayOptions

__all__ = ["ReplayOptions", "configure", "run", "run_replay"]


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path

    d = ReplayOptions()
    parser.add_argument("--trace", metavar="PATH", help="a Mooncake-format JSONL trace (default: a generated one)")
    parser.add_argument("--requests", type=integer(1), default=800, help="requests to generate (default %(default)s)")
    parser.add_argument("--seed", type=integer(0), default=0, help="seed of the generated workload (default %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--ranks", type=int, default=d.ranks, help="CP ranks (processes) (default %(default)s)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: gloo + shared memory; cuda: pools in GPU memory over CUDA IPC, several ranks "
                             "per GPU when there are fewer GPUs than ranks (default %(default)s)")
    parser.add_argument("--page-size", type=int, default=d.page_size,
                        help="tokens per page; one page per 512-token trace block (default %(default)s)")
    parser.add_argument("--layers", type=int, default=d.layers, help="layers (default %(default)s)")
    parser.add_argument("--payloads", default=DEFAULT_PAYLOADS,
                        help="payloads as name:SHAPE:dtype, comma separated (default %(default)s)")
    parser.add_argument("--device-pages", type=int, default=d.device_pages,
                        help="device (L1) pages over all ranks (default %(default)s)")
    parser.add_argument("--host-pages", type=int, default=d.host_pages,
                        help="host (L2) slab pages (default %(default)s)")
    parser.add_argument("--policy", default=d.policy, help="eviction policy of both tiers (default %(default)s)")
    parser.add_argument("--check-every", type=int, default=d.check_every,
                        help="forwards between digest agreement checks (default %(default)s)")
    parser.add_argument("--batch", type=int, default=d.batch, help="requests per forward (default %(default)s)")
    parser.add_argument("--no-admission", action="store_true", help="first come first served batches")
    parser.add_argument("--timeout", type=float, default=d.timeout_s,
                        help="seconds before a stalled collective is an error (default %(default)s)")
    parser.add_argument("--l3-dir", metavar="DIR",
                        help="the durable third tier: pages leaving the host slab go to this directory, and a "
                             "request's pages missing from device and slab are read back from it (a second run "
                             "on the same directory starts warm); needs --l3-bytes")
    parser.add_argument("--l3-bytes", type=integer(1), metavar="BYTES", help="the L3 directory's cap on disk")
    parser.add_argument("--cluster-master", metavar="HOST:PORT",
                        help="the cluster tier: a Mooncake master (cpkv cluster serve starts one) shared by every "
                             "instance; pages leaving the host slab are put there once, and pages missing from "
                             "device, slab and L3 are read from it (another instance starts warm); needs "
                             "--cluster-metadata")
    parser.add_argument("--cluster-metadata", metavar="URL", help="the master's HTTP metadata server's URL")
    parser.add_argument("--cluster-bytes", type=integer(0), metavar="BYTES",
                        help="memory this instance lends the cluster store (default: none; the store servers "
                             "hold the pages, and they outlive the instance)")
    parser.add_argument("--cluster-put", choices=("eviction", "backup"), default="eviction",
                        help="when a page goes to the cluster: when it leaves the host slab (default), or as soon "
                             "as it is computed (README: the cluster tier, measured)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the report as JSON")


def options_from(args: argparse.Namespace, *, payloads: bool = True) -> ReplayOptions:
    """The options; ``payloads=False`` leaves them unparsed (parsing imports torch, seconds)."""
    from cpkv.replay.options import parse_payloads

    return ReplayOptions(ranks=args.ranks, page_size=args.page_size, layers=args.layers,
                         payloads=parse_payloads(args.payloads) if payloads else None,
                         device_pages=args.device_pages,
                         host_pages=args.host_pages, policy=args.policy, check_every=args.check_every,
                         admission=not args.no_admission, batch=args.batch, timeout_s=args.timeout,
                         progress=not args.quiet, device=args.device, l3_dir=args.l3_dir, l3_bytes=args.l3_bytes,
                         cluster_master=args.cluster_master, cluster_metadata=args.cluster_metadata,
                         cluster_bytes=args.cluster_bytes, cluster_put=args.cluster_put)


def load_requests(args: argparse.Namespace) -> list[tuple[int, ...]]:
    from cpkv._args import positive_int
    from cpkv.traces import load_trace
    from cpkv.workload import generate

    positive_int(args.limit, "--limit")
    if args.trace is not None:
        return [r.hash_ids for r in load_trace(args.trace, limit=args.limit)]
    positive_int(args.requests, "--requests")
    requests = [r.hash_ids for r in generate(args.requests, args.seed)]
    return requests[: args.limit] if args.limit else requests


def run_replay(options: ReplayOptions, workloads: list[list[tuple[int, ...]]]) -> list[Any]:
    """Runs the ranks; ``workloads`` has one request list for all ranks (or one per rank, for tests
    that feed a rank a divergent stream). Returns each rank's stats, or its error text, or for a
    rank that died, how (``rank 2 died: killed by SIGKILL``)."""
    from cpkv.runtime.launch import run_ranks

    return run_ranks(_entry, options.ranks, options, workloads, timeout_s=24 * 3600.0,
                     collective_timeout_s=options.timeout_s, expect_failures=True, deaths_as_text=True)


def _entry(rank: int, world: int, options: ReplayOptions, workloads: list[list[tuple[int, ...]]]) -> Any:
    from cpkv.replay.rank import replay_rank

    return replay_rank(rank, world, options, workloads[rank] if len(workloads) > 1 else workloads[0])


REFUSED = "InvalidArgumentError: "  # how a rank's refusal of an argument comes back (run_ranks)


def _run_holding_l3_dir(options: ReplayOptions, requests: list[tuple[int, ...]]) -> list[Any]:
    """The ranks' run, this process holding ``--l3-dir``'s lock throughout (one replay per directory;
    released by the kernel when this process exits or dies, so a killed run never blocks a restart)."""
    if options.l3_dir is None:
        return run_replay(options, [requests])
    from cpkv.tier.l3.directory import DirectoryLock

    with DirectoryLock(options.l3_dir, "--l3-dir"):
        return run_replay(options, [requests])


def run(args: argparse.Namespace) -> int:
    from cpkv.errors import InvalidArgumentError
    from cpkv.replay.options import check
    from cpkv.replay.report import report

    if args.json:
        parent = os.path.dirname(os.path.abspath(args.json))
        if not os.path.isdir(parent):
            raise InvalidArgumentError(f"--json {args.json}: directory {parent} does not exist")
    # Everything that needs no torch first, so a bad value fails at once.
    check(options_from(args, payloads=False), 0)
    if args.cluster_master is not None:
        from cpkv.tier.cluster.tier import check_master

        check_master(args.cluster_master, args.cluster_metadata, args.timeout)
    requests = load_requests(args)
    options = options_from(args)
    check(options, max(len(r) for r in requests))
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InvalidArgumentError("--device cuda: no CUDA device is available here")
    started = time.perf_counter()
    results = _run_holding_l3_dir(options, requests)
    wall = time.perf_counter() - started
    failed = [(rank, r) for rank, r in enumerate(results) if not isinstance(r, dict)]
    refused = [r.splitlines()[0].removeprefix(REFUSED) for _, r in failed if isinstance(r, str) and r.startswith(REFUSED)]
    if failed and len(refused) == len(failed):
        # Every rank refused its input alike (an L3 store that cannot open: a full or read-only
        # directory): a bad argument, one line, exit 2. The refusing rank's reason goes first.
        from cpkv.tier.l3.tier import PEER_REFUSED

        raise InvalidArgumentError(next((r for r in refused if r != PEER_REFUSED), refused[0]))
    if failed:
        # A death is the cause and goes first; the peers' errors (a lost connection) follow from it.
        died = [r for rank, r in failed if isinstance(r, str) and r.startswith(f"rank {rank} died")]
        others = [f"rank {rank}: {r.splitlines()[0] if r else 'stopped before reporting'}"
                  for rank, r in failed if r not in died]
        detail = "; ".join(died + others)
        print(f"cpkv: replay failed: {detail}", file=sys.stderr)
        return 1
    return report(options, requests, results, wall, args.json)
