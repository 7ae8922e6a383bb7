"""Which ranks share one replicated index and one slab: this rank's place in them, and the
backend's own gloo groups.

A *store group* is the set of ranks whose host pools hold the same bytes for the same key and whose
schedulers issue the same store calls: the attention-CP ranks of one attention-DP group (one
scheduler stream), of one pipeline stage, and

- for GQA/MHA, of one attention-TP rank (the other attention-TP ranks hold other heads);
- for an MLA model (SGLang's ``is_mla_model``: the latent, and the DSA indexer, are the same on
  every TP rank), of every attention-TP rank.

Ranks are read from SGLang's own parallel state (``get_parallel()``: ``tp_rank = (attn_dp_rank *
attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank``). A store group's ranks on one
machine (or per ``cpkv_ranks_per_node``) share one slab: a *node*.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from cpkv.errors import CollectiveTimeoutError, InvalidArgumentError

from .config import CpkvStorageSettings

__all__ = ["Topology", "build_topology"]


@dataclass
class Topology:
    """This rank's place in its store group and in its node's share of it, and the backend's groups."""

    rank: int = 0  # position in the store group
    size: int = 1
    node: int = 0  # index of this rank's node among the group's nodes
    nodes: int = 1
    local_rank: int = 0  # position among the group's ranks on this node
    node_size: int = 1
    group: Any = None  # gloo, the digest check
    node_group: Any = None  # gloo, the slab's creation
    groups: list[Any] = field(default_factory=list)  # every group this rank created (destroyed on close)
    store_key: tuple = ()  # what names the store group's content: (pp, attention DP[, attention TP]) rank
    # (store key, node index) of every store group's node with a rank on this machine: the L3
    # directories this server uses here (any other is an earlier run's, reclaimed at L3's open).
    machine_nodes: list[tuple[tuple, int]] = field(default_factory=list)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        import socket

        return socket.gethostname()


def _parallel(config: Any) -> tuple[int, int, int, int, int]:
    """(pp_rank, attn_dp_rank, attn_cp_rank, attn_cp_size, attn_tp_rank) from SGLang's parallel state,
    or, in a process that never published it (a bench, a script), from the storage config (no
    attention DP: ``tp_rank % (tp_size / attn_cp_size)`` is the attention-TP rank)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        return (int(p.pp_rank), int(p.attn_dp_rank), int(p.attn_cp_rank), int(p.attn_cp_size), int(p.attn_tp_rank))
    except Exception:  # noqa: BLE001 -- not published in this process: the config says the same
        cp_size = max(1, int(config.attn_cp_size))
        attn_tp = max(1, int(config.tp_size) // cp_size)
        return (int(config.pp_rank), int(config.dp_rank), int(config.attn_cp_rank), cp_size,
                int(config.tp_rank) % attn_tp)


def build_topology(config: Any, settings: CpkvStorageSettings, rank_replicated: bool) -> Topology:
    """Collective over every process of the job (SGLang constructs the backend on each): one
    exchange of who is who, then every rank creates every group in the same order."""
    import torch.distributed as dist

    pp_rank, dp_rank, cp_rank, cp_size, tp_rank = _parallel(config)
    if not (dist.is_available() and dist.is_initialized()):
        if cp_size > 1:
            raise InvalidArgumentError(f"attn_cp_size is {cp_size} but torch.distributed is not initialised")
        return Topology()
    timeout = datetime.timedelta(seconds=settings.timeout_s)
    world: Any = dist.new_group(backend="gloo", timeout=timeout)
    content = (pp_rank, dp_rank) if rank_replicated else (pp_rank, dp_rank, tp_rank)
    # Position in the store group: CP rank, then (MLA) attention-TP rank.
    position = (cp_rank, tp_rank) if rank_replicated else (cp_rank, 0)
    mine = (content, position, _boot_id(), settings)
    heard: list[Any] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(heard, mine, group=world)
    except (RuntimeError, TimeoutError, ConnectionError) as err:
        raise CollectiveTimeoutError(f"cpkv sglang backend: ranks did not all construct the backend "
                                     f"within {settings.timeout_s:g} s: {err}") from err
    finally:
        dist.destroy_process_group(world)
    me = dist.get_rank()
    store_groups: dict[Any, list[tuple[tuple[int, int], int]]] = {}
    for rank, (key, pos, _boot, _settings) in enumerate(heard):
        store_groups.setdefault(key, []).append((pos, rank))
    # Every check looks at every group, so every rank raises the same error (none goes on to
    # create groups that the others never join).
    problems = []
    for key, members in sorted(store_groups.items()):
        positions = sorted(p for p, _ in members)
        if len(set(positions)) != len(positions):
            problems.append(f"store group {key}: two ranks at one (attn_cp, attn_tp) position {positions}")
        ranks = [r for _, r in sorted(members)]
        if any(heard[r][3] != heard[ranks[0]][3] for r in ranks):
            problems.append("the ranks of one store group were given different cpkv_* settings: " +
                            "; ".join(f"rank {r}: {heard[r][3]}" for r in ranks))
    if problems:
        raise InvalidArgumentError("cpkv sglang backend: " + "; ".join(problems))

    def node_key(rank: int, index: int) -> Any:
        if settings.ranks_per_node is not None:
            return index // settings.ranks_per_node
        return heard[rank][2]

    topo = Topology()
    for _key, members in sorted(store_groups.items(), key=lambda kv: sorted(r for _, r in kv[1])):
        ranks = [r for _, r in sorted(members)]
        size = len(ranks)
        group = dist.new_group(ranks, backend="gloo", timeout=timeout) if size > 1 else None
        by_node: dict[Any, list[int]] = {}
        for index, rank in enumerate(ranks):
            by_node.setdefault(node_key(rank, index), []).append(rank)
        node_list = sorted(by_node.values())
        topo.machine_nodes += [(tuple(_key), index) for index, node_ranks in enumerate(node_list)
                               if any(heard[r][2] == heard[me][2] for r in node_ranks)]
        # A group even for one rank: the slab's creation must not fall back to the default group,
        # which would make ranks of different store groups (different content) share one slab.
        node_groups = [dist.new_group(n, backend="gloo", timeout=timeout) for n in node_list]
        if me in ranks:
            topo.rank, topo.size, topo.group = ranks.index(me), size, group
            topo.store_key = tuple(_key)
            for index, (node_ranks, node_group) in enumerate(zip(node_list, node_groups)):
                if me in node_ranks:
                    topo.node, topo.nodes = index, len(node_list)
                    topo.local_rank, topo.node_size, topo.node_group = node_ranks.index(me), len(node_ranks), node_group
            topo.groups = [g for g in [group, *node_groups] if g is not None]
    return topo
