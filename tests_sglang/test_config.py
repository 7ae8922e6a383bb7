"""Construction through SGLang's own storage factory: bad extra-config keys fail with a typed error
naming the key; a wrong SGLang version is refused."""

from __future__ import annotations

import pytest
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from cpkv.errors import EngineVersionError, InvalidArgumentError, UnknownPolicyError
from cpkv.integrations.sglang._version import check_sglang_version
from cpkv.integrations.sglang.config import CpkvStorageSettings
from cpkv.runtime.timeouts import MAX_TIMEOUT_S, MIN_TIMEOUT_S

BASE = {"backend_name": "cpkv", "module_path": "cpkv.integrations.sglang", "class_name": "CpkvHiCacheStorage"}


def _config(extra: dict) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                                model_name=None, extra_config=extra)


@pytest.mark.parametrize("extra, cls, named", [
    ({}, InvalidArgumentError, "cpkv_pages"),
    ({"cpkv_pages": 0}, InvalidArgumentError, "cpkv_pages"),
    ({"cpkv_pages": True}, InvalidArgumentError, "cpkv_pages"),
    ({"cpkv_pages": 1 << 31}, InvalidArgumentError, "cpkv_pages"),
    ({"cpkv_pages": 8, "cpkv_page": 8}, InvalidArgumentError, "cpkv_page"),
    ({"cpkv_pages": 8, "cpkv_policy": "mru"}, UnknownPolicyError, "cpkv_policy"),
    ({"cpkv_pages": 8, "cpkv_layout": "striped2"}, InvalidArgumentError, "cpkv_layout"),
    # Layouts SGLang 0.5.23 cannot produce under CP.
    ({"cpkv_pages": 8, "cpkv_layout": "striped"}, InvalidArgumentError, "cpkv_layout"),
    ({"cpkv_pages": 8, "cpkv_layout": "sliced"}, InvalidArgumentError, "cpkv_layout"),
    ({"cpkv_pages": 8, "cpkv_timeout_s": float("nan")}, InvalidArgumentError, "cpkv_timeout_s"),
    # Finite and in range: these raised untyped OverflowError / DistStoreError before (issue 32).
    ({"cpkv_pages": 8, "cpkv_timeout_s": 1e15}, InvalidArgumentError, "cpkv_timeout_s"),
    ({"cpkv_pages": 8, "cpkv_timeout_s": 1e300}, InvalidArgumentError, "cpkv_timeout_s"),
    ({"cpkv_pages": 8, "cpkv_timeout_s": 1e-9}, InvalidArgumentError, "cpkv_timeout_s"),
    ({"cpkv_pages": 8, "cpkv_timeout_s": float("inf")}, InvalidArgumentError, "cpkv_timeout_s"),
    ({"cpkv_pages": 8, "cpkv_timeout_s": "30"}, InvalidArgumentError, "cpkv_timeout_s"),
    ({"cpkv_pages": 8, "cpkv_timeout_s": True}, InvalidArgumentError, "cpkv_timeout_s"),
    # Just outside the one rule of cpkv.runtime.timeouts.
    ({"cpkv_pages": 8, "cpkv_timeout_s": MAX_TIMEOUT_S * 1.001}, InvalidArgumentError, "cpkv_timeout_s"),
    ({"cpkv_pages": 8, "cpkv_timeout_s": MIN_TIMEOUT_S / 2}, InvalidArgumentError, "cpkv_timeout_s"),
    ({"cpkv_pages": 8, "cpkv_check_every": 0}, InvalidArgumentError, "cpkv_check_every"),
    ({"cpkv_pages": 8, "cpkv_ranks_per_node": -1}, InvalidArgumentError, "cpkv_ranks_per_node"),
    ({"cpkv_pages": 8, "interface_v1": 2}, InvalidArgumentError, "interface_v1"),
    # The L3 tier: both keys or neither, an existing directory, a positive int, the v1 calls.
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp"}, InvalidArgumentError, "'cpkv_l3_dir' needs 'cpkv_l3_bytes'"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_bytes": 1 << 20}, InvalidArgumentError, "'cpkv_l3_bytes' needs 'cpkv_l3_dir'"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/nonexistent-cpkv-l3", "cpkv_l3_bytes": 1 << 20},
     InvalidArgumentError, "'cpkv_l3_dir': '/nonexistent-cpkv-l3' is not an existing directory"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": 7, "cpkv_l3_bytes": 1 << 20}, InvalidArgumentError,
     "'cpkv_l3_dir': 7 is not"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": 0}, InvalidArgumentError, "'cpkv_l3_bytes' must be an int"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": "1G"},
     InvalidArgumentError, "'cpkv_l3_bytes' must be an int"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": True},
     InvalidArgumentError, "'cpkv_l3_bytes' must be an int"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": 1 << 63},
     InvalidArgumentError, "'cpkv_l3_bytes' must be an int"),
    ({"cpkv_pages": 8, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": 1 << 20}, InvalidArgumentError, "'cpkv_l3_dir' needs 'interface_v1'"),
    # The read-staging area's entries: with the L3 tier, an int within the core's limit.
    ({"cpkv_pages": 8, "cpkv_l3_staging_pages": 16}, InvalidArgumentError, "'cpkv_l3_staging_pages' needs 'cpkv_l3_dir'"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": 1 << 20, "cpkv_l3_staging_pages": 0},
     InvalidArgumentError, "'cpkv_l3_staging_pages' must be an int"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": 1 << 20,
      "cpkv_l3_staging_pages": (1 << 24) + 1}, InvalidArgumentError, "'cpkv_l3_staging_pages' must be an int"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": 1 << 20,
      "cpkv_l3_staging_pages": 4.0}, InvalidArgumentError, "'cpkv_l3_staging_pages' must be an int"),
    # The cluster tier: master and metadata both or neither, well formed, bytes >= 0, the v1 calls.
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_cluster_master": "127.0.0.1:1"}, InvalidArgumentError,
     "'cpkv_cluster_master' needs extra config key 'cpkv_cluster_metadata'"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_cluster_master": "nohost", "cpkv_cluster_metadata": "http://h/m"},
     InvalidArgumentError, "'cpkv_cluster_master' 'nohost' is not HOST:PORT"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_cluster_master": "h:1", "cpkv_cluster_metadata": "h:2"},
     InvalidArgumentError, "'cpkv_cluster_metadata' 'h:2' is not an http"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_cluster_master": "h:1", "cpkv_cluster_metadata": "http://h/m",
      "cpkv_cluster_bytes": -1}, InvalidArgumentError, "'cpkv_cluster_bytes' must be a number of bytes"),
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_cluster_bytes": 1 << 20}, InvalidArgumentError,
     "'cpkv_cluster_bytes' needs"),
    ({"cpkv_pages": 8, "cpkv_cluster_master": "h:1", "cpkv_cluster_metadata": "http://h/m"}, InvalidArgumentError,
     "'cpkv_cluster_master' needs 'interface_v1'"),
    # The config names no model (model_name None here): an L3 page could not be tied to one.
    ({"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": "/tmp", "cpkv_l3_bytes": 1 << 20},
     InvalidArgumentError, "'cpkv_l3_dir'.*model_name"),
])
def test_bad_extra_config_names_the_key(extra: dict, cls: type, named: str) -> None:
    with pytest.raises(cls, match=named):
        StorageBackendFactory.create_backend("dynamic", _config({**BASE, **extra}), None)


@pytest.mark.parametrize("seconds", [MIN_TIMEOUT_S, 0.05, 30, 100_000, MAX_TIMEOUT_S])
def test_timeout_follows_the_one_rule(seconds: float) -> None:
    """The SGLang config takes every timeout cpkv.runtime.timeouts.checked_timeout_s takes (its own
    range, 0.1 to 86400, refused the ends)."""
    settings = CpkvStorageSettings.from_extra_config({"cpkv_pages": 8, "cpkv_timeout_s": seconds})
    assert settings.timeout_s == float(seconds)


def test_l3_settings_are_read(tmp_path) -> None:
    settings = CpkvStorageSettings.from_extra_config(
        {"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": str(tmp_path), "cpkv_l3_bytes": 1 << 20})
    assert (settings.l3_dir, settings.l3_bytes) == (str(tmp_path), 1 << 20)
    assert settings.l3_staging_pages is None  # the default area (cpkv.tier.l3.staging.default_entries)
    assert CpkvStorageSettings.from_extra_config(
        {"cpkv_pages": 8, "interface_v1": 1, "cpkv_l3_dir": str(tmp_path), "cpkv_l3_bytes": 1 << 20,
         "cpkv_l3_staging_pages": 12}).l3_staging_pages == 12
    assert CpkvStorageSettings.from_extra_config({"cpkv_pages": 8}).l3_dir is None


def test_version_check() -> None:
    assert check_sglang_version() == "0.5.23"
    with pytest.raises(EngineVersionError, match="0.5.23"):
        check_sglang_version("0.5.22")
