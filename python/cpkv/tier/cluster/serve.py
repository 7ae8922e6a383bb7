"""``cpkv cluster serve``: a local Mooncake cluster for the cluster tier, in the foreground.

Starts ``mooncake_master`` (its HTTP metadata server on) and one store server holding ``--bytes``,
both on loopback, prints one line once both are ready (the options a replay needs), and stops both
on Ctrl-C or SIGTERM. Instances then come and go while their pages stay in the store's memory. A
child that dies on its own stops the other and exits 1, naming it.
"""

from __future__ import annotations

import argparse
import signal
import sys

DEFAULT_BYTES = 1 << 30


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer

    parser.add_argument("--port", type=integer(1, 65535), default=None,
                        help="the master's RPC port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--metadata-port", type=integer(1, 65535), default=None,
                        help="the master's HTTP metadata server's port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--bytes", type=integer(), default=DEFAULT_BYTES,
                        help="bytes of memory the store server holds pages in (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    from cpkv.tier.cluster.local import local_cluster

    stops = {signal.SIGINT, signal.SIGTERM}
    # Blocked here and waited for below; unblocked in the children before they exec.
    signal.pthread_sigmask(signal.SIG_BLOCK, stops | {signal.SIGCHLD})
    with local_cluster(args.bytes, port=args.port, metadata_port=args.metadata_port) as cluster:
        print(f"cpkv cluster: ready: --cluster-master {cluster.master} --cluster-metadata {cluster.metadata} "
              f"({args.bytes} bytes of store memory); Ctrl-C or SIGTERM stops it", flush=True)
        while True:
            got = signal.sigwait(stops | {signal.SIGCHLD})
            if got in stops:
                print("cpkv cluster: stopped", flush=True)
                return 0
            dead = [name for name, child in cluster.processes.items() if child.poll() is not None]
            if dead:
                name = dead[0]
                print(f"cpkv: error: Mooncake's {name} exited with code {cluster.processes[name].returncode}: "
                      f"{cluster.log_tail(name)}", file=sys.stderr, flush=True)
                return 1
