"""A plain reference for ``cpkv.cluster_sim``: the same rules (see its docstring), written
independently: recency as stamps of one counter and victims found by scanning for the oldest stamp
(not ordered dicts), and each device's contents followed through the tree's residency events
(``event_limit``), not through ``evict``'s return value and page arithmetic. The device tier is the
real ``PrefixTree`` (its policies are tested elsewhere); the routing is ``cpkv.cluster_sim.route``
(tested on its own)."""

from __future__ import annotations

import numpy as np

from cpkv import PrefixTree


class ModelCluster:
    def __init__(self, instances: int, device_pages: int, host_pages: int, cluster_pages: int,
                 policy: str) -> None:
        self.trees = [PrefixTree(1, policy, event_limit=1 << 20) for _ in range(instances)]
        self.device_pages, self.host_pages, self.cluster_pages = device_pages, host_pages, cluster_pages
        self.device: list[dict[int, int]] = [{} for _ in range(instances)]  # page -> block, from events
        self.host: list[dict[int, int]] = [{} for _ in range(instances)]  # block -> stamp
        self.cluster: dict[int, int] = {}  # block -> stamp
        self.next_page = [0] * instances
        self.clock = 0
        self.totals = {"device": 0, "host": 0, "cluster": 0, "missed": 0}

    def _stamp(self, store: dict[int, int], block: int) -> None:
        self.clock += 1
        store[block] = self.clock

    @staticmethod
    def _oldest(store: dict[int, int]) -> int:
        return min(store, key=store.__getitem__)

    def _to_cluster(self, block: int) -> None:
        if self.cluster_pages == 0:
            return
        self._stamp(self.cluster, block)
        while len(self.cluster) > self.cluster_pages:
            del self.cluster[self._oldest(self.cluster)]

    def _on_device(self, i: int, block: int) -> bool:
        return block in self.device[i].values()

    def step(self, i: int, blocks: list[int]) -> dict[str, int]:
        tree, host = self.trees[i], self.host[i]
        m = tree.match(blocks)
        tree.lock(m.node)
        need = len(blocks) - m.length
        if need > self.device_pages - tree.device_pages:
            tree.evict(need - (self.device_pages - tree.device_pages))
        keep = m.length + min(need, self.device_pages - tree.device_pages)
        fresh = list(range(self.next_page[i], self.next_page[i] + keep - m.length))
        self.next_page[i] += len(fresh)
        tree.insert(blocks[:keep], np.array(list(m.device_pages) + fresh, dtype=np.int64))
        tree.unlock(m.node)

        got = {"device": m.length, "host": 0, "cluster": 0, "missed": 0}
        served = m.length
        for block in blocks[m.length:]:
            if block in host:
                got["host"] += 1
            elif block in self.cluster:
                got["cluster"] += 1
            else:
                break
            served += 1
        got["missed"] = len(blocks) - served
        for block in reversed(blocks[m.length:served]):
            if block not in host:
                self._stamp(self.cluster, block)
        for block in reversed(blocks[served:]):
            self._to_cluster(block)
        for event in tree.take_events():
            assert event.tier == "device"
            if event.kind == "removed":
                for page in event.pages.tolist():
                    block = self.device[i].pop(page)
                    if not self._on_device(i, block) and block not in host:
                        self._to_cluster(block)
            else:
                for j, page in enumerate(event.pages.tolist()):
                    self.device[i][page] = blocks[event.start + j]
        for block in reversed(blocks[:keep]):
            self._stamp(host, block)
            while len(host) > self.host_pages:
                gone = self._oldest(host)
                del host[gone]
                if not self._on_device(i, gone):
                    self._to_cluster(gone)
        for tier, n in got.items():
            self.totals[tier] += n
        return got

    def cluster_order(self) -> list[int]:
        return sorted(self.cluster, key=self.cluster.__getitem__)

    def host_order(self, i: int) -> list[int]:
        return sorted(self.host[i], key=self.host[i].__getitem__)
