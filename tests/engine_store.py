"""One synchronous store (SGLang's ``batch_set``, ``SglangIndex.store``) spelled out as the engine
calls on an ``OffloadIndex`` it is documented to be: ``prepare_load`` of a readable prefix,
``prepare_store_fitting`` (one chunk per position), ``complete_store``, ``complete_load``,
``request_finished`` of one request. Shared by the core and SGLang suites."""

from __future__ import annotations

from typing import Any

HIT = "hit"
RESULTS = ("miss", HIT, "pending")  # what the OffloadIndex's lookup answers
STORE = "\0store"  # the request a store runs as


def store_as_engine_calls(ix: Any, keys: list[bytes], prefix: bytes | None) -> list[int]:
    """Each key's row after the store, -1 where it is not readable (``ix`` built with ``RESULTS``)."""
    anchor = prefix if prefix is not None and ix.lookup(prefix) == HIT else None
    if anchor is not None:
        ix.prepare_load([anchor], STORE, {anchor: 0})
    plan = ix.prepare_store_fitting(keys, STORE, {k: i + 1 for i, k in enumerate(keys)})
    if plan is not None:
        ix.complete_store(plan[0])
    if anchor is not None:
        ix.complete_load([anchor], STORE)
    ix.request_finished(STORE)
    return [ix.row_of(k) if ix.lookup(k) == HIT else -1 for k in keys]
