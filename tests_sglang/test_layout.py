"""The native copy path against SGLang's own host pools, in one process (no ranks, no controller).

- Every host pool SGLang 0.5.23's ``build_kv_host_pool`` (and the DSA indexer's builder) makes on
  the CPU, in every layout it accepts there: the addresses cpkv computes from its layout table equal
  SGLang's ``get_page_buffer_meta`` for every page (a change of SGLang's layout rules fails here).
- The store/read batch calls (``SglangIndex.store_pages``/``read_pages``) against a reference model
  (hypothesis): a read answers a key only with the bytes stored for it; a refused call (bad host
  indices) changes nothing; placed keys are readable at once. Run on a pool whose entries have
  unequal sizes (``AsymmetricMHATokenToKVPoolHost``, K and V head dims differ), on a page-first MLA
  pool, and through ``get_page_buffer_meta`` for a class the layout tables do not model.
"""

from __future__ import annotations

import ctypes
import hashlib
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpkv._cpkv import SglangIndex, SglangPool
from cpkv.errors import InternalError, InvalidArgumentError
from cpkv.integrations.sglang.layout import host_layout

warnings.filterwarnings("ignore")

LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]


def _publish(layout: str) -> None:
    import sglang.srt.mem_cache.pool_host.common as host_common
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    host_common._cuda_host_register = lambda *args, **kwargs: None  # no GPU: plain CPU host pools
    runtime_context.publish(ServerArgs(model_path="dummy", hicache_mem_layout=layout, hicache_io_backend="direct",
                                       hicache_ratio=2.0), role="scheduler")


def build_pools(kind: str, layout: str) -> list[Any]:
    """The host pools SGLang's builders make for ``kind`` in ``layout`` (raises where SGLang refuses)."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_kv_host_pool
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl

    _publish(layout)
    if kind == "mha":
        kv = MHATokenToKVPool(256, 4, torch.float16, 2, 8, 3, "cpu", False, start_layer=0, end_layer=2)
    elif kind == "mha_asymmetric":  # K head dim 8, V head dim 4: entries of unequal sizes
        kv = MHATokenToKVPool(256, 4, torch.float16, 2, 8, 3, "cpu", False, start_layer=0, end_layer=2, v_head_dim=4)
    elif kind == "mla":
        kv = MLATokenToKVPool(256, 4, torch.bfloat16, 16, 8, 3, "cpu", False, start_layer=0, end_layer=2)
    else:  # dsa: MLA latent + the indexer, 64-token pages
        kv = DSATokenToKVPool(512, 64, 16, torch.bfloat16, 8, 2, "cpu", 128, False, 24)
    host = build_kv_host_pool(kv_pool=kv, page_size=kv.page_size)
    pools = [host]
    if kind == "dsa":
        pools.append(DSAIndexerPoolHost(decl=make_dsa_indexer_pool_decl(kv), anchor_host=host,
                                        allocator_type="default"))
    return pools


KINDS = ["mha", "mha_asymmetric", "mla", "dsa"]
# What SGLang 0.5.23 refuses to build on the CPU (page_first_kv_split is NPU-only; it is not tried).
REFUSED = {("mha_asymmetric", "layer_first"), ("mha_asymmetric", "page_head"), ("mla", "page_head"), ("dsa", "page_head")}


def native_pool(host: Any, rows: int = 16, *, use_layout: bool = True) -> tuple[SglangPool, dict]:
    """An SglangPool over ``host`` and a plain CPU slab of ``rows`` rows (what PoolSlab builds over
    its shared-memory slab)."""
    layout = host_layout(host) if use_layout else None
    if layout is not None:
        buffers, entries, meta = layout.buffers, layout.entries, None
        sizes = [int(b) for b in entries[:, 4]]
    else:
        from cpkv.integrations.sglang.pool import _cpu_buffers

        buffers, entries, meta = _cpu_buffers(host), None, host.get_page_buffer_meta
        sizes = [int(s) for s in host.get_page_buffer_meta(torch.arange(host.page_size))[1]]
    slab = {"data": torch.zeros(rows, sum(sizes), dtype=torch.uint8), "stamps": torch.zeros(rows, dtype=torch.int64),
            "tags": torch.zeros(rows, dtype=torch.int64)}
    pool = SglangPool("kv", list(buffers), entries, meta, sizes, host.page_size, host.size, slab["data"],
                      slab["stamps"], slab["tags"])
    return pool, slab


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
def test_addresses_equal_sglangs_page_buffer_meta(kind: str, layout: str) -> None:
    """Every pool SGLang builds here whose zero-copy metadata it serves is modelled, and the table's
    addresses and sizes equal SGLang's for every page; a pool whose metadata SGLang refuses is
    refused by the table too."""
    from cpkv.errors import EngineVersionError

    try:
        hosts = build_pools(kind, layout)
    except (ValueError, NotImplementedError):
        assert (kind, layout) in REFUSED
        return
    assert (kind, layout) not in REFUSED
    for host in hosts:
        pages = host.size // host.page_size
        idx = torch.arange(pages * host.page_size, dtype=torch.int64)
        try:
            ptrs, sizes = host.get_page_buffer_meta(idx)
        except ValueError:  # the DSA indexer in layer_first: no storage backend can copy it
            with pytest.raises(EngineVersionError, match=layout):
                host_layout(host)
            continue
        assert host_layout(host) is not None, type(host).__name__
        pool, _ = native_pool(host)
        assert pool.mode == "layout"
        ours = pool.addresses(idx, pages)
        assert ours.reshape(-1).tolist() == [int(p) for p in ptrs], (kind, layout, type(host).__name__)
        assert pool.entry_sizes * pages == [int(s) for s in sizes]


def test_a_changed_layout_rule_is_caught_at_registration() -> None:
    """PoolSlab's registration check compares the table with get_page_buffer_meta: a pool whose
    method answers otherwise (as a changed SGLang would) is refused, naming both addresses."""
    from cpkv.errors import EngineVersionError
    from cpkv.integrations.sglang.layout import check_layout

    (host,) = build_pools("mha", "page_first_direct")
    pool, _ = native_pool(host)
    check_layout(host, "kv", pool.addresses, pool.entry_sizes)  # the real rule passes
    real = host.get_page_buffer_meta

    def shifted(indices: Any) -> Any:
        ptrs, sizes = real(indices)
        return [p + 64 for p in ptrs], sizes

    host.get_page_buffer_meta = shifted
    with pytest.raises(EngineVersionError, match="get_page_buffer_meta"):
        check_layout(host, "kv", pool.addresses, pool.entry_sizes)


# -- the batch calls against a reference ---------------------------------------------------------------


def page_content(key: str, nbytes: int) -> bytes:
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def read_page(host: Any, first: int) -> bytes:
    """The page's bytes, read at SGLang's own addresses (get_page_buffer_meta)."""
    ptrs, sizes = host.get_page_buffer_meta(torch.arange(first, first + host.page_size))
    return b"".join(ctypes.string_at(int(p), int(s)) for p, s in zip(ptrs, sizes))


def write_page(host: Any, first: int, data: bytes) -> None:
    ptrs, sizes = host.get_page_buffer_meta(torch.arange(first, first + host.page_size))
    at = 0
    for p, s in zip(ptrs, sizes):
        ctypes.memmove(int(p), data[at:at + int(s)], int(s))
        at += int(s)


def _hosts() -> dict[str, Any]:
    (asym,) = build_pools("mha_asymmetric", "page_first_direct")
    (mla,) = build_pools("mla", "page_first")
    (meta,) = build_pools("mha", "layer_first")
    meta.__class__ = type("UnmodelledHost", (type(meta),), {
        "get_page_buffer_meta": lambda self, indices: type(meta).__mro__[1].get_page_buffer_meta(self, indices)})
    assert host_layout(meta) is None
    return {"asymmetric": asym, "mla": mla, "meta": meta}


HOSTS: dict[str, Any] = {}

KEYS = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(24)]
op = st.one_of(
    st.tuples(st.just("store"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=6)),
    st.tuples(st.just("read"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=6)),
    st.tuples(st.just("bad_store"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=4)),
    st.tuples(st.just("bad_read"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=4)),
)


@pytest.mark.parametrize("which", ["asymmetric", "mla", "meta"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=25), rows=st.integers(2, 12))
def test_batch_calls_match_a_reference(which: str, ops: list, rows: int) -> None:
    if not HOSTS:
        HOSTS.update(_hosts())
    host = HOSTS[which]
    pool, slab = native_pool(host, rows, use_layout=which != "meta")
    assert pool.mode == ("meta" if which == "meta" else "layout")
    if which == "asymmetric":
        assert len(set(pool.entry_sizes)) > 1  # entries of unequal sizes
    index = SglangIndex(rows, "lru")
    ps, nbytes = host.page_size, pool.page_bytes
    pages_in_pool = host.size // ps

    def indices(n: int, start: int) -> torch.Tensor:
        firsts = [((start + 3 * i) % (pages_in_pool - 1) + 1) * ps for i in range(n)]  # page 0 left alone
        return torch.cat([torch.arange(f, f + ps) for f in firsts])

    def state() -> tuple:
        return (index.digest(), slab["data"].clone(), slab["stamps"].clone(), slab["tags"].clone(),
                [read_page(host, p * ps) for p in range(pages_in_pool)])

    for step, (kind, keys) in enumerate(ops):
        if kind == "store":
            idx = indices(len(keys), step)
            for i, k in enumerate(keys):
                write_page(host, int(idx[i * ps]), page_content(k, nbytes))
            placed, written, _ = index.store_pages(keys, None, pool, idx, 1, 0)
            assert written <= sum(placed)
            readable = index.held(keys, pool)
            assert readable == placed  # a placed key is readable at once
        elif kind == "read":
            idx = indices(len(keys), step + 7)
            for i in range(len(keys)):
                write_page(host, int(idx[i * ps]), b"\0" * nbytes)
            ok, good, torn = index.read_pages(keys, pool, idx)
            assert torn == 0 and good == sum(ok)
            assert ok == index.held(keys, pool)
            for i, k in enumerate(keys):
                got = read_page(host, int(idx[i * ps]))
                assert got == (page_content(k, nbytes) if ok[i] else b"\0" * nbytes), (i, k, ok)
        else:
            idx = indices(len(keys), step)
            bad = idx.clone()
            bad[(len(keys) - 1) * ps] = host.size + ps  # the last page outside the pool
            before = state()
            with pytest.raises(InvalidArgumentError, match=f"page {len(keys) - 1} has host index"):
                if kind == "bad_store":
                    index.store_pages(keys, None, pool, bad, 1, 0)
                else:
                    index.read_pages(keys, pool, bad)
            after = state()
            assert after[0] == before[0]
            assert all(torch.equal(a, b) for a, b in zip(after[1:4], before[1:4]))
            assert after[4] == before[4]
        index.check()
    pool.close()
    with pytest.raises(InvalidArgumentError, match="closed"):
        index.read_pages(KEYS[:1], pool, indices(1, 0))


# -- the tensor calls (get / batch_set) on the same native path ----------------------------------------


def test_tensor_calls_write_and_read_as_the_batch_calls_do() -> None:
    """``write_values`` (the tensor ``batch_set``) leaves the slab's bytes, stamp and tag exactly as
    ``store_pages`` (the batch call) leaves them for the same page; ``read_page`` (the tensor ``get``)
    serves them only for the page's (handle, tag); the write hook runs after the row is invalidated
    (a read then is a miss), and a write stopped there leaves the row unreadable."""
    if not HOSTS:
        HOSTS.update(_hosts())
    host = HOSTS["asymmetric"]
    batch, batch_slab = native_pool(host, 4)
    tensor, tensor_slab = native_pool(host, 4)
    index = SglangIndex(4, "lru")
    ps, nbytes = host.page_size, batch.page_bytes
    first = 2 * ps
    key = KEYS[0]
    write_page(host, first, page_content(key, nbytes))
    index.store_pages([key], None, batch, torch.arange(first, first + ps), 1, 0)
    (_, row, handle), = index.locate([key]).tolist()
    tag = int(SglangIndex.key_tags([key])[0])
    value = torch.frombuffer(bytearray(read_page(host, first)), dtype=torch.uint8)
    seen = []
    tensor.set_write_hook(lambda: seen.append(tensor.read_page(row, handle, tag, torch.empty(nbytes, dtype=torch.uint8))))
    assert tensor.write_values([row], [handle], [tag], [value]) == 1
    assert seen == ["missing"]  # invalid while its bytes change
    tensor.set_write_hook(None)
    for name in ("data", "stamps", "tags"):
        assert torch.equal(tensor_slab[name], batch_slab[name]), name
    assert tensor.write_values([row], [handle], [tag], [value]) == 0  # held already: not written again
    out = torch.zeros(nbytes, dtype=torch.uint8)
    assert tensor.read_page(row, handle, tag, out) == "served"
    assert bytes(out.numpy()) == page_content(key, nbytes)
    assert tensor.read_page(row, handle, tag + 1, out) == "missing"  # another key's tag
    assert tensor.read_page(row, handle + 1, tag, out) == "missing"  # another handle

    def died() -> None:
        raise RuntimeError("the writer died")

    tensor.set_write_hook(died)
    with pytest.raises(InternalError, match="the writer died"):
        tensor.write_values([row], [handle + 1], [tag], [value])
    assert tensor_slab["stamps"][row] == -(handle + 1)
    assert tensor.read_page(row, handle + 1, tag, out) == "missing"
    assert tensor.read_page(row, handle, tag, out) == "missing"
    batch.close()
    tensor.close()
