"""The one place the backend changes an SGLang object: every rank of an MLA model stores.

SGLang 0.5.23 elects storage writers in ``HiCacheStorageConfig.is_storage_writer`` (``not
is_mla_model or tp_rank == dcp_rank``); the cache controller's ``backup_skip`` is ``not
storage_config.is_storage_writer``, read on every backup, so for an MLA model (DeepSeek-V3.2,
GLM-5) only TP rank 0 calls ``batch_set_v1``/``batch_set_v2`` and the others make no storage call.
cpkv's placement is a replicated index fed by the store calls, so every rank of a store group must
see every store (the design choice is in the README: "SGLang: MLA and DSA under attention CP").

The dynamic backend factory hands the backend the controller's own config object, so the backend,
while SGLang constructs it (before any backup runs, on every rank), sets that object's
``is_mla_model`` to False: SGLang's rule then elects every rank, as it does for GQA/MHA, and the
backend remembers that the pages are rank-replicated (it groups the ranks by that, see
:mod:`.topology`). ``tests_sglang/test_writers.py`` fails when SGLang's field or rule changes.
"""

from __future__ import annotations

from typing import Any

from cpkv.errors import InvalidArgumentError

__all__ = ["make_every_rank_a_writer"]


def make_every_rank_a_writer(storage_config: Any) -> bool:
    """Makes ``storage_config.is_storage_writer`` true on this rank; returns whether the model's
    pages are rank-replicated (SGLang's ``is_mla_model`` as it came)."""
    rank_replicated = bool(storage_config.is_mla_model)
    if rank_replicated:
        storage_config.is_mla_model = False
    if not storage_config.is_storage_writer:
        raise InvalidArgumentError(
            "cpkv sglang backend: SGLang's HiCacheStorageConfig.is_storage_writer is false on tp_rank "
            f"{storage_config.tp_rank} even with is_mla_model=False; this SGLang elects storage writers by "
            "another rule than 0.5.23's")
    return rank_replicated
