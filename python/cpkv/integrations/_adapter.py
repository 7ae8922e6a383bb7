"""What every engine adapter reads alike from its engine's extra-config mapping: the ``cpkv_`` keys
(every other key is the engine's), checked once at construction, each bad value a typed error
naming the key (as the engine spells its place) and the value.

An engine folder keeps only its protocol: it names its keys and their help, says how its engine
spells a key's place (``label``), and reads each setting through :class:`CpkvKeys`.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping

from cpkv._cpkv import DEFAULT_POLICY
from cpkv.errors import InvalidArgumentError, UnknownPolicyError
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, checked_timeout_s
from cpkv.tier.l3.directory import check_l3_pair

PREFIX = "cpkv_"
POLICY_KEY = "cpkv_policy"
TIMEOUT_KEY = "cpkv_timeout_s"
L3_DIR_KEY = "cpkv_l3_dir"
L3_BYTES_KEY = "cpkv_l3_bytes"
CLUSTER_MASTER_KEY = "cpkv_cluster_master"
CLUSTER_METADATA_KEY = "cpkv_cluster_metadata"
CLUSTER_BYTES_KEY = "cpkv_cluster_bytes"
CLUSTER_KEYS = {
    CLUSTER_MASTER_KEY: ("HOST:PORT of the Mooncake master of the cluster tier below L3 (or below the host tier when "
                         "L3 is off), shared by every instance (with cpkv_cluster_metadata; e.g. `cpkv cluster serve`)"),
    CLUSTER_METADATA_KEY: "the Mooncake master's HTTP metadata URL (with cpkv_cluster_master)",
    CLUSTER_BYTES_KEY: ("bytes of memory this instance's clients lend the Mooncake store, int >= 0 (default 0: the "
                        "store servers hold every page; with cpkv_cluster_master)"),
}


class CpkvKeys:
    """``extra``'s ``cpkv_`` keys, refused when one is not in ``known``; ``label(key)`` is how the
    engine names a key's place in its errors (``kv_connector_extra_config['cpkv_policy']``)."""

    def __init__(self, extra: Mapping[str, Any], known: Collection[str], label: Callable[[str], str]) -> None:
        self.extra = extra
        self.label = label
        unknown = sorted(k for k in extra if isinstance(k, str) and k.startswith(PREFIX) and k not in known)
        if unknown:
            raise InvalidArgumentError(f"{label(unknown[0])} is not a cpkv setting (known: {', '.join(known)})")

    def int_in(self, key: str, minimum: int, maximum: int, default: int | None = None) -> int:
        """``key`` as an int in ``[minimum, maximum]`` (never a bool or a float); ``default`` when
        absent (required when there is none)."""
        if key not in self.extra:
            if default is None:
                raise InvalidArgumentError(f"{self.label(key)} is required")
            return default
        value = self.extra[key]
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise InvalidArgumentError(f"{self.label(key)} must be an int in [{minimum}, {maximum}], got {value!r}")
        return value

    def policy(self) -> str:
        """``cpkv_policy``: one of ``PrefixTree.POLICIES`` (default ``cpkv.DEFAULT_POLICY``)."""
        from cpkv import PrefixTree

        value = self.extra.get(POLICY_KEY, DEFAULT_POLICY)
        if not isinstance(value, str) or value not in PrefixTree.POLICIES:
            raise UnknownPolicyError(f"{self.label(POLICY_KEY)}: unknown eviction policy {value!r} "
                                     f"(known: {', '.join(PrefixTree.POLICIES)})")
        return value

    def timeout_s(self) -> float:
        """``cpkv_timeout_s``: by the one rule of :mod:`cpkv.runtime.timeouts`, its default."""
        return checked_timeout_s(self.extra.get(TIMEOUT_KEY, DEFAULT_TIMEOUT_S), self.label(TIMEOUT_KEY))

    def cluster(self) -> tuple[str | None, str | None, int]:
        """``cpkv_cluster_master``, ``cpkv_cluster_metadata`` (both or neither) and ``cpkv_cluster_bytes``
        (only with them; default 0), by the cluster tier's one rule
        (:func:`cpkv.tier.cluster.tier.check_cluster_options`); (None, None, 0) when none."""
        from cpkv.tier.cluster.tier import check_cluster_options

        master, metadata = self.extra.get(CLUSTER_MASTER_KEY), self.extra.get(CLUSTER_METADATA_KEY)
        cap = self.extra.get(CLUSTER_BYTES_KEY)
        option_key = {"--cluster-master": CLUSTER_MASTER_KEY, "--cluster-metadata": CLUSTER_METADATA_KEY,
                      "--cluster-bytes": CLUSTER_BYTES_KEY}
        check_cluster_options(master, metadata, cap, name=lambda option: self.label(option_key[option]))
        return master, metadata, int(cap or 0)

    def l3(self) -> tuple[str | None, int | None]:
        """``cpkv_l3_dir`` and ``cpkv_l3_bytes`` by the one L3 setting rule
        (:func:`cpkv.tier.l3.directory.check_l3_pair`); (None, None) when neither."""
        return check_l3_pair(self.extra.get(L3_DIR_KEY), self.extra.get(L3_BYTES_KEY), L3_DIR_KEY, L3_BYTES_KEY,
                             self.label, repr)
