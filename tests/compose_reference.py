"""Helpers shared by the compose tests: a page-by-page reference and random inputs."""

from __future__ import annotations

import numpy as np
import torch

from cpkv.compose import ComposePlan

DTYPES = {"uint8": torch.uint8, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def random_rows(gen: torch.Generator, rows: int, page_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random bytes viewed as ``dtype`` (every bit pattern, NaNs included: the compose moves bytes)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (rows, *page_shape[:-1], page_shape[-1] * itemsize), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


def tail_not_aligned(current: torch.Tensor, plan: ComposePlan, rank: int, valid_tokens: dict[int, int]) -> None:
    """Zeroes the tokens past a request's last valid one in its last current page (a partial tail)."""
    pages = plan.current_pages(rank)
    for i, page in enumerate(pages.tolist()):
        if page in valid_tokens:
            current[i, valid_tokens[page]:] = 0


def reference_dense(plan: ComposePlan, pools: list[torch.Tensor], current: list[torch.Tensor]) -> torch.Tensor:
    """The dense buffer page by page, straight from the spans (independent of plans' descriptors)."""
    cp = plan.cp_size
    first = as_bytes(pools[0][:1])
    dense = torch.zeros(plan.num_slots, *first.shape[1:], dtype=torch.uint8)
    staged = {w: {int(p): i for i, p in enumerate(plan.current_pages(w))} for w in range(cp)}
    for request in plan.requests:
        for slot, page, count in request.prefix:
            for k in range(count):
                dense[slot + k] = as_bytes(pools[(page + k) % cp][(page + k) // cp])
        for slot, page, count in request.current:
            for k in range(count):
                writer = (page + k) % cp
                dense[slot + k] = as_bytes(current[writer][staged[writer][page + k]])
    return dense


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def last_pages(plan: ComposePlan, page_size: int, rng: np.random.Generator) -> dict[int, int]:
    """Per request's last current page, a random number of valid tokens in 1..page_size."""
    out = {}
    for request in plan.requests:
        if request.current:
            out[request.current_pages[-1]] = int(rng.integers(1, page_size + 1))
    return out
