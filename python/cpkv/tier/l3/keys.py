"""The one 64-bit BLAKE2b rule for what outlives a process or crosses ranks: an L3 key from an
engine's key bytes, and one digest of several 64-bit digests. Each engine says which bytes make its
key and which ``person`` (BLAKE2b's personalization) keeps its keys apart from other uses; the
main job's page keys are made in Rust (``crates/tier``'s ``page_keys``) from token paths."""

from __future__ import annotations

import hashlib


def hash64(data: bytes, person: bytes = b"") -> int:
    """64 bits of BLAKE2b of ``data`` (little-endian), personalized by ``person``."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=person).digest(), "little")


def combined_digest(*digests: int, person: bytes = b"") -> int:
    """One 64-bit digest of several, in order: what ranks compare to agree on several indexes."""
    return hash64(b"".join(int(d).to_bytes(8, "little") for d in digests), person)
