"""Compose groups: one interface (:class:`ComposeGroup`), three transports."""

from cpkv.compose.groups.base import ComposeGroup, GroupStats
from cpkv.compose.groups.cuda import CudaIpcGroup
from cpkv.compose.groups.local import LocalGroup
from cpkv.compose.groups.shm import ShmGroup

__all__ = ["ComposeGroup", "GroupStats", "LocalGroup", "ShmGroup", "CudaIpcGroup"]
