"""The two-tier cache across real processes: gloo ranks sharing one host slab.

Every rank drives its CacheController with the same calls; each writes only the device pages it
owns, and the bytes that come back from the host tier are checked against the expectation.
"""

from __future__ import annotations

import os
import signal
import zlib

import numpy as np
import pytest
import torch

from cpkv.config import CpkvConfig
from cpkv.errors import (
    ArgumentTypeError,
    CollectiveTimeoutError,
    CpkvError,
    DivergenceError,
    InvalidArgumentError,
    LockError,
)
from cpkv.runtime.launch import run_ranks
from cpkv.runtime.layout import CpLayout
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, MIN_TIMEOUT_S
from cpkv.tier import CacheController, LoadHandle, SlabSpec
from cpkv.tier import streams as streams_module
from stream_double import RecordingStreams

pytestmark = pytest.mark.slow

PAGE = 4
ROWS = 24  # device rows per rank
PAYLOADS = {"kv": SlabSpec((2, 8), torch.float8_e4m3fn), "index": SlabSpec((16,), torch.bfloat16)}


def _settings(**changes) -> CpkvConfig:
    return CpkvConfig(**{"check_every": 1, "collective_timeout_s": 20.0, **changes})


def _tokens(conv: int, pages: int) -> list[int]:
    """Conversations share a two-page system prompt per group of three."""
    return [1000 + (conv // 3) * 100 + i if i < 2 * PAGE else conv * 10_000 + i for i in range(pages * PAGE)]


def _page_bytes(tokens: list[int], page: int, layer: int, payload: int, row_bytes: int) -> torch.Tensor:
    """The KV bytes of ``page``: a function of its whole token prefix, the layer and the payload."""
    seed = zlib.crc32(np.asarray(tokens[: (page + 1) * PAGE], dtype=np.int64).tobytes())
    return torch.from_numpy(((seed + 131 * layer + 17 * payload + np.arange(row_bytes)) % 251).astype(np.uint8))


class _Engine:
    """A minimal engine over one controller: writes owned KV, checks owned bytes."""

    def __init__(self, rank: int, world: int, layers: int, host_pages: int, policy: str = "lru",
                 settings: CpkvConfig | None = None, rows: int = ROWS, process_group=None) -> None:
        self.layout = CpLayout(world, rank, PAGE)
        self.layers, self.num_rows = layers, rows
        self.pools = {name: [torch.zeros(rows, *spec.page_shape, dtype=spec.dtype) for _ in range(layers)]
                      for name, spec in PAYLOADS.items()}
        self.ctl = CacheController(layout=self.layout, device_pages=rows * world, host_pages=host_pages,
                                   payloads=PAYLOADS, device_pools=self.pools, policy=policy,
                                   settings=settings or _settings(), process_group=process_group)
        self.checked = 0

    def rows(self, name: str, layer: int) -> torch.Tensor:
        return self.pools[name][layer].view(torch.uint8).view(self.num_rows, -1)

    def write(self, tokens: list[int], pages, first: int) -> None:
        for i, page in enumerate(pages):
            if page % self.layout.cp_size == self.layout.rank:
                for layer in range(self.layers):
                    for p, name in enumerate(PAYLOADS):
                        row = self.rows(name, layer)
                        row[page // self.layout.cp_size] = _page_bytes(tokens, first + i, layer, p, row.shape[1])

    def check(self, tokens: list[int], pages, first: int = 0) -> None:
        for i, page in enumerate(pages):
            if page % self.layout.cp_size == self.layout.rank:
                for layer in range(self.layers):
                    for p, name in enumerate(PAYLOADS):
                        row = self.rows(name, layer)
                        expected = _page_bytes(tokens, first + i, layer, p, row.shape[1])
                        assert torch.equal(row[page // self.layout.cp_size], expected), \
                            f"page {page} (token page {first + i}) layer {layer} {name}: wrong bytes"
                        self.checked += 1

    def request(self, tokens: list[int]) -> None:
        """One request as its own forward: lookup, load-back, allocate, write, backup, insert, commit."""
        ctl = self.ctl
        hit = ctl.lookup(tokens)
        self.check(tokens, hit.device_pages)
        load = ctl.load(hit)
        load.wait_all()
        self.check(tokens, load.pages, first=len(hit.device_pages))
        have = len(hit.device_pages) + load.num_pages
        fresh = ctl.allocate(len(tokens) // PAGE - have)
        assert fresh is not None
        self.write(tokens, fresh, have)
        for layer in range(self.layers):
            ctl.backup_layer(layer)  # the previous inserts' backups, overlapping this forward
        ctl.insert(tokens, np.concatenate([hit.device_pages, load.pages, fresh]))
        ctl.release(hit)
        ctl.end_forward()


def _round_trip(rank: int, world: int, layers: int, device_path: bool = False) -> dict:
    if device_path:  # the CUDA pools' copies and stream ordering, run on CPU tensors
        streams_module.stream_ops = lambda device: RecordingStreams()
    engine = _Engine(rank, world, layers, host_pages=64)
    ctl = engine.ctl
    try:
        convs = [_tokens(c, 4 + c) for c in range(4)]
        for tokens in convs:
            engine.request(tokens)
        ctl.flush_backups()
        ctl.end_forward()
        assert ctl.core.pending_tickets() == []
        ctl.core.evict_device(ROWS * world)
        for name in PAYLOADS:  # nothing left on device: only the host tier can bring the bytes back
            for pool in engine.pools[name]:
                pool.view(torch.uint8).zero_()
        for tokens in convs:
            hit = ctl.lookup(tokens)
            assert hit.host_tokens == len(tokens)  # the whole conversation is cached in some tier
            ctl.release(hit)
            engine.request(tokens)
        stats = ctl.stats()
        assert stats["loaded_pages"] == sum(len(t) // PAGE for t in convs) - 2 * 2  # conversations 1 and 2 find the shared prompt on device
        assert stats["bytes_loaded"] > 0 and stats["agreement_checks"] == stats["forwards"]
        return {"digest": ctl.digest(), "checked": engine.checked, "stats": stats}
    finally:
        ctl.close()


@pytest.mark.parametrize("world, device_path", [(1, False), (2, False), (4, False), (1, True), (2, True)])
def test_backup_evict_and_load_back_are_byte_identical(world: int, device_path: bool) -> None:
    results = run_ranks(_round_trip, world, 3, device_path, timeout_s=120)
    assert len({r["digest"] for r in results}) == 1
    assert all(r["checked"] > 0 for r in results)
    # Every page of the second pass (22) and the first pass's shared-prompt hits (2 x 2), in 3 layers
    # and 2 payloads, checked by exactly one rank: its owner.
    assert sum(r["checked"] for r in results) == 3 * 2 * (22 + 4)


def _pressure(rank: int, world: int, seed: int) -> dict:
    engine = _Engine(rank, world, 2, host_pages=24, policy="lru", rows=8)
    rng = np.random.default_rng(seed)  # same seed on every rank: the same stream everywhere
    try:
        for _ in range(40):
            engine.request(_tokens(int(rng.integers(0, 9)), int(rng.integers(3, 9))))
        stats = engine.ctl.stats()
        return {"digest": engine.ctl.digest(), "host_victims": stats["host_victims"],
                "admission_evictions": stats["admission_evictions"], "host_hits": stats["host_hit_tokens"]}
    finally:
        engine.ctl.close()


def test_capacity_pressure_evicts_the_same_host_objects_everywhere_and_reproducibly() -> None:
    first = run_ranks(_pressure, 2, 7, timeout_s=120)
    again = run_ranks(_pressure, 2, 7, timeout_s=120)
    assert first[0]["host_victims"] > 0 and first[0]["admission_evictions"] > 0 and first[0]["host_hits"] > 0
    assert first[0] == first[1] == again[0] == again[1]


def _diverge(rank: int, world: int, how: str) -> str:
    engine = _Engine(rank, world, 1, host_pages=32)
    ctl = engine.ctl
    try:
        engine.request(_tokens(0, 4))
        if how == "extra_reserve" and rank == 1:
            pages = ctl.allocate(2)
            ctl.insert(_tokens(5, 2), pages)  # a backup reserved on this rank only
        elif how == "extra_access" and rank == 1:
            ctl.release(ctl.lookup(_tokens(0, 4)))
        elif how == "same_clock_field":
            # Both ranks make the same calls; rank 1 hands the tree its pages in another order.
            pages = ctl.allocate(3)
            ctl.insert(_tokens(7, 3), pages[::-1] if rank == 1 else pages)
        try:
            ctl.end_forward()
        except DivergenceError as err:
            return f"DivergenceError: {err}"
        return "no error"
    finally:
        ctl.close()


@pytest.mark.parametrize("how", ["extra_reserve", "extra_access", "same_clock_field"])
def test_a_single_divergent_operation_is_caught_on_every_rank(how: str) -> None:
    results = run_ranks(_diverge, 2, how, timeout_s=60)
    assert all(r.startswith("DivergenceError") for r in results), results
    assert "rank 0" in results[0] and "rank 1" in results[1]
    # Every rank names both digests (the one agreement protocol, cpkv.runtime.agree).
    assert all("digest check at forward 2" in r and "ranks [0] hold " in r and "ranks [1] hold " in r
               for r in results), results


def test_the_same_clock_divergence_is_not_the_clock() -> None:
    from cpkv._cpkv import TierCache

    a, b = (TierCache(page_size=PAGE, cp_size=2, device_pages=16, host_pages=8) for _ in range(2))
    pages = a.allocate(3)
    b.allocate(3)
    a.insert(_tokens(7, 3), pages)
    b.insert(_tokens(7, 3), pages[::-1])
    assert a.clock == b.clock  # the tree's logical clock agrees; only the page order differs
    assert a.digest() != b.digest()


def _killed_during_backup(rank: int, world: int, marker: str) -> str:
    engine = _Engine(rank, world, 2, host_pages=32, settings=_settings(collective_timeout_s=3.0))
    ctl = engine.ctl
    try:
        engine.request(_tokens(0, 4))
        ctl.backup_layer(0)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            ctl.end_forward()
        except CollectiveTimeoutError as err:
            return f"CollectiveTimeoutError: {err}"
        return "no error"
    finally:
        ctl.close()


def _shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("cpkv")}


def test_a_rank_killed_during_a_backup_is_an_error_not_a_hang_and_leaves_no_shm() -> None:
    before = _shm_names()
    results = run_ranks(_killed_during_backup, 2, "x", timeout_s=60, collective_timeout_s=3.0,
                        expect_failures=True)
    assert results[0] is not None and results[0].startswith("CollectiveTimeoutError"), results
    assert results[1] is None  # killed: no result
    assert _shm_names() <= before


def _bad_input(rank: int, world: int) -> list[str]:
    engine = _Engine(rank, world, 1, host_pages=16)
    ctl = engine.ctl
    caught = []
    try:
        engine.request(_tokens(0, 3))
        held = ctl.allocate(2)
        miss = ctl.lookup(_tokens(9, 1))
        digest = ctl.digest()
        cases = [
            (lambda: ctl.insert(_tokens(1, 2), [ROWS * world + 5, held[0]]), InvalidArgumentError, "outside"),
            (lambda: ctl.insert(_tokens(1, 3), held), InvalidArgumentError, "page ids for 3 whole pages"),
            (lambda: ctl.free([int(held[0]), int(held[0])]), InvalidArgumentError, "twice"),
            (lambda: ctl.free([ROWS * world - 1]), InvalidArgumentError, "is free"),
            (lambda: ctl.core.unlock(1), LockError, "not locked"),
            (lambda: ctl.core.plan_load(10**6), KeyError, "unknown node"),
            (lambda: ctl.allocate(-1), InvalidArgumentError, "out of range"),
            (lambda: ctl.allocate(True), InvalidArgumentError, "must be an int"),
            (lambda: ctl.backup_layer(5), InvalidArgumentError, "layer 5"),
            # Wrong types: ArgumentTypeError, an InvalidArgumentError (ValueError) and a TypeError.
            (lambda: ctl.backup_layer(1.5), ArgumentTypeError, "layer must be an int, got 1.5"),
            (lambda: ctl.backup_layer(True), ArgumentTypeError, "layer must be an int, got True"),
            (lambda: ctl.release(None), ArgumentTypeError, "release takes a Lookup from lookup.., got None"),
            (lambda: ctl.load(None), ArgumentTypeError, "load takes a Lookup from lookup.., got None"),
            (lambda: ctl.load_batch([miss, None]), ArgumentTypeError, "got None"),
            (lambda: ctl.load_batch(None), ArgumentTypeError, "a sequence of Lookups, got None"),
            (lambda: LoadHandle(np.zeros(0, np.int64), 2, 1.0).wait(0.5), ArgumentTypeError,
             "layer must be an int, got 0.5"),
            (lambda: LoadHandle(np.zeros(0, np.int64), 2, 1.0).wait(2), InvalidArgumentError, r"layer 2 is not in \[0, 2\)"),
            (lambda: ctl.core.commit(2**64), InvalidArgumentError, "out of range"),
            (lambda: ctl.core.commit(99), InvalidArgumentError, "beyond the last issued"),
        ]
        for call, kind, text in cases:
            with pytest.raises(kind, match=text) as raised:
                call()
            assert isinstance(raised.value, CpkvError) and isinstance(raised.value, (ValueError, KeyError))
            assert kind is not ArgumentTypeError or isinstance(raised.value, TypeError), text
            assert ctl.digest() == digest, text
            caught.append(text)
    finally:
        ctl.close()
    with pytest.raises(InvalidArgumentError, match="closed"):
        ctl.lookup(_tokens(0, 1))
    return caught


def test_bad_input_is_a_typed_error_and_changes_nothing() -> None:
    results = run_ranks(_bad_input, 2, timeout_s=60)
    assert results[0] == results[1] and len(results[0]) == 19


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="check_every"):
        CpkvConfig(check_every=0)
    with pytest.raises(InvalidArgumentError, match="transfer_timeout_s"):
        CpkvConfig(transfer_timeout_s=float("nan"))
    layout = CpLayout(1, 0, PAGE)
    pools = {name: [torch.zeros(ROWS, *spec.page_shape, dtype=spec.dtype)] for name, spec in PAYLOADS.items()}
    with pytest.raises(InvalidArgumentError, match="device_pages"):
        CacheController(layout=layout, device_pages=0, host_pages=8, payloads=PAYLOADS, device_pools=pools)
    with pytest.raises(CpkvError, match="policy"):
        CacheController(layout=layout, device_pages=8, host_pages=8, payloads=PAYLOADS, device_pools=pools,
                        policy="nope")
    short = {name: [torch.zeros(2, *spec.page_shape, dtype=spec.dtype)] for name, spec in PAYLOADS.items()}
    with pytest.raises(InvalidArgumentError, match="payload 'kv' layer 0"):
        CacheController(layout=layout, device_pages=8, host_pages=8, payloads=PAYLOADS, device_pools=short)


def test_single_process_controller_without_a_process_group() -> None:
    engine = _Engine(0, 1, 2, host_pages=32, settings=_settings())
    try:
        for conv in range(3):
            engine.request(_tokens(conv, 5))
        engine.ctl.flush_backups()
        engine.ctl.end_forward()
        assert engine.ctl.stats()["backups_committed"] > 0
    finally:
        engine.ctl.close()


@pytest.mark.parametrize("name", ["collective_timeout_s", "transfer_timeout_s"])
@pytest.mark.parametrize("seconds", [MIN_TIMEOUT_S / 2, MAX_TIMEOUT_S * 1.001, 1e15])
def test_config_timeouts_follow_the_one_timeout_rule(name: str, seconds: float) -> None:
    """cpkv.runtime.timeouts is the one rule: a timeout gloo's millisecond counters cannot hold (or
    one that rounds to zero there) is refused by the config too, naming the field."""
    with pytest.raises(InvalidArgumentError, match=name):
        CpkvConfig(**{name: seconds})
    assert getattr(CpkvConfig(), name) == DEFAULT_TIMEOUT_S
