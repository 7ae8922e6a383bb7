"""The KV a replay page holds: a pure function of (block id, layer, payload), so the expected bytes
of every page are known (:class:`~cpkv.replay.device.ExpectedRows` builds them on the device from
this function's constant terms)."""

from __future__ import annotations

import numpy as np

from cpkv.replay.options import KV_ROW_MIN_BYTES


def kv_rows(block_ids: np.ndarray, layer: int, payload: int, row_bytes: int) -> np.ndarray:
    """The expected bytes of pages holding ``block_ids``: ``[len(block_ids), row_bytes]`` uint8.

    A row spells out what it stands for: block id (8 bytes), layer and payload index (4 each),
    little-endian, repeated over the row and XORed with a fixed ramp (so a shifted or truncated copy
    differs too). XOR with a constant is a bijection, so two distinct (block, layer, payload) never
    share a row; nothing is multiplied or reduced, so this check cannot wrap the way the token
    mapping it verifies might (rows need at least :data:`KV_ROW_MIN_BYTES`).
    """
    if row_bytes < KV_ROW_MIN_BYTES:
        raise ValueError(f"a verified row needs at least {KV_ROW_MIN_BYTES} bytes, got {row_bytes}")
    ids = np.asarray(block_ids)
    if ids.size and (ids.dtype.kind not in "iu" or int(ids.min()) < 0):
        raise ValueError("block ids must be non-negative integers")
    header = np.empty((len(ids), KV_ROW_MIN_BYTES), dtype=np.uint8)
    header[:, :8] = ids.astype("<u8").reshape(-1, 1).view(np.uint8)
    header[:, 8:] = np.array([layer, payload], dtype="<u4").view(np.uint8)
    reps = -(-row_bytes // KV_ROW_MIN_BYTES)
    ramp = (np.arange(row_bytes, dtype=np.uint32) * 131 % 251).astype(np.uint8)
    return np.tile(header, (1, reps))[:, :row_bytes] ^ ramp[None, :]
