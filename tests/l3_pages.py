"""Pages whose bytes name their key, for the L3 tests: a page served for the wrong key, or torn, or
shifted, is a wrong byte, and the check does not share the store's code (no CRC, no header)."""

from __future__ import annotations

import numpy as np

from cpkv.tier.l3 import L3Namespace

PAGE_BYTES = 4032  # one 4 KiB record with its 64-byte header


def namespace(page_bytes: int = PAGE_BYTES, dtype: str = "float16") -> L3Namespace:
    return L3Namespace(model="test-model", dtype=dtype, kv_layout="nhd", page_size=16, cp_size=2, tp_size=1,
                       page_bytes=page_bytes)


def page(key: int, page_bytes: int = PAGE_BYTES) -> np.ndarray:
    """``key``'s 8 little-endian bytes repeated, XOR a position ramp: distinct keys never share a page."""
    word = np.frombuffer(int(key).to_bytes(8, "little"), dtype=np.uint8)
    ramp = (np.arange(page_bytes, dtype=np.uint32) * 131 % 251).astype(np.uint8)
    return np.tile(word, -(-page_bytes // 8))[:page_bytes] ^ ramp
