"""How CacheController orders device copies against the caller's stream, and the host side of a
controller over an NCCL process group, on the CPU.

The device path's ordering (CUDA pools) runs here on CPU tensors through a recording stand-in for
its streams (``stream_double``): every byte is still checked (moved by the tier copy's CPU path; its
torch path is checked on strided views in ``test_tier_copy.py``), and the log says who waited for
what. With a GPU, ``test_tier_cuda.py`` runs the same flow on real streams and torch copies.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import cpkv.tier.slab as slab_module
from conftest import wait_for
from cpkv.errors import InvalidArgumentError
from cpkv.runtime.launch import run_ranks
from cpkv.tier import streams as streams_module
from cpkv.tier.controller import _pools_device
from stream_double import RecordingStreams
from test_tier import PAYLOADS, ROWS, _Engine, _settings, _tokens


@pytest.fixture
def recorded(monkeypatch):
    double = RecordingStreams()
    monkeypatch.setattr(streams_module, "stream_ops", lambda device: double)
    return double


def _copy_done_events(log: list[tuple], stream: str) -> list[int]:
    """Events recorded on ``stream`` right after a copy on it (the other events there are the timing
    starts recorded before a copy)."""
    return [e[2] for before, e in zip(log, log[1:]) if e[:2] == ("record", stream) and before == ("off", stream)]


def _to_host_only(engine: _Engine, convs: list[list[int]]) -> None:
    """Every conversation served, backed up, committed, then dropped from the device (pools zeroed)."""
    for tokens in convs:
        engine.request(tokens)
    engine.ctl.flush_backups()
    engine.ctl.end_forward()
    assert engine.ctl.core.pending_tickets() == []
    engine.ctl.core.evict_device(ROWS)
    for name in PAYLOADS:
        for pool in engine.pools[name]:
            pool.view(torch.uint8).zero_()


def test_a_load_back_waits_for_the_callers_stream_before_writing(recorded):
    engine = _Engine(0, 1, 3, host_pages=64)
    ctl = engine.ctl
    try:
        tokens = _tokens(4, 6)
        _to_host_only(engine, [tokens])
        recorded.log.clear()
        hit = ctl.lookup(tokens)
        load = ctl.load(hit)
        load.wait_all()
        engine.check(tokens, load.pages)  # the bytes came back
        ctl.release(hit)
        log = list(recorded.log)
        caller_event = log[0]
        assert caller_event[:2] == ("record", "caller")  # recorded in load(), on the caller's stream
        first_write = log.index(("on", "load"))
        assert ("wait", "load", caller_event[2]) in log[:first_write], log
        # Each layer: copies on the load stream, then its event; the caller's stream waits on it.
        layer_events = _copy_done_events(log, "load")
        assert len(layer_events) == 3
        assert [e[2] for e in recorded.entries("wait", "caller")] == layer_events
    finally:
        ctl.close()


def test_a_batch_of_loads_makes_each_stream_wait_once_per_layer(recorded):
    """The handles of one load_batch share its copies: the caller's stream waits on each layer's
    event once, however many handles wait, and another stream waits for itself."""
    engine = _Engine(0, 1, 3, host_pages=64)
    ctl = engine.ctl
    try:
        convs = [_tokens(3 * i, 3) for i in range(4)]  # no two share a prefix
        _to_host_only(engine, convs)
        recorded.log.clear()
        hits = [ctl.lookup(tokens) for tokens in convs]
        loads = ctl.load_batch(hits)
        assert [load.num_pages for load in loads] == [3] * 4
        for layer in range(3):
            for load in loads:
                load.wait(layer)
        for tokens, load in zip(convs, loads):
            engine.check(tokens, load.pages)
        layer_events = _copy_done_events(recorded.log, "load")
        assert len(layer_events) == 3  # one copy per layer for the whole batch
        assert [e[2] for e in recorded.entries("wait", "caller")] == layer_events
        with recorded.on("other"):
            loads[0].wait(1)
            loads[1].wait(1)
        assert [e[2] for e in recorded.entries("wait", "other")] == [layer_events[1]]
        for hit in hits:
            ctl.release(hit)
    finally:
        ctl.close()


def test_backups_run_after_the_callers_work_and_commit_only_once_their_events_completed(recorded):
    engine = _Engine(0, 1, 2, host_pages=64)
    ctl = engine.ctl
    try:
        engine.request(_tokens(0, 4))  # inserts: a backup is pending
        assert ctl.core.pending_tickets() != []
        recorded.log.clear()
        recorded.hold = True  # the copies are "in flight" until synchronised
        for layer in range(2):
            ctl.backup_layer(layer)
        log = list(recorded.log)
        for layer in range(2):
            start = [i for i, e in enumerate(log) if e == ("on", "backup")][layer]
            before = log[:start]
            caller = [e for e in before if e[:2] == ("record", "caller")][-1]
            assert ("wait", "backup", caller[2]) in before  # after the layer's KV was written
            assert log[start + 2][:2] == ("record", "backup")  # then the layer's done event
        done_events = _copy_done_events(recorded.log, "backup")
        ctl.end_forward()
        assert ctl.core.pending_tickets() != []  # issued but not completed: not committed
        assert ctl.stats()["backups_committed"] == 0
        # A page the backup may still read can be handed out again: the caller's stream waits first.
        ctl.allocate(1)
        assert ("wait", "caller", done_events[-1]) in recorded.log
        recorded.incomplete.clear()  # the copies landed
        ctl.end_forward()
        assert ctl.core.pending_tickets() == [] and ctl.stats()["backups_committed"] == 1
    finally:
        ctl.close()


def test_flush_waits_for_the_copies_so_the_next_commit_takes_everything(recorded):
    engine = _Engine(0, 1, 2, host_pages=64)
    ctl = engine.ctl
    try:
        engine.request(_tokens(1, 3))
        recorded.hold = True
        ctl.flush_backups()
        assert {e[1] for e in recorded.entries("sync")} == set(_copy_done_events(recorded.log, "backup"))
        ctl.end_forward()
        assert ctl.core.pending_tickets() == []
    finally:
        ctl.close()
    assert recorded.log[-1][0] == "sync"  # close waited for the last copy before unmapping the slab


def test_a_load_back_also_waits_for_backups_in_flight(recorded):
    engine = _Engine(0, 1, 1, host_pages=64)
    ctl = engine.ctl
    try:
        tokens = _tokens(2, 5)
        _to_host_only(engine, [tokens])
        engine.request(_tokens(3, 3))
        ctl.backup_layer(0)  # a backup in flight that read device pages
        tail = recorded.entries("record", "backup")[-1][2]
        hit = ctl.lookup(tokens)
        load = ctl.load(hit)
        load.wait_all()
        first_write = recorded.log.index(("on", "load"))
        assert ("wait", "load", tail) in recorded.log[:first_write]
        ctl.release(hit)
    finally:
        ctl.close()


def test_freeing_pages_a_load_back_still_fills_makes_the_callers_stream_wait_for_it(recorded):
    """On a device a load's copies are issued long before they are done: pages freed in between could be
    handed out again and written by the caller while the load stream still writes them."""
    engine = _Engine(0, 1, 2, host_pages=64)
    ctl = engine.ctl
    try:
        tokens = _tokens(8, 4)
        _to_host_only(engine, [tokens])
        recorded.held = {"load"}  # the load stream's copies stay in flight
        recorded.log.clear()
        hit = ctl.lookup(tokens)
        load = ctl.load(hit)
        wait_for(load.done, 30, "the load's copies to be issued")
        assert recorded.entries("wait", "caller") == []
        ctl.free(load.pages)
        assert [e[2] for e in recorded.entries("wait", "caller")] == _copy_done_events(recorded.log, "load")
        ctl.release(hit)
        ctl.end_forward()
        assert len(ctl._loads) == 1  # still in flight on the device: kept
        recorded.synchronize(recorded.record("caller"))  # the caller's stream ran past its waits
        ctl.end_forward()
        assert ctl._loads == []
    finally:
        ctl.close()


def test_copy_times_are_read_from_events_around_each_copy_once_they_completed(recorded):
    """Backup and load-back times come from timing events recorded on the side stream after its
    waits and right after its copies; they are read only once completed, so the host never blocks."""
    engine = _Engine(0, 1, 2, host_pages=64)
    ctl = engine.ctl
    row_bytes = sum(spec.row_bytes for spec in PAYLOADS.values())
    try:
        tokens = _tokens(6, 5)
        engine.request(tokens)  # a backup of 5 pages is pending
        recorded.log.clear()
        recorded.hold = True  # the copies are "in flight"
        for layer in range(2):
            ctl.backup_layer(layer)
        log = list(recorded.log)
        for on in [i for i, e in enumerate(log) if e == ("on", "backup")]:
            start, done = log[on - 1], log[on + 2]
            assert start[:2] == ("record", "backup") and done[:2] == ("record", "backup")
            assert {start[2], done[2]} <= recorded.timed
            assert [e[0] for e in log[on - 3: on - 1]] == ["record", "wait"]  # started after the caller's event
        assert ctl.stats()["backup_copy_ns"] == 0 and recorded.elapsed == []  # in flight: not read, not waited for
        assert recorded.entries("sync") == []
        recorded.incomplete.clear()
        recorded.hold = False
        stats = ctl.stats()
        assert stats["backup_copy_bytes"] == 2 * 5 * row_bytes
        assert stats["backup_copy_ns"] == 2 * 1_000_000  # the double: 1 ms per event from start to done
        ctl.end_forward()
        ctl.core.evict_device(ROWS)
        hit = ctl.lookup(tokens)
        load = ctl.load(hit)
        load.wait_all()
        ctl.release(hit)
        ctl.end_forward()
        stats = ctl.stats()
        assert stats["load_copy_bytes"] == 2 * load.num_pages * row_bytes > 0
        assert stats["load_copy_ns"] == 2 * 1_000_000  # one start, then one event per layer
        assert len(recorded.elapsed) == 3
    finally:
        ctl.close()


def test_copy_times_of_cpu_pools_are_the_hosts():
    engine = _Engine(0, 1, 2, host_pages=64)
    ctl = engine.ctl
    try:
        tokens = _tokens(7, 4)
        engine.request(tokens)
        ctl.flush_backups()
        ctl.end_forward()
        ctl.core.evict_device(ROWS)
        engine.request(tokens)  # loaded back from the host
        stats = ctl.stats()
        row_bytes = sum(spec.row_bytes for spec in PAYLOADS.values())
        assert stats["backup_copy_bytes"] == 2 * 4 * row_bytes and stats["backup_copy_ns"] > 0
        assert stats["load_copy_bytes"] == 2 * 4 * row_bytes and stats["load_copy_ns"] > 0
    finally:
        ctl.close()


# -- a controller over an NCCL process group --------------------------------------------------------


def _nccl_controller(rank: int, world: int, cp: int) -> dict:
    """CP groups of ``cp`` ranks, each told its backend is NCCL: the slab and the commit collectives
    must go over a gloo group of the same ranks (HostSlab refused the NCCL group before)."""
    if cp == world:
        mine = None
    else:
        groups = [dist.new_group(list(range(g, g + cp))) for g in range(0, world, cp)]
        mine = groups[rank // cp]
    real = dist.get_backend
    dist.get_backend = lambda group=None: "nccl" if group is mine else real(group)
    try:
        engine = _Engine(dist.get_rank(mine), cp, 2, host_pages=32, process_group=mine)
    finally:
        dist.get_backend = real
    try:
        for conv in range(4):
            engine.request(_tokens(conv, 3 + conv % 2))
        engine.ctl.flush_backups()
        engine.ctl.end_forward()
        stats = engine.ctl.stats()
        result = {"digest": engine.ctl.digest(), "slab_world": engine.ctl.slab.world_size,
                  "committed": stats["backups_committed"], "checks": stats["agreement_checks"]}
    finally:
        engine.ctl.close()
    dist.barrier()  # rank 0 holds the store
    return result


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world, cp", [(2, 2), (4, 2)])
def test_a_controller_over_nccl_sets_up_its_slab_over_gloo_of_the_same_ranks(world, cp):
    results = run_ranks(_nccl_controller, world, cp, timeout_s=200)
    for group in range(0, world, cp):
        members = results[group : group + cp]
        assert len({r["digest"] for r in members}) == 1
        assert all(r["slab_world"] == cp and r["committed"] > 0 and r["checks"] > 0 for r in members)


# -- pinning ---------------------------------------------------------------------------------------


def test_cpu_pools_on_a_gpu_machine_do_not_pin_the_slab(monkeypatch):
    """Before the fix the controller left ``pin`` to the slab, which pinned whenever CUDA was available."""
    registered = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(slab_module, "_pin", lambda region: registered.append(region.payload))
    engine = _Engine(0, 1, 1, host_pages=8, settings=_settings())
    try:
        assert engine.ctl.slab.pinned is False and registered == []
    finally:
        engine.ctl.close()


def test_pools_on_two_devices_are_refused():
    class Pool:
        def __init__(self, device):
            self.device = torch.device(device)

    assert _pools_device({"k": [Pool("cpu")], "v": [Pool("cpu")]}) == torch.device("cpu")
    with pytest.raises(InvalidArgumentError, match=r"one device, got \['cpu', 'cuda:1'\]"):
        _pools_device({"k": [Pool("cpu")], "v": [Pool("cuda:1")]})


def test_cuda_streams_are_made_for_cuda_pools_only():
    assert streams_module.stream_ops(torch.device("cpu")) is None
    ops = streams_module.stream_ops(torch.device("cuda", 1))
    assert isinstance(ops, streams_module.CudaStreams) and ops.device == torch.device("cuda", 1)
