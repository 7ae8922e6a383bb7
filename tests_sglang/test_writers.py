"""The one change the backend makes to an SGLang object (cpkv.integrations.sglang.writers): it
relies on SGLang 0.5.23's writer rule and on the controller reading it per backup. These fail when
SGLang's field or rule changes."""

from __future__ import annotations

import inspect

import pytest
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

from cpkv.integrations.sglang.writers import make_every_rank_a_writer


def _config(tp_rank: int, mla: bool) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=8, pp_rank=0, pp_size=1, attn_cp_rank=tp_rank,
                                attn_cp_size=8, is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=False, model_name=None, extra_config={})


@pytest.mark.parametrize("tp_rank", range(8))
def test_sglang_elects_one_mla_writer_and_the_backend_makes_every_rank_one(tp_rank: int) -> None:
    # SGLang's rule, as the backend found it: for MLA only tp_rank == dcp_rank (0) writes.
    assert _config(tp_rank, mla=True).is_storage_writer is (tp_rank == 0)
    assert _config(tp_rank, mla=False).is_storage_writer is True
    config = _config(tp_rank, mla=True)
    assert make_every_rank_a_writer(config) is True  # the pages are rank-replicated
    assert config.is_storage_writer is True
    gqa = _config(tp_rank, mla=False)
    assert make_every_rank_a_writer(gqa) is False and gqa.is_storage_writer is True


def test_the_controller_reads_the_rule_from_its_config_on_every_backup() -> None:
    # backup_skip is a property over storage_config.is_storage_writer (not a value cached at attach),
    # and the dynamic factory hands the backend that same config object.
    assert isinstance(inspect.getattr_static(HiCacheController, "backup_skip"), property)
    assert "self.storage_config.is_storage_writer" in inspect.getsource(HiCacheController.backup_skip.fget)
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    assert "backend_class(storage_config, kwargs)" in inspect.getsource(StorageBackendFactory._create_dynamic_backend)
