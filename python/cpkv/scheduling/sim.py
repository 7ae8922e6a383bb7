"""``cpkv schedsim TRACE``: replay a Mooncake trace through a prefill scheduler.

One forward runs at a time. Each pass calls :func:`form_batch` on the waiting
queue; the forward then takes, by a stated linear cost model,

    forward_s = fixed_s + per_extend_s * extend tokens + per_cached_s * cached tokens

summed over the batch. Defaults (overridable by flags): fixed 30 ms, 0.3 ms per
extend token, 0.02 ms per cached token, with a 16,384-token extend cap. On the
conversation trace a typical warm request (median extend ~0.8k tokens over ~6k
cached) then costs ~0.4 s alone and a few of them ~1-2 s, while a forward
holding a cold prompt (median extend ~4.8k, chunks up to 16k) costs ~2-5 s
more -- the 1-2 s versus 5-10 s contrast the predecessor measured. The output
shows the mean warm-only and mixed forward so the calibration can be checked.

A request's time to first token (TTFT) is from its arrival to the end of the
forward that computes its last prefill token (decode is not modelled). The
prefix cache is one LRU tier over the trace's 512-token block ids: a request
matches its leading cached blocks when the scan reaches it (capped one token
short of its input, as an engine always computes one), and its blocks enter
the cache when its prefill completes. Arrivals are the trace timestamps
divided by ``--speedup``; by default the speedup is set so the offered load
(solo per-token work over the trace span) is ``--load`` of capacity, so a
queue forms.

The warm floor defaults to 1,024 tokens here, not the library's 64: every
request in the conversation trace starts with the same 512-token block (a
shared system prompt), so at 64 every request but the first would be warm.
Any floor in 513..1024 classifies the same, since matches are whole blocks.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from cpkv.errors import InvalidArgumentError
from cpkv.scheduling.affinity import Action, AffinityPolicy, Reason
from cpkv.scheduling.budget import BudgetConfig
from cpkv.scheduling.candidate import Candidate
from cpkv.scheduling.classify import RequestClass
from cpkv.scheduling.scan import ScanState, form_batch
from cpkv.traces import BLOCK_TOKENS, TraceRequest

# (name, affinity on, mixing on)
CONFIGS: tuple[tuple[str, bool, bool], ...] = (
    ("fcfs", False, False),
    ("affinity", True, False),
    ("mixing", False, True),
    ("affinity+mixing", True, True),
)


@dataclass(frozen=True, slots=True)
class CostModel:
    fixed_s: float = 0.030
    per_extend_s: float = 0.3e-3
    per_cached_s: float = 0.02e-3

    def forward_s(self, extend_tokens: int, cached_tokens: int) -> float:
        return self.fixed_s + self.per_extend_s * extend_tokens + self.per_cached_s * cached_tokens


class PrefixCache:
    """An LRU over block ids; a hit is the run of leading blocks present."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def matched_tokens(self, request: TraceRequest) -> int:
        hit = 0
        for block in request.hash_ids:
            if block not in self._blocks:
                break
            hit += 1
        return min(hit * BLOCK_TOKENS, request.input_length - 1)

    def insert(self, request: TraceRequest) -> None:
        blocks = self._blocks
        for block in request.hash_ids:
            blocks[block] = None
            blocks.move_to_end(block)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


@dataclass
class SimResult:
    name: str
    ttft_s: dict[RequestClass, list[float]] = field(default_factory=lambda: {c: [] for c in RequestClass})
    forwards: int = 0
    makespan_s: float = 0.0
    warm_only_forward_s: list[float] = field(default_factory=list)
    mixed_forward_s: list[float] = field(default_factory=list)
    max_skips: int = 0  # most passes any one request was skipped by affinity
    max_head_defers: int = 0
    max_queue: int = 0
    stops: dict[Reason | None, int] = field(default_factory=dict)  # why each pass's scan ended


def offered_work_s(requests: Sequence[TraceRequest], cost: CostModel, cache_blocks: int) -> float:
    """Per-token work of serving each request alone, in arrival order (no fixed cost)."""
    cache = PrefixCache(cache_blocks)
    work = 0.0
    for req in requests:
        cached = cache.matched_tokens(req)
        work += cost.per_extend_s * (req.input_length - cached) + cost.per_cached_s * cached
        cache.insert(req)
    return work


def simulate(
    name: str,
    requests: Sequence[TraceRequest],
    arrivals_s: Sequence[float],
    policy: AffinityPolicy,
    budget: BudgetConfig,
    cost: CostModel,
    cache_blocks: int,
) -> SimResult:
    result = SimResult(name)
    cache = PrefixCache(cache_blocks)
    queue: dict[int, None] = {}  # waiting request indices, in arrival order
    first_class: dict[int, RequestClass] = {}
    skips: dict[int, int] = {}
    state, carried = ScanState(), None
    now, next_arrival, done, n = 0.0, 0, 0, len(requests)

    def candidates() -> Iterator[Candidate]:
        # Matched lazily: only the requests the scan reaches.
        for idx in queue:
            req = requests[idx]
            cached = cache.matched_tokens(req)
            yield Candidate(idx, cached, 0, req.input_length - cached, age_s=now - arrivals_s[idx])

    while done < n:
        while next_arrival < n and arrivals_s[next_arrival] <= now:
            queue[next_arrival] = None
            next_arrival += 1
        if not queue and carried is None:
            now = arrivals_s[next_arrival]
            continue
        result.max_queue = max(result.max_queue, len(queue))
        step = form_batch(candidates(), state, policy, budget, chunked=carried)
        duration = cost.forward_s(step.extend_tokens, step.cached_tokens)
        now += duration
        result.forwards += 1
        classes = set()
        for adm in step.batch:
            klass = first_class.setdefault(adm.request_id, adm.klass)
            classes.add(klass)
            if adm.is_final:
                result.ttft_s[klass].append(now - arrivals_s[adm.request_id])
                cache.insert(requests[adm.request_id])
                done += 1
        if classes == {RequestClass.WARM}:
            result.warm_only_forward_s.append(duration)
        elif len(classes) == 2:
            result.mixed_forward_s.append(duration)
        for s in step.steps:
            if s.decision.action is Action.SKIP:
                skips[s.request_id] = skips.get(s.request_id, 0) + 1
        result.stops[step.stop] = result.stops.get(step.stop, 0) + 1
        for rid in step.taken_from_queue:
            del queue[rid]
        state, carried = step.state, step.carried
        result.max_head_defers = max(result.max_head_defers, state.head_defers)
    result.makespan_s = now
    result.max_skips = max(skips.values(), default=0)
    return result


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path, real

    parser.add_argument("trace", help="Mooncake-format JSONL trace (timestamps non-decreasing)")
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the tables as JSON")
    parser.add_argument("--limit", type=integer(1), help="replay only the first N requests")
    parser.add_argument("--load", type=real(above=0, maximum=1000), default=0.7,
                        help="offered load sets the speedup (default 0.7)")
    parser.add_argument("--speedup", type=real(above=0, maximum=1e9), help="arrival time divisor (overrides --load)")
    parser.add_argument("--floor", type=integer(0), default=1024, help="warm floor, tokens (default 1024; see module doc)")
    parser.add_argument("--cache-blocks", type=integer(0), default=50_000, help="LRU prefix cache, 512-token blocks")
    parser.add_argument("--skip-window", type=integer(0), default=16)
    parser.add_argument("--defer-limit", type=integer(0), default=3)
    parser.add_argument("--no-cp-mode", action="store_true", help="use the age bound (single-rank engine)")
    parser.add_argument("--age-bound-s", type=real(0), default=5.0, help="age bound outside CP mode")
    parser.add_argument("--page-size", type=integer(1), default=64)
    parser.add_argument("--extend-cap", type=integer(1), default=16384, help="extend tokens per forward (chunk size)")
    parser.add_argument("--cached-cap", type=integer(0), default=262144, help="cached prefix tokens per forward")
    parser.add_argument("--fixed-ms", type=real(0, 1e6), default=30.0, help="fixed cost per forward")
    parser.add_argument("--extend-us", type=real(0, 1e6), default=300.0, help="cost per extend token")
    parser.add_argument("--cached-us", type=real(0, 1e6), default=20.0, help="cost per cached token")


def run(args: argparse.Namespace) -> int:
    from cpkv._report import Table, emit
    from cpkv.traces import load_trace

    if args.fixed_ms == 0 and args.extend_us == 0 and args.cached_us == 0:
        # A forward that costs nothing never advances the clock: refuse rather than spin.
        raise InvalidArgumentError("--fixed-ms, --extend-us and --cached-us are all 0: a forward must cost something")
    requests = load_trace(args.trace, limit=args.limit)
    cost = CostModel(args.fixed_ms / 1e3, args.extend_us / 1e6, args.cached_us / 1e6)
    span_s = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1e3
    work_s = offered_work_s(requests, cost, args.cache_blocks)
    if args.speedup is not None:
        speedup = args.speedup
    else:
        speedup = args.load * span_s / work_s if span_s > 0 and work_s > 0 else 1.0
    arrivals = [(r.timestamp_ms - requests[0].timestamp_ms) / 1e3 / speedup for r in requests]
    offered = work_s / (arrivals[-1] or 1.0)

    table = Table(
        f"schedsim {args.trace}: {len(requests):,} requests, speedup {speedup:.4g} (offered load {offered:.2f}), "
        f"floor {args.floor}, extend cap {args.extend_cap}, TTFT in s",
        ["config", "warm n", "warm p50", "warm p90", "warm p99", "cold n", "cold p50", "cold p90", "cold p99",
         "fwd/s", "warm fwd s", "mixed fwd s", "max skips/req", "max head defers", "max queue"],
    )
    results = []
    for name, affinity, mixing in CONFIGS:
        policy = AffinityPolicy(floor_tokens=args.floor, skip_window=args.skip_window,
                                defer_limit=args.defer_limit, age_bound_s=args.age_bound_s,
                                cp_mode=not args.no_cp_mode, enabled=affinity)
        staging = args.extend_cap // args.page_size + 1
        budget = BudgetConfig(page_size=args.page_size, extend_cap=args.extend_cap, cached_cap=args.cached_cap,
                              staging_pages=staging, slack_pages=1, mixing=mixing)
        res = simulate(name, requests, arrivals, policy, budget, cost, args.cache_blocks)
        results.append(res)
        warm, cold = res.ttft_s[RequestClass.WARM], res.ttft_s[RequestClass.COLD]
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        table.add(name, len(warm), percentile(warm, 50), percentile(warm, 90), percentile(warm, 99),
                  len(cold), percentile(cold, 50), percentile(cold, 90), percentile(cold, 99),
                  res.forwards / res.makespan_s, mean(res.warm_only_forward_s), mean(res.mixed_forward_s),
                  res.max_skips, res.max_head_defers, res.max_queue)
    ratio = Table("warm and cold p99 against fcfs (lower is better)", ["config", "warm p99 / fcfs", "cold p99 / fcfs"])
    base = results[0]
    for res in results:
        ratio.add(res.name,
                  percentile(res.ttft_s[RequestClass.WARM], 99) / percentile(base.ttft_s[RequestClass.WARM], 99),
                  percentile(res.ttft_s[RequestClass.COLD], 99) / percentile(base.ttft_s[RequestClass.COLD], 99))
    reasons = sorted({r for res in results for r in res.stops}, key=lambda r: "" if r is None else r.value)
    stops = Table("why each pass's scan ended (passes)",
                  ["config", *("end of queue" if r is None else r.value for r in reasons)])
    for res in results:
        stops.add(res.name, *(res.stops.get(r, 0) for r in reasons))
    emit("schedsim", [table, ratio, stops], args.json, trace=str(args.trace), speedup=speedup, offered_load=offered,
         cost_model={"fixed_s": cost.fixed_s, "per_extend_s": cost.per_extend_s, "per_cached_s": cost.per_cached_s},
         floor_tokens=args.floor, cache_blocks=args.cache_blocks, extend_cap=args.extend_cap,
         cached_cap=args.cached_cap, page_size=args.page_size, skip_window=args.skip_window,
         defer_limit=args.defer_limit, cp_mode=not args.no_cp_mode, age_bound_s=args.age_bound_s)
    return 0
