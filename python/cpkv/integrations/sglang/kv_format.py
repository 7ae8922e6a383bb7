"""The KV cache format an SGLang server computes in, as its L3 namespaces name it.

SGLang's host pools (and so the pools a storage backend is given) hold every FP8 format as
``torch.uint8``, the device pool's *store* dtype, and ``HiCacheStorageConfig`` carries no dtype at
all (SGLang's own storage keys have this gap: sgl-project/sglang#33268). A namespace built from the
host pool alone is therefore the same under ``--kv-cache-dtype fp8_e4m3`` and ``fp8_e5m2``, and a
restart under the other format would load the first one's bytes. The format is what the server was
told: ``--kv-cache-dtype``, which SGLang publishes in each scheduler process's runtime config
(``runtime_context.get_model().kv_cache_dtype``, the value its model runner resolves the device
pool's dtype from, ``configure_kv_cache_dtype``). ``auto`` is resolved as SGLang resolves it: the
model's dtype, which the KV host pool then stores as is, or, when the checkpoint quantizes its KV
cache to FP8 (the KV pool then stores bytes), ``fp8_e4m3``.
"""

from __future__ import annotations

from typing import Any

from cpkv.errors import InvalidArgumentError

__all__ = ["kv_cache_format", "stated_kv_cache_dtype"]

# SGLang's spellings of one format, named once (``configure_kv_cache_dtype``: "bf16" and
# "bfloat16" are both torch.bfloat16).
_ALIASES = {"bf16": "bfloat16"}


def stated_kv_cache_dtype() -> str:
    """This server's ``--kv-cache-dtype`` as SGLang published it in this process. Raises
    :class:`~cpkv.errors.InvalidArgumentError` when SGLang's runtime config is not published here
    (the backend built outside a scheduler): without it no namespace can name the KV format."""
    from sglang.srt.runtime_context import get_model

    try:
        return str(get_model().kv_cache_dtype)
    except ValueError:  # "config namespace 'model' not published"
        raise InvalidArgumentError(
            "extra config key 'cpkv_l3_dir': SGLang's runtime config (--kv-cache-dtype) is not published in this "
            "process, so the KV cache format that names the L3 pages is unknown") from None


def kv_cache_format(stated: str, kv_store_dtype: Any) -> str:
    """The format the model computes its KV in: ``stated`` (``--kv-cache-dtype``) with its aliases
    named once and ``auto`` resolved from the KV pool's store dtype (``kv_store_dtype``: the KV host
    pool's ``dtype``; a byte store under ``auto`` is the checkpoint's FP8 KV quantization)."""
    if stated != "auto":
        return _ALIASES.get(stated, stated)
    name = str(kv_store_dtype).removeprefix("torch.")
    if name == "uint8":  # SGLang's "auto" with an FP8-quantized checkpoint: float8_e4m3 (fnuz on HIP)
        return "fp8_e4m3"
    return _ALIASES.get(name, name)
