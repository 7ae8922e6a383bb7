"""``cpkv replay``'s options, parsed and checked once (every bad value is a one-line error)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpkv._cpkv import DEFAULT_POLICY
from cpkv.errors import InvalidArgumentError
from cpkv.runtime.timeouts import checked_timeout_s

# A verified row spells (block id, layer, payload) out whole: 8 + 4 + 4 bytes (kv_rows.kv_rows).
KV_ROW_MIN_BYTES = 16

DEFAULT_PAYLOADS = "kv:8x16:float8_e4m3fn,index:32:bfloat16"


@dataclass(frozen=True)
class ReplayOptions:
    ranks: int = 2
    page_size: int = 16
    layers: int = 2
    payloads: Any = None  # dict[str, SlabSpec]
    device_pages: int = 192
    host_pages: int = 1536
    policy: str = DEFAULT_POLICY
    check_every: int = 4
    admission: bool = True
    batch: int = 4
    timeout_s: float = 60.0
    progress: bool = True
    device: str = "cpu"  # cpu (shared memory) or cuda (GPU memory, CUDA IPC)
    l3_dir: str | None = None  # the durable third tier's directory (None: no L3)
    l3_bytes: int | None = None  # its cap on disk
    cluster_master: str | None = None  # the cluster tier's Mooncake master, HOST:PORT (None: no cluster tier)
    cluster_metadata: str | None = None  # its HTTP metadata server's URL
    cluster_bytes: int | None = None  # memory the instance lends the cluster store (None: none)
    cluster_put: str = "eviction"  # when pages go to the cluster: on host eviction, or on backup (measured)


def parse_payloads(text: str) -> dict[str, Any]:
    """``name:AxB:dtype,...`` into SlabSpecs, e.g. ``kv:8x16:float8_e4m3fn,index:32:bfloat16``.

    The text is checked before torch is imported (seconds), so a typo fails at once."""
    parsed: dict[str, tuple[tuple[int, ...], str]] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        fields = item.split(":")
        if len(fields) != 3 or not fields[0]:
            raise InvalidArgumentError(f"--payloads: {item!r} is not name:SHAPE:dtype (e.g. kv:8x16:bfloat16)")
        name, shape_text, dtype_name = fields
        try:
            shape = tuple(int(d) for d in shape_text.split("x"))
        except ValueError:
            raise InvalidArgumentError(f"--payloads: {item!r}: shape {shape_text!r} is not like 8x16") from None
        if name in parsed:
            raise InvalidArgumentError(f"--payloads: payload {name!r} is given twice")
        parsed[name] = (shape, dtype_name)
    if not parsed:
        raise InvalidArgumentError("--payloads needs at least one payload")
    import torch

    from cpkv.tier import SlabSpec

    specs: dict[str, Any] = {}
    for name, (shape, dtype_name) in parsed.items():
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgumentError(f"--payloads: {name}:{'x'.join(map(str, shape))}:{dtype_name}: "
                                       f"unknown dtype {dtype_name!r}")
        specs[name] = SlabSpec(shape, dtype)
    return specs


def check(options: ReplayOptions, longest_request_pages: int) -> None:
    """Everything that makes no sense, before any process starts."""
    from cpkv import PrefixTree

    for name in ("ranks", "page_size", "layers", "device_pages", "host_pages", "check_every", "batch"):
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    from cpkv.tier.l3.tier import check_l3_options

    check_l3_options(options.l3_dir, options.l3_bytes)
    from cpkv.tier.cluster.tier import check_cluster_options

    check_cluster_options(options.cluster_master, options.cluster_metadata, options.cluster_bytes)
    if options.cluster_put not in ("eviction", "backup"):
        raise InvalidArgumentError(f"--cluster-put {options.cluster_put!r}: eviction or backup")
    if options.cluster_put == "backup" and options.device != "cpu":
        raise InvalidArgumentError("--cluster-put backup reads the device pools on the host: --device cpu only")
    if options.device not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"--device {options.device!r}: cpu or cuda")
    if options.ranks > 16:
        raise InvalidArgumentError(f"--ranks {options.ranks}: at most 16 CP ranks on one node")
    checked_timeout_s(options.timeout_s, "--timeout")
    if options.policy not in PrefixTree.POLICIES:
        from cpkv.errors import UnknownPolicyError

        raise UnknownPolicyError(f"--policy: unknown eviction policy {options.policy!r} "
                                 f"(known: {', '.join(PrefixTree.POLICIES)})")
    if options.payloads is not None and options.l3_bytes is not None:
        from cpkv import _cpkv
        from cpkv.tier.l3.store import slots_for

        page_bytes = options.layers * sum(spec.row_bytes for spec in options.payloads.values())
        if slots_for(options.l3_bytes, int(_cpkv.l3_record_bytes(page_bytes)), options.ranks) < 1:
            raise InvalidArgumentError(f"--l3-bytes {options.l3_bytes} holds no page of {page_bytes} bytes "
                                       f"({options.layers} layers of every payload)")
    if options.payloads is not None:
        for name, spec in options.payloads.items():
            if spec.row_bytes < KV_ROW_MIN_BYTES:
                raise InvalidArgumentError(
                    f"--payloads: {name}'s page is {spec.row_bytes} bytes; the byte check needs at least "
                    f"{KV_ROW_MIN_BYTES} to tell every (block, layer, payload) apart")
    from cpkv import MAX_PAGES

    for name in ("device_pages", "host_pages"):
        if getattr(options, name) > MAX_PAGES:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} {getattr(options, name)}: at most {MAX_PAGES} pages")
    if options.layers > 2**32 - 1:
        raise InvalidArgumentError(f"--layers {options.layers}: at most 2**32-1 layers")
    if options.device_pages < max(options.ranks, longest_request_pages + 1):
        raise InvalidArgumentError(
            f"--device-pages {options.device_pages} cannot hold one request: the longest has "
            f"{longest_request_pages} pages (need at least {max(options.ranks, longest_request_pages + 1)})")
    if options.host_pages < longest_request_pages:
        raise InvalidArgumentError(f"--host-pages {options.host_pages} cannot hold one request: the longest has "
                                   f"{longest_request_pages} pages")
