"""``cpkv bench evict``: ``PrefixTree.evict(num_pages)`` against the two baselines users would
actually pick, on the same tree and the same calls, in this process.

- SGLang-shaped ``evict(num_tokens)``: on every call, walk the whole tree to collect the
  evictable leaves, heapify them once by last access, pop until enough pages are freed,
  pushing a parent that becomes a leaf (Python ``heapq``, as SGLang's radix cache does).
- An O(1) doubly linked LRU list (vLLM's free-block queue shape): leaves in access order,
  an access moves a leaf to the tail, eviction pops the head; a parent that becomes a leaf
  goes to the head (its last access is its newest child's, the one just evicted).

cpkv runs twice, each on a tree of its own: ``evict`` (a victim object with a page array per
node) and ``evict_pages`` (the same eviction, one page array per call). Both baselines keep
their own tree, ids and logical access counter, built from the same access sequence as cpkv's
tree (never from cpkv's order), and every call's victims (their pages, in pop order) must
equal cpkv's ``lru`` victims, or the command fails. Calls of 1, 16 and 256 pages run in
sequence on each tree size (41k leaves by default; ``--leaves 41000,1000000`` adds the
1M-leaf tree, whose Python build takes about a minute); each row reports per call, per
evicted page, and per page against the linked list (the target: cpkv at or below 1).

A last row, the floor, evicts nothing: it makes a new ``int64`` array of each call's page count
(``np.zeros``, timed as the calls are), which is what returning the pages as an array costs by
itself before any eviction.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import heapq
import time

PREFIXES = 64  # shared one-page prefixes every leaf hangs under
CALL_PAGES = (1, 16, 256)


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path

    parser.add_argument("--leaves", default="41000",
                        help="tree sizes in evictable leaves, comma separated (default %(default)s; "
                             "41000,1000000 adds the 1M-leaf tree)")
    parser.add_argument("--page-size", type=integer(1, 4096), default=16, help="tokens per page (default %(default)s)")
    parser.add_argument("--calls", type=integer(1), default=20,
                        help="eviction calls per call size, the same calls for every implementation "
                             "(default %(default)s)")
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the table as JSON")


def access_order(leaves: int) -> list[int]:
    """Leaf ``j`` is inserted (accessed) ``i``-th: a scramble of insertion against leaf order."""
    return [(i * 7919) % leaves for i in range(leaves)]


def build_tree(leaves: int, page_size: int):
    """cpkv's tree: ``leaves`` two-page leaves under 64 shared one-page prefixes, each leaf
    accessed once in ``access_order``; pages numbered in insertion order."""
    from cpkv import PrefixTree

    tree = PrefixTree(page_size, "lru")
    next_page = 0
    for j in access_order(leaves):
        tokens = [j % PREFIXES] * page_size + [1_000 + j] * page_size + [2_000_000 + j] * page_size
        m = tree.match(tokens)
        new = 3 - m.length // page_size
        pages = list(m.device_pages) + list(range(next_page, next_page + new))
        next_page += new
        tree.insert(tokens, pages)
    return tree


class _Shape:
    """The baselines' own description of the same tree, from the same access sequence: node
    ``n``'s parent (-1: under the root), pages and last access (a logical counter)."""

    def __init__(self, leaves: int) -> None:
        self.parent: list[int] = []
        self.pages: list[list[int]] = []
        self.last_access: list[int] = []
        self.accessed_leaves: list[int] = []  # leaf node per access, in access order
        prefix_node: dict[int, int] = {}
        next_page = 0
        for counter, j in enumerate(access_order(leaves)):
            p = j % PREFIXES
            if p not in prefix_node:
                prefix_node[p] = self._add(-1, [next_page], counter)
                next_page += 1
            self.last_access[prefix_node[p]] = counter
            self.accessed_leaves.append(self._add(prefix_node[p], [next_page, next_page + 1], counter))
            next_page += 2

    def _add(self, parent: int, pages: list[int], counter: int) -> int:
        self.parent.append(parent)
        self.pages.append(pages)
        self.last_access.append(counter)
        return len(self.parent) - 1


class _RadixNode:
    __slots__ = ("id", "parent", "children", "pages", "last_access")

    def __init__(self, node_id: int, parent: _RadixNode | None, pages: list[int], last_access: int) -> None:
        self.id, self.parent, self.pages, self.last_access = node_id, parent, pages, last_access
        self.children: dict[int, _RadixNode] = {}

    def __lt__(self, other: _RadixNode) -> bool:
        return (self.last_access, self.id) < (other.last_access, other.id)


class SGLangEvict:
    """SGLang's radix-cache eviction shape: collect every evictable leaf by walking the whole
    tree, heapify once, pop until ``num_pages`` are freed, push a parent that becomes a leaf."""

    def __init__(self, shape: _Shape) -> None:
        self.root = _RadixNode(-1, None, [], -1)
        nodes: list[_RadixNode] = []
        for n, parent in enumerate(shape.parent):
            owner = self.root if parent < 0 else nodes[parent]
            node = _RadixNode(n, owner, shape.pages[n], shape.last_access[n])
            owner.children[n] = node
            nodes.append(node)

    def _collect_leaves(self) -> list[_RadixNode]:
        leaves, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        return leaves

    def evict(self, num_pages: int) -> list[list[int]]:
        heap = self._collect_leaves()
        heapq.heapify(heap)
        victims, freed = [], 0
        while freed < num_pages and heap:
            node = heapq.heappop(heap)
            victims.append(node.pages)
            freed += len(node.pages)
            parent = node.parent
            assert parent is not None  # leaves are never the root
            del parent.children[node.id]
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, parent)
        return victims


class LruListEvict:
    """An O(1) doubly linked list of evictable leaves in LRU order (vLLM's free-block queue):
    built by replaying the accesses (append at the tail; a parent that gains a child leaves the
    list), evicting from the head."""

    def __init__(self, shape: _Shape) -> None:
        n = len(shape.parent)
        self.pages = shape.pages
        self.parent = shape.parent
        self.children = [0] * n
        # Sentinel n: prev[n] is the tail, next[n] the head.
        self.prev, self.next = [n] * (n + 1), [n] * (n + 1)
        self.sentinel = n
        for leaf in shape.accessed_leaves:
            # A new leaf goes to the tail; its prefix has a child now, so it is never in the list.
            self.children[shape.parent[leaf]] += 1
            self._append(leaf)

    def _append(self, node: int) -> None:
        tail = self.prev[self.sentinel]
        self.prev[node], self.next[node] = tail, self.sentinel
        self.next[tail] = node
        self.prev[self.sentinel] = node

    def _push_head(self, node: int) -> None:
        head = self.next[self.sentinel]
        self.prev[node], self.next[node] = self.sentinel, head
        self.prev[head] = node
        self.next[self.sentinel] = node

    def _unlink(self, node: int) -> None:
        before, after = self.prev[node], self.next[node]
        self.next[before], self.prev[after] = after, before

    def evict(self, num_pages: int) -> list[list[int]]:
        victims, freed = [], 0
        while freed < num_pages:
            node = self.next[self.sentinel]
            if node == self.sentinel:
                break
            self._unlink(node)
            victims.append(self.pages[node])
            freed += len(self.pages[node])
            parent = self.parent[node]
            if parent >= 0:
                self.children[parent] -= 1
                if self.children[parent] == 0:
                    self._push_head(parent)
        return victims


@contextlib.contextmanager
def _collector_paused():
    """Pauses the cyclic garbage collector while calls are timed (as ``timeit`` does), for every
    implementation alike: a pass over the million Python objects of the baselines' trees costs
    milliseconds and would land on whichever call triggers it."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _timed_calls(evict, sizes: list[int]) -> tuple[list[float], list]:
    """Each call timed alone; what it returns is kept as it is (cpkv's results are converted to
    lists after the clock stops)."""
    evict(0)  # a binding's first call pays one-off setup (tens of microseconds) no later call does
    seconds, results = [], []
    with _collector_paused():
        for size in sizes:
            started = time.perf_counter()
            result = evict(size)
            seconds.append(time.perf_counter() - started)
            results.append(result)
    return seconds, results


IMPLEMENTATIONS = ("sglang", "lru_list", "cpkv", "cpkv_pages")
ROWS = (*IMPLEMENTATIONS, "array_floor")
LABELS = {"sglang": "SGLang-shaped evict (collect + heapify per call, Python)",
          "lru_list": "O(1) doubly linked LRU list (vLLM-shaped, Python)",
          "cpkv": "cpkv PrefixTree.evict (a victim object per node)",
          "cpkv_pages": "cpkv PrefixTree.evict_pages (one page array)",
          "array_floor": "floor: np.zeros of each call's page count, nothing evicted"}


def _evict_function(name: str, leaves: int, page_size: int, shape: _Shape):
    if name == "sglang":
        return SGLangEvict(shape).evict
    if name == "lru_list":
        return LruListEvict(shape).evict
    tree = build_tree(leaves, page_size)
    return tree.evict if name == "cpkv" else tree.evict_pages


def _measure(leaves: int, page_size: int, calls: int) -> dict:
    sizes = [size for size in CALL_PAGES for _ in range(calls)]
    if sum(sizes) > 2 * leaves:
        from cpkv.errors import InvalidArgumentError

        raise InvalidArgumentError(f"--calls {calls} per size evict more than the {leaves}-leaf tree holds")
    shape = _Shape(leaves)
    seconds, returned, build_s = {}, {}, {}
    for name in IMPLEMENTATIONS:
        # Each implementation is timed right after its own structure is built, so none starts
        # with its data pushed out of the caches by the others' builds.
        started = time.perf_counter()
        evict = _evict_function(name, leaves, page_size, shape)
        build_s[name] = time.perf_counter() - started
        seconds[name], returned[name] = _timed_calls(evict, sizes)
        # Freed before the next build, not after it: memory freed just before timing starts is
        # tidied up by the allocator during whichever timed call first triggers it (~180 us).
        del evict
    # The floor: a new array as large as each evict_pages result, and nothing else.
    import numpy as np

    counts = [len(raw) for raw in returned["cpkv_pages"]]
    seconds["array_floor"], _ = _timed_calls(functools.partial(np.zeros, dtype=np.int64), counts)
    victims = [[v.pages.tolist() for v in raw] for raw in returned["cpkv"]]
    flat = {"cpkv_pages": [raw.tolist() for raw in returned["cpkv_pages"]]}
    for name in ("sglang", "lru_list"):
        for call, (want, got) in enumerate(zip(victims, returned[name])):
            if want != got:
                raise SystemExit(f"error: {name} and cpkv lru disagree on the victims of call {call} "
                                 f"(evict({sizes[call]}))")
    for call, (want, got) in enumerate(zip(victims, flat["cpkv_pages"])):
        if [page for pages in want for page in pages] != got:
            raise SystemExit(f"error: evict_pages and evict disagree on the pages of call {call} "
                             f"(evict({sizes[call]}))")
    rows = {}
    for size in CALL_PAGES:
        picked = [i for i, s in enumerate(sizes) if s == size]
        pages = sum(len(p) for i in picked for p in victims[i])
        rows[size] = {name: {"s": sum(seconds[name][i] for i in picked), "pages": pages, "calls": len(picked)}
                      for name in ROWS}
    return {"rows": rows, "build_s": build_s["cpkv"]}


def run(args: argparse.Namespace) -> int:
    from cpkv._args import positive_int, positive_ints
    from cpkv._report import Table, emit

    sizes = positive_ints(args.leaves, "--leaves")
    positive_int(args.calls, "--calls")
    positive_int(args.page_size, "--page-size")
    table = Table(
        "evict(num_pages) on an lru tree of two-page leaves under 64 shared prefixes: cpkv against "
        "SGLang's heapify-once evict and an O(1) linked LRU list (victims checked equal, call by call); "
        "target: cpkv at or below the linked list per evicted page (ratio <= 1); the floor row is a new "
        "array of each call's pages alone",
        ["leaves", "call pages", "calls", "implementation", "us per call", "us per evicted page",
         "per page / linked list's"],
    )
    builds = {}
    for leaves in sizes:
        measured = _measure(leaves, args.page_size, args.calls)
        builds[leaves] = measured["build_s"]
        for size, row in measured["rows"].items():
            list_s = row["lru_list"]["s"]
            for name in ROWS:
                r = row[name]
                table.add(leaves, size, r["calls"], LABELS[name], r["s"] / r["calls"] * 1e6,
                          r["s"] / max(r["pages"], 1) * 1e6, r["s"] / list_s)
    emit("bench evict", [table], args.json, page_size=args.page_size, calls=args.calls,
         cpkv_build_s=builds)
    return 0
