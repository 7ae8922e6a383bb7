"""``SglangIndex.store_pages``' spill over several pools sharing one index, in one process: a victim
leaves with every pool's bytes, copied in the store that evicts it, whichever pool that store
writes; a victim one pool's row does not carry is listed, not copied; bad spill lists are typed
errors that change nothing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from cpkv import DEFAULT_POLICY
from cpkv._cpkv import SglangIndex, SglangPool
from cpkv.errors import InvalidArgumentError

ROWS = 4
HOST_PAGES = 32


def _pool(name: str, page_bytes: int) -> tuple[SglangPool, torch.Tensor]:
    host = torch.zeros(HOST_PAGES * page_bytes, dtype=torch.uint8)
    entries = np.array([[0, 0, page_bytes, 1, page_bytes]], dtype=np.int64)  # page i at i * page_bytes
    data = torch.zeros(ROWS * page_bytes, dtype=torch.uint8)
    stamps, tags = torch.zeros(ROWS, dtype=torch.int64), torch.zeros(ROWS, dtype=torch.int64)
    return SglangPool(name, [host], entries, None, [], 1, HOST_PAGES, data, stamps, tags), host


def _content(key: str, pool: str, n: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(f"{key}/{pool}".encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_a_victim_leaves_with_every_pools_bytes_from_the_store_that_evicts_it() -> None:
    """As SGLang stores DSA: each request's indexer pool first, then its KV, the same keys. The
    indexer store evicts; both pools' bytes of each victim come out of that one call, exact."""
    pools = {"kv": _pool("kv", 24), "indexer": _pool("indexer", 40)}
    index = SglangIndex(ROWS, DEFAULT_POLICY)
    order = [pools["kv"][0], pools["indexer"][0]]
    victims: dict[str, dict[str, np.ndarray]] = {}
    for request in range(6):
        keys = [f"r{request}-p{i}" for i in range(2)]
        indices = torch.arange(2, dtype=torch.int64) + 2 * request
        for name in ("indexer", "kv"):
            native, host = pools[name]
            page_bytes = native.page_bytes
            for i, key in enumerate(keys):
                at = int(indices[i]) * page_bytes
                host[at:at + page_bytes] = torch.from_numpy(_content(key, name, page_bytes))
            _, _, spilled = index.store_pages(keys, None, native, indices, 1, 0, order)
            evicted, _rows, copied, pages = spilled
            if name == "kv":
                assert evicted == []  # the indexer store of the same keys already evicted
            for j, key in enumerate(evicted):
                assert copied[j]
                text = bytes(key)[:-4].decode()
                victims[text] = {n: pages[p][j] for p, n in enumerate(("kv", "indexer"))}
    assert len(victims) == 8  # 12 pages through 4 rows
    for key, got in victims.items():
        for name, page in got.items():
            assert np.array_equal(page, _content(key, name, len(page))), (key, name)


def test_a_victim_one_pool_never_held_is_listed_not_copied() -> None:
    kv, kv_host = _pool("kv", 16)
    side, _ = _pool("indexer", 8)
    index = SglangIndex(ROWS, DEFAULT_POLICY)
    kv_host[:] = 7
    index.store_pages([f"a{i}" for i in range(ROWS)], None, kv, torch.arange(ROWS, dtype=torch.int64), 1, 0, [kv])
    _, _, (evicted, _, copied, pages) = index.store_pages(
        ["b0"], None, kv, torch.arange(1, dtype=torch.int64), 1, 0, [kv, side])
    assert len(evicted) == 1 and copied == [False]  # its indexer row was never written
    assert [p.shape for p in pages] == [(1, 16), (1, 8)]


@pytest.mark.parametrize("spill", [[], "twice"])
def test_a_bad_spill_list_is_a_typed_error_and_changes_nothing(spill) -> None:
    kv, _ = _pool("kv", 16)
    index = SglangIndex(ROWS, DEFAULT_POLICY)
    index.store_pages(["x"], None, kv, torch.arange(1, dtype=torch.int64), 1, 0, None)
    before = index.digest()
    with pytest.raises(InvalidArgumentError, match="spill"):
        index.store_pages(["y"], None, kv, torch.arange(1, dtype=torch.int64), 1, 0, [kv, kv] if spill else [])
    with pytest.raises(InvalidArgumentError, match="spill"):
        index.spill_resident([kv, kv] if spill else [], 1, 0)
    assert index.digest() == before and len(index) == 1
