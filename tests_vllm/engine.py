"""A tiny vLLM engine loop on the CPU: vLLM's real Scheduler and a real worker-side
OffloadingConnector, with a stand-in for the model's forward that writes known bytes into the KV
blocks it computes. Nothing of vLLM is mocked; only the model's arithmetic is replaced.

KV content: block ``i`` of a prompt holds, in layer ``l``, bytes that are a pure function of
``(l, i, the block's tokens)`` (:func:`block_bytes`), so any later reader can tell whether a block
holds exactly what was computed for it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

TINY_MODEL = Path(__file__).resolve().parent / "tiny_model"
BLOCK_TOKENS = 16
NUM_LAYERS = 3
KV_HEADS = 2
HEAD_SIZE = 16
EOS = 2

_model_configs: dict[str, ModelConfig] = {}


def model_config(dtype: str = "float32") -> ModelConfig:
    """Built once per process and dtype (vLLM inspects the architecture in a subprocess the first time)."""
    if dtype not in _model_configs:
        _model_configs[dtype] = ModelConfig(model=str(TINY_MODEL), skip_tokenizer_init=True, dtype=dtype,
                                            max_model_len=2048)
    return _model_configs[dtype]


def cpkv_extra(**overrides: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "spec_name": "CpkvOffloadingSpec",
        "spec_module_path": "cpkv.integrations.vllm",
        "cpkv_host_blocks": 64,
        "cpkv_slab": "private",
    }
    extra.update(overrides)
    return {k: v for k, v in extra.items() if v is not None}


def block_bytes(layer: int, index: int, tokens: list[int], page_bytes: int) -> torch.Tensor:
    """The KV bytes of one block in one layer: a pure function of what the block holds."""
    seed = hashlib.blake2b(repr((layer, index, tokens)).encode(), digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(seed, "little") >> 1)
    return torch.randint(0, 256, (page_bytes,), dtype=torch.uint8, generator=gen)


@dataclass
class Engine:
    extra: dict[str, Any]
    num_gpu_blocks: int = 64
    load_failure_policy: str = "fail"
    hash_algo: str = "sha256"
    # vLLM's --dtype and --kv-cache-dtype; the KV tensors take the dtype vLLM makes of them, with as
    # many head elements as keep a block's bytes those of float32 heads (only the format differs).
    model_dtype: str = "float32"
    cache_dtype: str = "auto"
    # False: the scheduler side only (vLLM's own CPU worker needs CUDA: a spec that uses it, as
    # vLLM's TieringOffloadingSpec does, is driven through its manager on the CPU).
    worker_side: bool = True
    scheduler: Scheduler = field(init=False)
    worker: OffloadingConnector = field(init=False)
    kv: dict[str, torch.Tensor] = field(init=False)
    outputs: list[Any] = field(default_factory=list)
    failed_loads: int = 0
    last_blocks: dict[str, list[int]] = field(default_factory=dict)
    # Per request: the tokens it had when first computed (prefix cache and loads), i.e. its hits.
    started_at: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.config = VllmConfig(
            model_config=model_config(self.model_dtype),
            cache_config=CacheConfig(block_size=BLOCK_TOKENS, prefix_caching_hash_algo=self.hash_algo,
                                     cache_dtype=self.cache_dtype),
            scheduler_config=SchedulerConfig(max_model_len=2048, is_encoder_decoder=False,
                                             max_num_batched_tokens=2048, max_num_seqs=8),
            kv_transfer_config=KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                kv_connector_extra_config=dict(self.extra),
                                                kv_load_failure_policy=self.load_failure_policy),
            device_config=DeviceConfig("cpu"),
        )
        self.config.cache_config.num_gpu_blocks = self.num_gpu_blocks
        self.layers = [f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS)]
        kv_dtype = kv_cache_dtype_str_to_dtype(self.cache_dtype, self.config.model_config)
        head_size = HEAD_SIZE * torch.float32.itemsize // kv_dtype.itemsize
        spec = FullAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=KV_HEADS, head_size=head_size, dtype=kv_dtype)
        self.page_bytes = spec.page_size_bytes
        kv_cache_config = KVCacheConfig(num_blocks=self.num_gpu_blocks, kv_cache_tensors=[],
                                        kv_cache_groups=[KVCacheGroupSpec(self.layers, spec)])
        with set_current_vllm_config(self.config):
            self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=kv_cache_config,
                                       structured_output_manager=StructuredOutputManager(self.config),
                                       block_size=BLOCK_TOKENS)
            if self.worker_side:
                self.worker = OffloadingConnector(self.config, KVConnectorRole.WORKER, kv_cache_config)
                # One [num_blocks, 2 (K, V), block, heads, head] tensor per layer, as an attention backend lays it.
                self.kv = {name: torch.zeros((self.num_gpu_blocks, 2, BLOCK_TOKENS, KV_HEADS, head_size),
                                             dtype=kv_dtype) for name in self.layers}
                self.worker.register_kv_caches(self.kv)
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(BLOCK_TOKENS, sha256)
        self.written: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}

    # -- handles into the two sides ----------------------------------------------------------------

    @property
    def manager(self) -> Any:
        return self.scheduler.connector.connector_scheduler.manager

    @property
    def spec(self) -> Any:
        return self.worker.connector_worker.spec

    def page(self, layer: int, block_id: int) -> torch.Tensor:
        return self.kv[self.layers[layer]][block_id].view(-1).view(torch.uint8)

    def block_ids(self, req_id: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])

    # -- requests ----------------------------------------------------------------------------------

    def add(self, req_id: str, prompt: list[int], max_tokens: int = 1) -> Request:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        params.update_from_generation_config({}, EOS)
        request = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=params,
                          pooling_params=None, block_hasher=self._hasher)
        self.scheduler.add_request(request)
        return request

    def step(self, fail_load_of: str | None = None) -> Any:
        """One engine step; ``fail_load_of``: report that request's finished load as failed
        (its blocks invalid), as a worker whose copy went wrong would."""
        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        self.worker.handle_preemptions(meta)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        self._forward(out)
        # As vLLM's model runner (kv_connector_model_runner_mixin): wait_for_save runs on every step,
        # a step without tokens too (a store a step like that creates is queued there).
        self.worker.wait_for_save()
        finished_sending, finished_recving = self.worker.get_finished(out.finished_req_ids)
        invalid: set[int] = set()
        if fail_load_of is not None and fail_load_of in finished_recving:
            invalid = set(self.block_ids(fail_load_of))
            self.failed_loads += 1
        worker_meta = self.worker.build_connector_worker_meta()
        self.worker.clear_connector_metadata()
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            req = self.scheduler.requests[req_id]
            sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
        result = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_sending=finished_sending or None, finished_recving=finished_recving or None,
                kv_connector_worker_meta=worker_meta, invalid_block_ids=invalid))
        self.outputs.append(self.scheduler.update_from_output(out, result))
        return out

    def _forward(self, out: Any) -> None:
        """The model's stand-in: writes each newly computed prompt block's known bytes."""
        for req_id, count in out.num_scheduled_tokens.items():
            req = self.scheduler.requests[req_id]
            end = req.num_computed_tokens
            start = end - count
            self.started_at.setdefault(req_id, start)
            prompt = req.prompt_token_ids
            blocks = self.block_ids(req_id)
            self.last_blocks[req_id] = blocks
            for index in range(start // BLOCK_TOKENS, -(-min(end, len(prompt)) // BLOCK_TOKENS)):
                tokens = prompt[index * BLOCK_TOKENS: (index + 1) * BLOCK_TOKENS]
                for layer in range(NUM_LAYERS):
                    data = block_bytes(layer, index, tokens, self.page_bytes)
                    self.page(layer, blocks[index]).copy_(data)
                    if len(tokens) == BLOCK_TOKENS:
                        self.written[(layer, index, tuple(tokens))] = data

    def run(self, max_steps: int = 50) -> int:
        """Steps until no request is left and every offload has landed; returns the steps taken."""
        for steps in range(1, max_steps + 1):
            self.step()
            if not self.scheduler.requests and not self.scheduler.has_requests() and not self.manager.num_pins:
                return steps
        raise AssertionError(f"the engine did not settle in {max_steps} steps "
                             f"({len(self.scheduler.requests)} requests, {self.manager.num_pins} pins)")

    def close(self) -> None:
        """vLLM 0.33's clean stop, in its order (``EngineCore.shutdown``): the executor's workers
        first (``Worker.shutdown`` -> ``ensure_kv_transfer_shutdown`` -> the worker-side connector),
        then the scheduler (``Scheduler.shutdown`` -> its connector -> the manager)."""
        self.worker.shutdown()
        self.scheduler.shutdown()

    def reset_device(self) -> None:
        """Drops vLLM's device prefix cache and zeroes the KV tensors: only the host copy is left."""
        assert self.scheduler.reset_prefix_cache(), "the device prefix cache did not reset"
        for tensor in self.kv.values():
            tensor.zero_()


def prompt(seed: int, blocks: int, extra_tokens: int = 5) -> list[int]:
    """A prompt of ``blocks`` full blocks plus a partial one, tokens in [10, 500)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(10, 500, (blocks * BLOCK_TOKENS + extra_tokens,), generator=gen).tolist()
