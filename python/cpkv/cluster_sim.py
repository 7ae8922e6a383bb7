"""``cpkv hitrate --instances N --cluster-pages P``: a trace split over N serving instances that
share one cluster tier, by simulation.

One hash id is one page, as in ``cpkv hitrate``. Every request goes to one instance (:func:`route`).
Each instance has the device tier ``hitrate`` replays (a ``PrefixTree`` with the chosen policy and
``device_pages`` pages, driven by :func:`cpkv.device_sim.place`) and a host tier of ``host_pages``
pages, write-through like cpkv's slab: every page the device holds after a request is written to
(or refreshed in) the host, and the host evicts its least recently used page. All instances share
one cluster tier of ``cluster_pages`` pages (Mooncake Store's place), least recently used out first:
Mooncake Store's master evicts by approximate LRU (``doc/en/mooncake-store.md``, "Eviction
Policy"); here it is exact LRU at ``cluster_pages``, without Mooncake's 95 % watermark and 5 %
batches. One copy per cluster: pages are keyed by their hash id, which names the whole prefix.

Per request, in trace order (instances run concurrently, so their requests interleave as in the
trace):
- the prefix hit is the longest run of leading pages each held by some tier: the device's match,
  then page by page the host, else the cluster. A page counts for the fastest tier holding it:
  device, host, cluster; the first page no tier holds ends the hit (the rest is computed).
- the cluster pages read are refreshed, then every computed page is put to the cluster (the order
  in which they happen; the pages of one batch deepest first, so within it a prefix stays more
  recent than its extensions);
- the device makes room (its victims whose page is in no tier of the instance any more are put to
  the cluster), then holds the request; the host is written through, and a page it evicts that the
  device does not hold either has left the instance and is put to the cluster.
A put of a page the cluster holds refreshes it (cpkv asks ``batch_is_exist`` first, and Mooncake's
``ExistKey`` grants the object a lease, which keeps it from eviction); a put into a full cluster
evicts its least recently used page. With one instance, no host and no cluster the device tier is
exactly ``cpkv hitrate``'s replay.

Routing (``split``), deterministic:
- ``prefix`` (default): by prefix root, a fixed hash (splitmix64 with :data:`ROUTE_SEED`) of the
  request's first ``root_blocks`` blocks (its id at that depth names the whole prefix; a shorter
  request uses its last block). The traces carry no session id, but a later turn of a conversation
  extends the earlier one, so it has the same root: this keeps a session on one instance, and
  sessions that share a root (a document, a long prompt) with it, as a prefix-aware router does.
  The default root is 2 blocks (1024 tokens): every request of the conversation trace starts with
  the same block (a shared system prompt), so a root of one block sends it all to one instance.
- ``request``: round robin, request i to instance i mod N: a balancer that ignores prefixes, the
  case where the cluster tier carries every cross-instance hit.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

MAX_INSTANCES = 1024
SPLITS = ("prefix", "request")
DEFAULT_ROOT_BLOCKS = 2
ROUTE_SEED = 0x6370_6B76  # "cpkv": fixed, so a split is the same on every run and machine
_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E37_79B9_7F4A_7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK
    return x ^ (x >> 31)


def route(requests: Sequence[Sequence[int]], instances: int, split: str = "prefix",
          root_blocks: int = DEFAULT_ROOT_BLOCKS) -> list[int]:
    """The instance (0 .. instances-1) of every request."""
    if split == "request":
        return [i % instances for i in range(len(requests))]
    return [_splitmix64((blocks[min(root_blocks, len(blocks)) - 1] if blocks else 0) ^ ROUTE_SEED) % instances
            for blocks in requests]


class LruPages:
    """A set of at most ``capacity`` pages, least recently used out first (a host tier, the cluster)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pages: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, page: object) -> bool:
        return page in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def pages(self) -> list[int]:
        """The pages held, least recently used first."""
        return list(self._pages)

    def touch(self, page: int) -> None:
        """Makes a held page the most recent."""
        self._pages.move_to_end(page)

    def put(self, page: int) -> list[int]:
        """Holds ``page`` as the most recent; the pages that made room for it (``page`` itself when
        the capacity is 0)."""
        self._pages[page] = None
        self._pages.move_to_end(page)
        out = []
        while len(self._pages) > self.capacity:
            out.append(self._pages.popitem(last=False)[0])
        return out


@dataclass
class TierHits:
    """Blocks of all requests by the tier that served them (``missed``: computed)."""

    device: int = 0
    host: int = 0
    cluster: int = 0
    missed: int = 0

    @property
    def total(self) -> int:
        return self.device + self.host + self.cluster + self.missed

    def ratios(self) -> dict[str, float]:
        """Hit ratio per tier and in all (``total``), over all blocks."""
        blocks = self.total or 1
        return {"device": self.device / blocks, "host": self.host / blocks, "cluster": self.cluster / blocks,
                "total": (self.device + self.host + self.cluster) / blocks}


class _Instance:
    def __init__(self, policy: str, device_pages: int, host_pages: int) -> None:
        from cpkv import PrefixTree

        self.tree = PrefixTree(1, policy)
        self.device_pages = device_pages
        self.host = LruPages(host_pages)
        self.on_device: Counter[int] = Counter()  # block -> device pages holding it
        self.block_of: dict[int, int] = {}  # device page -> block
        self.next_page = 0


class ClusterSim:
    """N instances (device + host tier each) sharing one cluster tier; :meth:`step` per request."""

    def __init__(self, instances: int, device_pages: int, host_pages: int, cluster_pages: int,
                 policy: str) -> None:
        self.instances = [_Instance(policy, device_pages, host_pages) for _ in range(instances)]
        self.cluster = LruPages(cluster_pages)
        self.hits = TierHits()

    def step(self, instance: int, blocks: Sequence[int]) -> TierHits:
        """Serves ``blocks`` on ``instance``; this request's blocks by tier (also added to :attr:`hits`)."""
        from cpkv.device_sim import place

        inst = self.instances[instance]
        placed = place(inst.tree, tuple(blocks), inst.device_pages, inst.next_page)
        inst.next_page = placed.next_page
        got = TierHits(device=placed.hit)
        end = placed.hit
        while end < len(blocks):  # host and cluster as they were before this request
            if blocks[end] in inst.host:
                got.host += 1
            elif blocks[end] in self.cluster:
                got.cluster += 1
            else:
                break
            end += 1
        got.missed = len(blocks) - end
        for block in reversed(blocks[placed.hit:end]):
            if block not in inst.host:
                self.cluster.touch(block)
        for block in reversed(blocks[end:]):  # computed: one copy in the cluster
            self.cluster.put(block)
        self._new_device_pages(inst, blocks, placed)
        for block in reversed(blocks[: placed.kept]):  # write-through
            for gone in inst.host.put(block):
                if not inst.on_device[gone]:
                    self.cluster.put(gone)
        for tier in ("device", "host", "cluster", "missed"):
            setattr(self.hits, tier, getattr(self.hits, tier) + getattr(got, tier))
        return got

    def _new_device_pages(self, inst: _Instance, blocks: Sequence[int], placed: Any) -> None:
        """Follows the device's pages: its victims leave (to the cluster unless the host holds them),
        the request's new pages arrive, numbered from ``place``'s first fresh page."""
        for victim in placed.victims:
            for page in victim.pages.tolist():
                block = inst.block_of.pop(page)
                inst.on_device[block] -= 1
                if not inst.on_device[block]:
                    del inst.on_device[block]
                    if block not in inst.host:
                        self.cluster.put(block)
        first = placed.next_page - (placed.kept - placed.hit)
        for offset, block in enumerate(blocks[placed.hit: placed.kept]):
            inst.block_of[first + offset] = block
            inst.on_device[block] += 1


def simulate(requests: Sequence[Sequence[int]], instances: int, device_pages: int, host_pages: int,
             cluster_pages: int, policy: str, split: str = "prefix",
             root_blocks: int = DEFAULT_ROOT_BLOCKS) -> TierHits:
    """Replays ``requests`` over ``instances`` instances sharing a cluster of ``cluster_pages`` pages."""
    sim = ClusterSim(instances, device_pages, host_pages, cluster_pages, policy)
    for instance, blocks in zip(route(requests, instances, split, root_blocks), requests):
        sim.step(instance, blocks)
    return sim.hits
