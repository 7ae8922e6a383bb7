"""Where a page's bytes lie in an SGLang 0.5.23 host pool, computed from the pool's layout.

SGLang's zero-copy storage interface gives, per page, a list of (pointer, size) entries
(``get_page_buffer_meta``), computed in Python per page. The backend computes the same addresses
natively from a table of entries, one row per entry of a page: ``(buffer, offset, stride, divisor,
bytes)``, the entry at ``buffers[buffer] + offset + (first // divisor) * stride``, ``bytes`` long,
``first`` the page's first host index. This module writes that table for the classes whose
``get_page_buffer_meta`` it reproduces, read from SGLang's source (``mem_cache/pool_host/``):

- ``MHATokenToKVPoolHost`` (and its subclasses that keep its method, such as
  ``HiSparseMHATokenToKVPoolHost``): one ``kv_buffer``, V ``layer_num * size`` token rows after K;
  ``layer_first``: K then V of each layer; ``page_first``, ``page_first_direct``, ``page_head``: K
  and V of all layers;
- ``AsymmetricMHATokenToKVPoolHost`` (K and V head dims differ): ``k_buffer`` and ``v_buffer``,
  entries of unequal sizes; ``page_first_direct`` counts whole pages;
- ``MHATokenToKOnlyPoolHost``: ``k_buffer``;
- ``MLATokenToKVPoolHost`` (decode CP off): ``kv_buffer``, one entry per layer (``layer_first``) or
  one per page; ``page_first_kv_split``: ``k_buffer``, ``v_buffer`` (unless FP8 DSA packs V into
  K), ``index_k_buffer``, ``index_k_scale_buffer`` where present, of unequal sizes;
- ``DSAIndexerPoolHost``: ``index_k_with_scale_buffer``, whole pages.

Any other class (Mamba state, unified pools, ...) has no table: the backend asks its
``get_page_buffer_meta`` once per batch (``mode == "meta"``). At registration
:func:`check_layout` compares the table's addresses with ``get_page_buffer_meta``'s for the first,
second and last page, and ``tests_sglang/test_layout.py`` for every page of every layout SGLang builds
on the CPU: a change of SGLang's rules fails there, never silently here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cpkv.errors import EngineVersionError

__all__ = ["HostLayout", "check_layout", "host_layout"]


@dataclass(frozen=True)
class HostLayout:
    buffers: list[Any]  # the pool's CPU tensors the entries lie in
    entries: np.ndarray  # int64 [E, 5]: buffer, offset, stride, divisor, bytes


def _itemsize(dtype: Any) -> int:
    return int(dtype.itemsize)


def _mha(pool: Any) -> HostLayout:
    it = _itemsize(pool.dtype)
    token = pool.head_num * pool.head_dim * it  # one token of one layer of K (or V)
    v_offset = pool.layer_num * pool.size * token
    rows = []
    if pool.layout == "layer_first":
        for layer in range(pool.layer_num):
            for part in range(2):  # K, then V
                rows.append((0, part * v_offset + layer * pool.size * token, token, 1, pool.page_size * token))
    elif pool.layout in ("page_first", "page_first_direct", "page_head"):
        for part in range(2):
            rows.append((0, part * v_offset, pool.layer_num * token, 1, pool.layer_num * pool.page_size * token))
    else:
        raise _unsupported(pool)
    return HostLayout([pool.kv_buffer], np.array(rows, dtype=np.int64))


def _asymmetric_mha(pool: Any) -> HostLayout:
    if pool.layout not in ("page_first", "page_first_direct"):
        raise _unsupported(pool)
    it = _itemsize(pool.dtype)
    direct = pool.layout == "page_first_direct"
    rows = []
    for buffer, dim in enumerate((pool.head_dim, pool.v_head_dim)):
        token = pool.layer_num * pool.head_num * dim * it  # one token of every layer
        if direct:  # whole pages: (first // page_size) * one page of every layer
            rows.append((buffer, 0, pool.page_size * token, pool.page_size, pool.page_size * token))
        else:
            rows.append((buffer, 0, token, 1, pool.page_size * token))
    return HostLayout([pool.k_buffer, pool.v_buffer], np.array(rows, dtype=np.int64))


def _k_only(pool: Any) -> HostLayout:
    if pool.layout not in ("page_first", "page_first_direct"):
        raise _unsupported(pool)
    token = pool.layer_num * pool.head_num * pool.head_dim * _itemsize(pool.dtype)
    return HostLayout([pool.k_buffer], np.array([(0, 0, token, 1, pool.page_size * token)], dtype=np.int64))


def _mla(pool: Any) -> HostLayout:
    if getattr(pool, "dcp_size", 1) != 1:
        raise _unsupported(pool, "decode CP")
    it = _itemsize(pool.dtype)
    ps = pool.page_size
    if pool.layout == "page_first_kv_split":
        buffers: list[Any] = [pool.k_buffer]
        k_token = pool.layer_num * pool.k_buffer.shape[-1] * pool.k_buffer.element_size()
        rows = [(0, 0, k_token, 1, ps * k_token)]
        if not getattr(pool, "dsa_kv_cache_store_fp8", False):
            v_token = pool.layer_num * pool.qk_rope_head_dim * it
            buffers.append(pool.v_buffer)
            rows.append((len(buffers) - 1, 0, v_token, 1, ps * v_token))
        index_k = getattr(pool, "index_k_buffer", None)
        indexer_layers = index_k.shape[1] if index_k is not None else 0
        if index_k is not None:
            i_token = indexer_layers * index_k.shape[-1] * index_k.element_size()
            buffers.append(index_k)
            rows.append((len(buffers) - 1, 0, i_token, 1, ps * i_token))
        scale = getattr(pool, "index_k_scale_buffer", None)
        if scale is not None:
            s_token = indexer_layers * 4  # one fp32 scale per token and indexer layer
            buffers.append(scale)
            rows.append((len(buffers) - 1, 0, s_token, 1, ps * s_token))
        return HostLayout(buffers, np.array(rows, dtype=np.int64))
    token = pool.kv_cache_dim * it  # one token of one layer
    if pool.layout == "layer_first":
        rows = [(0, layer * pool.size * token, token, 1, ps * token) for layer in range(pool.layer_num)]
    elif pool.layout in ("page_first", "page_first_direct"):
        rows = [(0, 0, pool.layer_num * token, 1, pool.layer_num * ps * token)]
    else:
        raise _unsupported(pool)
    return HostLayout([pool.kv_buffer], np.array(rows, dtype=np.int64))


def _dsa_indexer(pool: Any) -> HostLayout:
    if pool.layout not in ("page_first", "page_first_direct"):
        raise _unsupported(pool)
    page = pool.layer_num * pool.indexer_page_stride_size * _itemsize(pool.indexer_dtype)
    return HostLayout([pool.index_k_with_scale_buffer],
                      np.array([(0, 0, page, pool.page_size, page)], dtype=np.int64))


def _unsupported(pool: Any, what: str | None = None) -> EngineVersionError:
    return EngineVersionError(
        f"{type(pool).__name__} with layout {getattr(pool, 'layout', None)!r}"
        + (f" under {what}" if what else "") + ": SGLang 0.5.23's get_page_buffer_meta refuses it, so no storage "
        "backend can copy its pages")


def _rules() -> list[tuple[Any, Any]]:
    """(SGLang's get_page_buffer_meta function, the table that reproduces it)."""
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost
    from sglang.srt.mem_cache.pool_host.mha import (
        AsymmetricMHATokenToKVPoolHost,
        MHATokenToKOnlyPoolHost,
        MHATokenToKVPoolHost,
    )
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    return [(MHATokenToKVPoolHost.get_page_buffer_meta, _mha),
            (AsymmetricMHATokenToKVPoolHost.get_page_buffer_meta, _asymmetric_mha),
            (MHATokenToKOnlyPoolHost.get_page_buffer_meta, _k_only),
            (MLATokenToKVPoolHost.get_page_buffer_meta, _mla),
            (DSAIndexerPoolHost.get_page_buffer_meta, _dsa_indexer)]


def host_layout(pool: Any) -> HostLayout | None:
    """The table of ``pool``'s pages, or None for a class this module does not model (its
    ``get_page_buffer_meta`` is not one of the methods above)."""
    method = getattr(type(pool), "get_page_buffer_meta", None)
    for sglang_method, table in _rules():
        if method is sglang_method:
            return table(pool)
    return None


def check_layout(pool: Any, name: str, addresses: Any, entry_sizes: list[int]) -> None:
    """Compares ``addresses(indices, pages)`` (the native pool's addresses from the table) and
    ``entry_sizes`` with the pool's own ``get_page_buffer_meta`` for its first, second and last page; raises
    :class:`~cpkv.errors.EngineVersionError` naming the first difference."""
    import torch

    page_size = int(pool.page_size)
    tokens = int(getattr(pool, "size", 0) or 0)
    firsts = sorted({0, page_size, max(0, tokens // page_size - 1) * page_size} if tokens >= page_size else {0})
    for first in firsts:
        idx = torch.arange(first, first + page_size, dtype=torch.int64)
        ptrs, sizes = pool.get_page_buffer_meta(idx)
        ours = [int(a) for a in np.asarray(addresses(idx, 1)).reshape(-1)]
        if ours != [int(p) for p in ptrs] or [int(s) for s in sizes] != list(entry_sizes):
            raise EngineVersionError(
                f"host pool {name!r} ({type(pool).__name__}, layout {getattr(pool, 'layout', None)!r}): the page at host "
                f"index {first} is at {[hex(p) for p in ours]} (sizes {list(entry_sizes)}) by cpkv's layout table, at "
                f"{[hex(int(p)) for p in ptrs]} (sizes {[int(s) for s in sizes]}) by SGLang's get_page_buffer_meta")
