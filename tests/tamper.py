"""A replay rank whose reads from a lower tier hand back one wrong byte per page, after the tier's
record check: the replay's own byte check must see every one."""

from __future__ import annotations

from typing import Any


def replay_with_tampered_reads(tier_class: Any, rank: int, world: int, options: Any, requests: list) -> dict:
    """``replay_rank`` with ``tier_class.read`` (the L3 or cluster tier's) flipping a bit of every page."""
    from cpkv.replay import rank as replay_rank_module

    read = tier_class.read

    def tampered(self, found, device_pages):
        positions, pages = read(self, found, device_pages)
        pages[:, 3] ^= 0x01
        return positions, pages

    tier_class.read = tampered
    return replay_rank_module.replay_rank(rank, world, options, requests)
