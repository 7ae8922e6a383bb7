"""cpkv as vLLM's offloading backend, driven by vLLM's real Scheduler and worker-side
OffloadingConnector on the CPU (tests_vllm/engine.py): store, device reset, reload byte for byte;
the whole prompt is never a hit; capacity pressure evicts in cpkv's policy order and identically in
two engines; preemption and a failed load leave nothing pinned; bad settings fail at construction.
"""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_offload.base import make_offload_key

from cpkv.errors import InvalidArgumentError, UnknownPolicyError
from engine import BLOCK_TOKENS, NUM_LAYERS, Engine, block_bytes, cpkv_extra, prompt


def keys_of(request, blocks: int | None = None) -> list[bytes]:
    hashes = request.block_hashes if blocks is None else request.block_hashes[:blocks]
    return [make_offload_key(h, 0) for h in hashes]


def expected(eng: Engine, tokens: list[int], index: int, layer: int) -> torch.Tensor:
    return block_bytes(layer, index, tokens[index * BLOCK_TOKENS: (index + 1) * BLOCK_TOKENS], eng.page_bytes)


def run_until_loaded(eng: Engine, req_id: str) -> list[int]:
    """Steps until ``req_id`` computes; returns its device blocks as they were in that step."""
    for _ in range(10):
        out = eng.step()
        if req_id in out.num_scheduled_tokens:
            return eng.last_blocks[req_id]
    raise AssertionError(f"{req_id} was never scheduled")


@pytest.mark.parametrize("slab", ["private", "shared"])
def test_store_reset_reload_is_byte_exact(slab: str) -> None:
    eng = Engine(cpkv_extra(cpkv_slab=slab))
    tokens = prompt(1, blocks=6)
    first = eng.add("first", tokens)
    eng.run()
    keys = keys_of(first)
    assert len(keys) == 6
    manager, worker = eng.manager, eng.spec._worker
    assert sorted(manager.resident_keys()) == sorted(keys) and manager.num_pins == 0
    # The host copy holds what the forward wrote, in every layer.
    for index, key in enumerate(keys):
        for layer in range(NUM_LAYERS):
            assert torch.equal(worker.host_row(layer, manager.row_of(key)).reshape(-1),
                               expected(eng, tokens, index, layer))

    eng.reset_device()
    again = eng.add("again", tokens)
    blocks = run_until_loaded(eng, "again")
    for index in range(6):
        for layer in range(NUM_LAYERS):
            assert torch.equal(eng.page(layer, blocks[index]), expected(eng, tokens, index, layer)), (index, layer)
    eng.run()
    assert keys_of(again) == keys
    assert manager.num_pins == 0
    manager.check()


def test_a_hit_never_covers_the_whole_prompt() -> None:
    eng = Engine(cpkv_extra())
    tokens = prompt(2, blocks=5, extra_tokens=0)  # whole blocks only: every chunk is on the host
    eng.add("first", tokens)
    eng.run()
    assert len(eng.manager.resident_keys()) == 5
    eng.reset_device()
    eng.add("again", tokens)
    computed = 0
    for _ in range(10):
        out = eng.step()
        computed += out.num_scheduled_tokens.get("again", 0)
        if "again" not in eng.scheduler.requests:
            break
    assert computed >= 1, "vLLM must compute at least one prompt token"
    assert computed < BLOCK_TOKENS + 1, f"only the last block may be recomputed, computed {computed} tokens"
    assert eng.manager.num_pins == 0


def fill(eng: Engine, name: str, seed: int, blocks: int) -> object:
    request = eng.add(name, prompt(seed, blocks))
    eng.run()
    return request


@pytest.mark.parametrize("policy, victim", [("lru", "b"), ("fifo", "a")])
def test_capacity_pressure_evicts_in_policy_order(policy: str, victim: str) -> None:
    eng = Engine(cpkv_extra(cpkv_host_blocks=8, cpkv_policy=policy))
    a = fill(eng, "a", 10, 4)
    b = fill(eng, "b", 11, 4)
    assert len(eng.manager.resident_keys()) == 8
    # a is read back (an access): lru now keeps a over b; fifo still drops a, the first stored.
    eng.reset_device()
    eng.add("a2", prompt(10, 4))
    eng.run()
    assert eng.manager.recent_evictions() == []
    c = fill(eng, "c", 12, 4)
    dropped = keys_of(a if victim == "a" else b)
    assert eng.manager.recent_evictions() == dropped, "whole chain of the policy's victim, head to tail"
    assert sorted(eng.manager.resident_keys()) == sorted(keys_of(b if victim == "a" else a) + keys_of(c))
    eng.manager.check()


def test_eviction_takes_leaves_before_their_prefix() -> None:
    eng = Engine(cpkv_extra(cpkv_host_blocks=6))
    shared = prompt(20, 2, extra_tokens=0)
    one = eng.add("one", shared + prompt(21, 2))
    eng.run()
    two = eng.add("two", shared + prompt(22, 2))  # the device cache hits the shared prefix
    eng.run()
    eng.add("three", prompt(23, 2))
    eng.run()
    evicted = eng.manager.recent_evictions()
    prefix = set(keys_of(one, 2))
    assert evicted and not prefix & set(evicted), "a shared prefix outlives the chains that continue it"
    assert set(evicted) <= set(keys_of(one)[2:] + keys_of(two)[2:])


def replay_engine(policy: str, extra_request: bool = False) -> Engine:
    eng = Engine(cpkv_extra(cpkv_host_blocks=10, cpkv_policy=policy))
    for i, (seed, blocks) in enumerate([(30, 4), (31, 3), (30, 5), (32, 4), (33, 2), (31, 4)]):
        eng.add(f"r{i}", prompt(seed, blocks))
        eng.run()
        if i == 2:
            eng.reset_device()
    if extra_request:
        eng.add("extra", prompt(34, 1))
        eng.run()
    return eng


@pytest.mark.parametrize("policy", ["lru", "ghost"])
def test_two_engines_fed_the_same_calls_agree(policy: str) -> None:
    one, two = replay_engine(policy), replay_engine(policy)
    assert one.manager.recent_evictions(), "the trace must put the host under pressure"
    assert one.manager.recent_evictions() == two.manager.recent_evictions()
    assert one.manager.digest() == two.manager.digest()
    assert replay_engine(policy, extra_request=True).manager.digest() != one.manager.digest()


def test_preemption_leaves_nothing_pinned() -> None:
    eng = Engine(cpkv_extra(cpkv_host_blocks=32), num_gpu_blocks=12)
    eng.add("p", prompt(40, 4), max_tokens=60)
    eng.add("q", prompt(41, 4), max_tokens=60)
    preempted = set()
    for _ in range(200):
        out = eng.step()
        preempted |= set(out.preempted_req_ids or ())
        if not eng.scheduler.requests and eng.manager.num_pins == 0:
            break
    assert preempted, "the device cache was meant to run out"
    assert eng.manager.num_pins == 0 and eng.manager.pinned_keys() == []
    resident = len(eng.manager.resident_keys())
    assert resident >= 4
    assert len(eng.manager.evict(resident)) == resident, "every chunk must be evictable again"
    eng.manager.check()


@pytest.mark.parametrize("failure_policy", ["fail", "recompute"])
def test_failed_load_leaves_nothing_pinned(failure_policy: str) -> None:
    eng = Engine(cpkv_extra(), load_failure_policy=failure_policy)
    tokens = prompt(50, 4)
    eng.add("first", tokens)
    eng.run()
    eng.reset_device()
    eng.add("again", tokens)
    for _ in range(20):
        eng.step(fail_load_of=None if eng.failed_loads else "again")  # the first load fails
        if not eng.scheduler.requests and eng.manager.num_pins == 0:
            break
    assert eng.failed_loads == 1, "the load was meant to be reported failed once"
    assert eng.manager.num_pins == 0 and eng.manager.pinned_keys() == []
    finished = [o for outs in eng.outputs for core in outs.values() for o in core.outputs if o.request_id == "again"]
    assert finished and finished[-1].finish_reason is not None
    eng.manager.check()


@pytest.mark.parametrize("extra, error, words", [
    ({"cpkv_host_blocks": None}, InvalidArgumentError, ["cpkv_host_blocks"]),
    ({"cpkv_host_blocks": 0}, InvalidArgumentError, ["cpkv_host_blocks", "0"]),
    ({"cpkv_host_blocks": -3}, InvalidArgumentError, ["cpkv_host_blocks", "-3"]),
    ({"cpkv_host_blocks": "many"}, InvalidArgumentError, ["cpkv_host_blocks", "many"]),
    ({"cpkv_host_blocks": 2.5}, InvalidArgumentError, ["cpkv_host_blocks", "2.5"]),
    ({"cpkv_host_blocks": True}, InvalidArgumentError, ["cpkv_host_blocks", "True"]),
    ({"cpkv_policy": "mru"}, UnknownPolicyError, ["cpkv_policy", "mru"]),
    ({"cpkv_slab": "gpu"}, InvalidArgumentError, ["cpkv_slab", "gpu"]),
    ({"cpkv_host_blocks": 2**31}, InvalidArgumentError, ["cpkv_host_blocks", str(2**31 - 1)]),
    ({"cpkv_polcy": "lfu"}, InvalidArgumentError, ["'cpkv_polcy'", "cpkv_policy"]),
    ({"cpkv_timeout_s": 1e15}, InvalidArgumentError, ["cpkv_timeout_s", "1000000000000000.0"]),
    ({"cpkv_timeout_s": 1e300}, InvalidArgumentError, ["cpkv_timeout_s"]),
    ({"cpkv_timeout_s": 1e-9}, InvalidArgumentError, ["cpkv_timeout_s"]),
    ({"cpkv_timeout_s": float("nan")}, InvalidArgumentError, ["cpkv_timeout_s"]),
    # 2**31 - 1 blocks of this engine's rows: hundreds of TB, refused before any byte is allocated.
    ({"cpkv_host_blocks": 2**31 - 1}, InvalidArgumentError, ["cpkv_host_blocks=2147483647", "memory"]),
    ({"cpkv_host_blocks": 2**31 - 1, "cpkv_slab": "shared"}, InvalidArgumentError, ["cpkv_host_blocks=2147483647", "memory"]),
])
def test_bad_config_fails_at_construction(extra: dict, error: type, words: list[str]) -> None:
    with pytest.raises(error) as caught:
        Engine(cpkv_extra(**extra))
    for word in words:
        assert word in str(caught.value)


def test_the_readme_kv_transfer_configs_build_the_backend() -> None:
    import importlib
    import json
    import re

    from conftest import REPO_ROOT

    text = (REPO_ROOT / "README.md").read_text()
    configs = [json.loads(raw) for raw in re.findall(r"--kv-transfer-config '(\{.*\})'", text)]
    specs = [c["kv_connector_extra_config"]["spec_name"] for c in configs]
    assert sorted(specs) == ["CpkvOffloadingSpec", "TieringOffloadingSpec"], specs
    # The tiering one names cpkv's cluster tier where vLLM's tiering spec imports it from.
    (tiering,) = [c for c in configs if c["kv_connector_extra_config"]["spec_name"] == "TieringOffloadingSpec"]
    (tier,) = tiering["kv_connector_extra_config"]["secondary_tiers"]
    from cpkv.integrations.vllm.cluster_tier import CpkvClusterTier

    assert getattr(importlib.import_module(tier["module_path"]), tier["type"]) is CpkvClusterTier
    (config,) = [c for c in configs if c["kv_connector_extra_config"]["spec_name"] == "CpkvOffloadingSpec"]
    assert (config["kv_connector"], config["kv_role"]) == ("OffloadingConnector", "kv_both")
    extra = dict(config["kv_connector_extra_config"], cpkv_host_blocks=16)  # the README's size, scaled down
    eng = Engine(extra)
    from cpkv.integrations.vllm import CpkvOffloadingManager, CpkvOffloadingSpec

    assert isinstance(eng.spec, CpkvOffloadingSpec) and isinstance(eng.manager, CpkvOffloadingManager)
    from cpkv import DEFAULT_POLICY

    assert eng.manager.policy == extra.get("cpkv_policy", DEFAULT_POLICY) and eng.spec._worker.slab is not None
