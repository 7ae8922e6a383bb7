"""The one timeout rule and the one host-memory limit of cpkv.runtime: a timeout that is not a finite
number of seconds in range (the host slab's included), or a buffer larger than the machine, is a
typed error naming it, raised before anything is allocated or waited on."""

from __future__ import annotations

import datetime

import pytest
import torch

from cpkv.errors import InvalidArgumentError
from cpkv.runtime.memory import check_host_bytes, physical_memory_bytes
from cpkv.runtime.timeouts import MAX_TIMEOUT_S, MIN_TIMEOUT_S, as_timedelta, checked_timeout_s
from cpkv.tier.slab import HostSlab, SlabSpec


@pytest.mark.parametrize("value", [MIN_TIMEOUT_S, 1, 30.0, MAX_TIMEOUT_S])
def test_a_timeout_in_range_is_accepted(value):
    assert checked_timeout_s(value) == float(value)
    assert as_timedelta(value) == datetime.timedelta(seconds=value)


@pytest.mark.parametrize("value", [1e15, 1e300, 1e-9, 0, -1.0, float("nan"), float("inf"), True, "30", None,
                                   MAX_TIMEOUT_S * 2])
def test_a_timeout_out_of_range_is_refused_naming_it(value):
    with pytest.raises(InvalidArgumentError, match="my_timeout"):
        checked_timeout_s(value, "my_timeout")
    with pytest.raises(InvalidArgumentError, match="my_timeout"):
        as_timedelta(value, "my_timeout")


@pytest.mark.parametrize("value", [1e15, 1e300, 1e-9])
def test_the_host_slab_refuses_a_bad_timeout(value):
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        HostSlab.create({"kv": SlabSpec((8,), torch.uint8)}, num_pages=2, num_layers=1, timeout_s=value)


def test_more_than_the_machine_holds_is_refused_naming_what_asked():
    limit = physical_memory_bytes()
    assert limit > 0
    check_host_bytes(limit, "fits")
    with pytest.raises(InvalidArgumentError, match="my buffer: .* more than this machine"):
        check_host_bytes(limit + 1, "my buffer")
