"""HostSlab: one node's shared host (L2) memory, one region per payload.

The host tier's bytes wherever cpkv keeps a host tier: :class:`~cpkv.tier.CacheController` (the
main job, ``cpkv replay``), the vLLM backend's workers (one slab over vLLM's gloo group) and the
SGLang backend (one slab per host pool and node). Each payload's region is
``[num_layers, num_pages, row_bytes]`` uint8, layer-major, so that one layer's copy of a run of
pages is one contiguous range. Every rank of the process group maps every region. Which row holds
what is decided elsewhere, by the Rust core every rank drives with the same calls (``TierCache`` for
the controller, ``OffloadIndex`` for the engines), so this module only owns bytes, processes and
time: it never decides placement.

:meth:`HostSlab.create` is collective, in four steps:

1. every rank checks its arguments and the ranks compare them (one ``all_gather_object``), so a bad
   or mismatched argument raises the same typed error on every rank before anything is allocated;
   the names this run may create are agreed here too;
2. the creator of each region (payload ``i``: rank ``i % world``) reserves all of it up front with
   ``posix_fallocate``: 2 MiB huge pages in an anonymous memfd when enough are free, else a file in
   /dev/shm. Running out of room fails here, with an error naming payload, bytes and path, instead
   of a SIGBUS at first touch hours later. The creators' outcomes are exchanged: every rank raises
   the same error, and nothing is left behind;
3. every rank maps every region (and pins it for CUDA when asked to, or by default when this process
   already uses CUDA); the outcomes are
   exchanged again, which also tells every creator that every rank now holds its mapping;
4. the creators drop the names: the /dev/shm file is unlinked (a memfd never had one) and the
   creator's descriptor closed; a last barrier (bounded by ``timeout_s``) makes that true on every
   rank by the time ``create`` returns on any.

Once ``create`` has returned, no exit of any kind (exception, SIGTERM, SIGKILL of any process) can
leave a name in /dev/shm: the memory lives exactly as long as the last mapping. Before that, every
error path on every rank unlinks every name of the run (so the survivors clean up after a creator
killed mid-create), and a normal exit unlinks what this process created through the exit hooks of
:mod:`cpkv.runtime.shm`.
"""

from __future__ import annotations

import logging
import math
import mmap
import operator
import os
import secrets
import socket
import sys
import weakref
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from cpkv.errors import CpkvError, FallbackError, InvalidArgumentError, UnknownPayloadError
from cpkv.runtime.shm import SHM_DIR, create_owned, shm_room, unlink_now
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, as_timedelta, checked_timeout_s, guarded

__all__ = ["HostSlab", "SlabSpec"]

log = logging.getLogger("cpkv.tier")

HUGE_PAGE_BYTES = 2 << 20
NAME_PREFIX = "cpkv-slab-"

# Dtypes a page may hold: every one has a fixed element size and a uint8 view both ways.
_DTYPE_NAMES = (
    "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
)

# Test hooks (module globals so a test can replace them inside a rank process):
# _fallocate reserves the space; _memfd_choice decides between a memfd and /dev/shm.
_fallocate: Callable[[int, int, int], None] = os.posix_fallocate

_logged_kinds: set[str] = set()  # kinds already announced by this process (logged once each)


# -- what a payload's page looks like --------------------------------------------------------------


@dataclass(frozen=True)
class SlabSpec:
    """One payload's page: its shape and dtype (K or V, an index page, a scale page...).

    Checked on construction, so a bad spec fails where it is written, naming the bad value.
    """

    page_shape: tuple[int, ...]
    dtype: Any  # a torch.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "page_shape", _page_shape(self.page_shape))
        _check_dtype(self.dtype)

    @property
    def element_size(self) -> int:
        import torch

        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def row_bytes(self) -> int:
        """Bytes of one page of one layer."""
        return math.prod(self.page_shape) * self.element_size


def _page_shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"page_shape must be a sequence of positive ints, got {value!r}")
    dims = []
    for dim in value:
        if isinstance(dim, bool):
            raise InvalidArgumentError(f"page_shape {value!r}: dimension {dim!r} is not an int")
        try:
            dim = operator.index(dim)
        except TypeError:
            raise InvalidArgumentError(f"page_shape {value!r}: dimension {dim!r} is not an int") from None
        if dim < 1:
            raise InvalidArgumentError(f"page_shape {value!r}: dimension {dim} must be >= 1")
        dims.append(dim)
    if not dims:
        raise InvalidArgumentError("page_shape must have at least one dimension, got ()")
    return tuple(dims)


def _check_dtype(dtype: Any) -> None:
    import torch

    supported = [getattr(torch, name) for name in _DTYPE_NAMES if hasattr(torch, name)]
    if not isinstance(dtype, torch.dtype) or dtype not in supported:
        names = ", ".join(str(d).removeprefix("torch.") for d in supported)
        raise InvalidArgumentError(f"dtype {dtype!r} is not supported for slab pages (supported: {names})")


# -- the process group as create() uses it ---------------------------------------------------------


class _Ranks:
    """Rank, world and the few collectives of ``create``; world 1 without torch.distributed."""

    def __init__(self, process_group: Any) -> None:
        import torch.distributed as dist

        self._pg = process_group
        if not (dist.is_available() and dist.is_initialized()):
            if process_group is not None:
                raise InvalidArgumentError("a process_group was given but torch.distributed is not initialised")
            self._dist: Any = None
            self.rank, self.world = 0, 1
            return
        backend = str(dist.get_backend(process_group))
        if "gloo" not in backend:
            raise InvalidArgumentError(
                f"HostSlab needs a gloo (CPU) process group, got backend {backend!r}: "
                "pass process_group=torch.distributed.new_group(backend='gloo')")
        self._dist = dist
        self.rank = dist.get_rank(process_group)
        if self.rank < 0:
            raise InvalidArgumentError("this process is not a member of process_group")
        self.world = dist.get_world_size(process_group)

    def barrier(self, what: str, timeout_s: float) -> None:
        if self._dist is not None:
            guarded(what, self.rank, -1, timeout_s,
                    lambda: self._dist.monitored_barrier(group=self._pg, timeout=as_timedelta(timeout_s)))

    def all_gather(self, what: str, timeout_s: float, value: Any) -> list[Any]:
        if self._dist is None:
            return [value]
        heard: list[Any] = [None] * self.world
        guarded(what, self.rank, -1, timeout_s, lambda: self._dist.all_gather_object(heard, value, group=self._pg))
        return heard


def check_one_machine(process_group: Any, what: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Raises :class:`~cpkv.errors.InvalidArgumentError` naming ``what`` on every rank alike when the
    ranks of ``process_group`` (a gloo group; None or no torch.distributed: this process alone) run on
    more than one machine: for what only works within one node. Collective, bounded by ``timeout_s``."""
    ranks = _Ranks(process_group)
    machines = ranks.all_gather(f"{what}: one machine check", timeout_s, _node_id())
    if len(set(machines)) != 1:
        hosts = sorted(set(machines))
        raise InvalidArgumentError(f"{what} needs every rank on one machine; the {ranks.world} ranks run on "
                                   f"{len(hosts)} machines (boot ids {hosts})")


_ERROR_CLASSES: dict[str, type[CpkvError]] = {
    cls.__name__: cls for cls in (InvalidArgumentError, UnknownPayloadError, FallbackError)
}

def _problem(err: CpkvError) -> tuple[str, str]:
    """A problem travels between ranks as (error class name, message): picklable, raised alike everywhere."""
    return type(err).__name__, str(err)


def _raise_agreed(problems: list[Any], what: str) -> None:
    """Raises on every rank alike when any rank reported a problem (every rank sees the same list)."""
    failed = [(rank, p) for rank, p in enumerate(problems) if p is not None]
    if not failed:
        return
    cls = _ERROR_CLASSES.get(failed[0][1][0], InvalidArgumentError)
    raise cls(f"{what}: " + "; ".join(f"rank {rank}: {message}" for rank, (_, message) in failed))


# -- arguments -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    payloads: tuple[tuple[str, SlabSpec], ...]
    num_pages: int
    num_layers: int

    def region_bytes(self, spec: SlabSpec) -> int:
        return self.num_layers * self.num_pages * spec.row_bytes

    @property
    def key(self) -> tuple:
        """What must be equal on every rank (picklable, compared across ranks)."""
        return (
            tuple((name, spec.page_shape, str(spec.dtype)) for name, spec in self.payloads),
            self.num_pages,
            self.num_layers,
        )


def _count(what: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what} must be an int >= 1, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be an int >= 1, got {value!r}") from None
    if value < 1:
        raise InvalidArgumentError(f"{what} must be >= 1, got {value}")
    return value


def _check_arguments(payloads: Any, num_pages: Any, num_layers: Any, timeout_s: Any) -> _Request:
    if not isinstance(payloads, Mapping) or not payloads:
        raise InvalidArgumentError(f"payloads must be a non-empty mapping of name to SlabSpec, got {payloads!r}")
    checked = []
    for name, spec in payloads.items():
        if not isinstance(name, str) or not name:
            raise UnknownPayloadError(f"payload names must be non-empty strings, got {name!r}")
        if not isinstance(spec, SlabSpec):
            raise InvalidArgumentError(f"payload {name!r}: expected a SlabSpec, got {spec!r}")
        checked.append((name, spec))
    checked_timeout_s(timeout_s, "timeout_s")
    request = _Request(tuple(checked), _count("num_pages", num_pages), _count("num_layers", num_layers))
    for name, spec in request.payloads:
        if request.region_bytes(spec) > sys.maxsize:
            raise InvalidArgumentError(
                f"payload {name!r}: {request.num_layers} layers x {request.num_pages} pages x "
                f"{spec.row_bytes} bytes does not fit in an address space")
    return request


def _check_pin(pin: Any) -> bool:
    """``None``: pin when this process already uses CUDA (a context exists); ``True`` demands it.

    "CUDA is available" is not enough: a CPU-only user on a GPU machine would lock the whole slab
    in memory and start a CUDA context on GPU 0 for nothing.
    """
    if pin is not None and not isinstance(pin, bool):
        raise InvalidArgumentError(f"pin must be True, False or None, got {pin!r}")
    import torch

    if pin and not torch.cuda.is_available():
        raise InvalidArgumentError("pin=True but CUDA is not available")
    if pin is None:
        return torch.cuda.is_available() and torch.cuda.is_initialized()
    return pin


def _valid_timeout(timeout_s: Any) -> bool:
    try:
        checked_timeout_s(timeout_s)
    except InvalidArgumentError:
        return False
    return True


def _node_id() -> str:
    """The same on every process of one machine (one kernel), different across machines."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


# -- reserving a region (the creator) --------------------------------------------------------------


@dataclass(frozen=True)
class _Where:
    """How every rank opens a region: a /dev/shm path, or the creator's /proc/<pid>/fd/<fd>."""

    kind: str  # "hugetlb" | "shm" ("memfd": a plain memfd, only through the test hook)
    path: str
    map_bytes: int


@dataclass
class _Reservation:
    """A region this rank created: its descriptor, open until every rank has mapped the region."""

    fd: int
    where: _Where
    shm_path: str | None  # the name to unlink, None for a memfd

    def drop_name(self) -> None:
        if self.shm_path is not None:
            unlink_now(self.shm_path)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def _free_huge_page_bytes() -> int:
    """Bytes of free, unreserved 2 MiB huge pages (sysfs; /proc/meminfo when 2 MiB is the default size)."""
    base = "/sys/kernel/mm/hugepages/hugepages-2048kB"
    try:
        with open(f"{base}/free_hugepages") as f:
            free = int(f.read())
        with open(f"{base}/resv_hugepages") as f:
            reserved = int(f.read())
        return max(0, free - reserved) * HUGE_PAGE_BYTES
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/meminfo") as f:
            info = {k.strip(): v.split() for k, v in (line.split(":", 1) for line in f if ":" in line)}
        if info.get("Hugepagesize") != ["2048", "kB"]:
            return 0
        return max(0, int(info["HugePages_Free"][0]) - int(info["HugePages_Rsvd"][0])) * HUGE_PAGE_BYTES
    except (OSError, KeyError, ValueError, IndexError):
        return 0


def _memfd_choice(data_bytes: int) -> tuple[int, str, int] | None:
    """(memfd flags, kind, alignment) for a region of ``data_bytes``, or None to use /dev/shm.

    2 MiB huge pages when enough are free for this region (the creator reserves them at once, so a
    race with another creator shows up as a failed fallocate, and then /dev/shm is used).
    """
    if not (hasattr(os, "memfd_create") and hasattr(os, "MFD_HUGETLB") and hasattr(os, "MFD_HUGE_2MB")):
        return None
    if _free_huge_page_bytes() < _round_up(data_bytes, HUGE_PAGE_BYTES):
        return None
    return os.MFD_HUGETLB | os.MFD_HUGE_2MB, "hugetlb", HUGE_PAGE_BYTES


def _reserve(file_name: str, payload: str, data_bytes: int) -> _Reservation:
    """Creates one region and reserves all of its memory now; raises InvalidArgumentError, leaving nothing."""
    choice = _memfd_choice(data_bytes)
    if choice is not None:
        flags, kind, align = choice
        map_bytes = _round_up(data_bytes, align)
        fd = -1
        try:
            fd = os.memfd_create(file_name, os.MFD_CLOEXEC | flags)
            _fallocate(fd, 0, map_bytes)
            return _Reservation(fd, _Where(kind, f"/proc/{os.getpid()}/fd/{fd}", map_bytes), None)
        except (OSError, OverflowError) as err:
            if fd >= 0:
                os.close(fd)  # a memfd has no name: closing it frees everything
            log.info("payload %r: no %s region of %d bytes (%s); using %s", payload, kind, map_bytes, err, SHM_DIR)
    map_bytes = _round_up(data_bytes, mmap.PAGESIZE)
    path = os.path.join(SHM_DIR, file_name)
    try:
        fd = create_owned(path)
    except OSError as err:
        raise InvalidArgumentError(f"payload {payload!r}: cannot create {path}: {err.strerror or err}") from err
    try:
        _fallocate(fd, 0, map_bytes)
    except (OSError, OverflowError) as err:
        os.close(fd)
        unlink_now(path)
        reason = getattr(err, "strerror", None) or str(err)
        raise InvalidArgumentError(
            f"payload {payload!r}: cannot reserve {map_bytes} bytes at {path}: {reason} ({shm_room('use fewer pages')})"
        ) from err
    return _Reservation(fd, _Where("shm", path, map_bytes), path)


# -- mapping a region (every rank) -----------------------------------------------------------------


@dataclass
class _Region:
    """One payload's mapping on this rank; the tensors keep the mapping alive while they exist."""

    payload: str
    spec: SlabSpec
    kind: str
    map_bytes: int
    mapping: Any  # mmap.mmap
    rows: Any  # uint8 [num_layers, num_pages, row_bytes]
    view: Any  # dtype [num_layers, num_pages, *page_shape]
    pinned_ptr: int | None = None

    def release(self) -> None:
        """Unpins and drops this object's references; the memory goes with the last tensor over it.

        The mapping is never closed explicitly: ``torch.frombuffer`` does not lock the buffer, so
        closing it under a tensor a caller still holds would turn that tensor into a dangling pointer.
        """
        _unpin(self)
        self.rows = self.view = self.mapping = None


def _open_region(payload: str, where: _Where) -> int:
    try:
        return os.open(where.path, os.O_RDWR)
    except OSError as err:
        hint = (" (every rank must run on the creator's machine as the same user and see its /proc)"
                if where.path.startswith("/proc/") else
                f" (every rank must run on one machine and share {SHM_DIR})")
        raise InvalidArgumentError(f"payload {payload!r}: cannot open {where.path}: {err.strerror or err}{hint}") from err


def _map(payload: str, spec: SlabSpec, request: _Request, where: _Where, own: _Reservation | None) -> _Region:
    import torch

    fd = own.fd if own is not None else _open_region(payload, where)
    try:
        size = os.fstat(fd).st_size
        if size != where.map_bytes:
            raise InvalidArgumentError(f"payload {payload!r}: {where.path} has {size} bytes, expected {where.map_bytes}")
        mapping = mmap.mmap(fd, where.map_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except CpkvError:
        raise
    except (OSError, ValueError) as err:
        raise InvalidArgumentError(f"payload {payload!r}: cannot map {where.map_bytes} bytes of {where.path}: {err}") from err
    finally:
        if own is None:
            os.close(fd)
    rows = torch.frombuffer(mapping, dtype=torch.uint8, count=request.region_bytes(spec))
    rows = rows.view(request.num_layers, request.num_pages, spec.row_bytes)
    view = rows.view(spec.dtype).view(request.num_layers, request.num_pages, *spec.page_shape)
    return _Region(payload, spec, where.kind, where.map_bytes, mapping, rows, view)


_CUDA_HOST_REGISTER_PORTABLE = 1  # pinned for every CUDA context of the process, not only the current device's


def _pin(region: _Region) -> None:
    """Registers the mapping with CUDA as pinned, so device copies from and to it run at full speed
    (and asynchronously); unpinned, every copy would be staged through a bounce buffer."""
    import torch

    ptr = region.rows.data_ptr()
    try:
        cudart = torch.cuda.cudart()
        code = int(cudart.cudaHostRegister(ptr, region.map_bytes, _CUDA_HOST_REGISTER_PORTABLE))
        reason = "" if code == 0 else f"{cudart.cudaGetErrorString(cudart.cudaError(code))} ({code})"
    except Exception as err:  # noqa: BLE001 -- e.g. CUDA cannot start in a forked child: same outcome
        code, reason = -1, f"{type(err).__name__}: {err}"
    if code != 0:
        raise FallbackError(
            f"payload {region.payload!r}: cudaHostRegister of {region.map_bytes} bytes failed: {reason}; "
            "raise the locked-memory limit (ulimit -l) or create the slab with pin=False")
    region.pinned_ptr = ptr


def _unpin(region: _Region) -> None:
    if region.pinned_ptr is None:
        return
    ptr, region.pinned_ptr = region.pinned_ptr, None
    try:
        import torch

        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:  # noqa: BLE001 -- at interpreter exit CUDA may already be gone; the process frees it
        pass


def _release_all(regions: list[_Region]) -> None:
    for region in regions:
        region.release()
    regions.clear()


def _announce(kinds: list[str]) -> None:
    """Logs once per process which kind of memory the slabs got (huge pages matter for copy speed)."""
    for kind in dict.fromkeys(kinds):
        if kind in _logged_kinds:
            continue
        _logged_kinds.add(kind)
        if kind == "hugetlb":
            log.info("cpkv host slab: 2 MiB huge pages (memfd)")
        elif kind == "shm":
            log.info("cpkv host slab: POSIX shared memory in %s (not enough free 2 MiB huge pages)", SHM_DIR)
        else:
            log.info("cpkv host slab: %s", kind)


# -- the slab --------------------------------------------------------------------------------------


class HostSlab:
    """The node's shared host region, one ``[num_layers, num_pages, row_bytes]`` region per payload.

    Made by :meth:`create` (collective); every rank of the group maps every region, so a page
    written by one rank is read by all without a copy. Which rank writes which page, and when, is
    the caller's business (separate writes from peers' reads with a barrier).
    """

    def __init__(self, request: _Request, regions: list[_Region], *, rank: int, world_size: int, run_id: str,
                 pinned: bool) -> None:
        """Internal: use :meth:`create`."""
        self._payloads = MappingProxyType(dict(request.payloads))
        self._regions = {region.payload: region for region in regions}
        self._num_pages = request.num_pages
        self._num_layers = request.num_layers
        self._nbytes = sum(request.region_bytes(spec) for spec in self._payloads.values())
        self._kinds = MappingProxyType({region.payload: region.kind for region in regions})
        self._rank, self._world_size, self._run_id, self._pinned = rank, world_size, run_id, pinned
        self._closed = False
        self._finalizer = weakref.finalize(self, _release_all, list(regions))

    @classmethod
    def create(
        cls,
        payloads: Mapping[str, SlabSpec],
        *,
        num_pages: int,
        num_layers: int,
        process_group: Any = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        pin: bool | None = None,
    ) -> HostSlab:
        """Creates and maps the slab on every rank of ``process_group`` (a gloo group; every rank
        calls this with the same arguments). Without torch.distributed initialised, a slab for this
        process alone.

        ``timeout_s`` bounds the wait for every rank to arrive; the exchanges after that wait on
        reserving and pinning (seconds for hundreds of GB) and run under the group's own timeout.
        ``pin``: register the regions with CUDA as pinned memory, so device copies to and from them are
        asynchronous and at full speed (default: when this process already uses CUDA; pass ``True``
        for device pools, ``False`` for CPU ones); registered in the current device's context, and
        portable to the others. A failed registration is a :class:`~cpkv.errors.FallbackError`, never
        a silent slow path.

        Raises the same typed error on every rank when any rank's arguments are bad, the ranks'
        arguments differ, a region cannot be reserved (its payload, bytes and path named) or mapped;
        :class:`~cpkv.errors.CollectiveTimeoutError` when a rank does not come or dies on the way.
        """
        ranks = _Ranks(process_group)
        wait_s = float(timeout_s) if _valid_timeout(timeout_s) else DEFAULT_TIMEOUT_S
        ranks.barrier("HostSlab.create", wait_s)
        request, problem = None, None
        try:
            request = _check_arguments(payloads, num_pages, num_layers, timeout_s)
            pin = _check_pin(pin)
        except CpkvError as err:
            problem = _problem(err)
        # Names are agreed before anything exists, so any rank can remove them all on an error path.
        run_id = f"{os.getpid()}-{secrets.token_hex(4)}"
        heard = ranks.all_gather("HostSlab.create argument check", wait_s,
                                 (request.key if request else None, problem, _node_id(), run_id))
        _raise_agreed([h[1] for h in heard], "HostSlab.create: bad arguments")
        keys = [h[0] for h in heard]
        if any(key != keys[0] for key in keys):
            differing = "; ".join(f"rank {r}: {key}" for r, key in enumerate(keys) if key != keys[0])
            raise InvalidArgumentError(
                f"HostSlab.create: ranks passed different arguments (rank 0: {keys[0]}; {differing})")
        if len({h[2] for h in heard}) != 1:
            raise InvalidArgumentError("HostSlab.create: the process group spans machines; a host slab is one node's")
        assert request is not None
        regions = cls._build(request, ranks, heard[0][3], wait_s, bool(pin))
        _announce([region.kind for region in regions])
        return cls(request, regions, rank=ranks.rank, world_size=ranks.world, run_id=heard[0][3], pinned=bool(pin))

    @staticmethod
    def _build(request: _Request, ranks: _Ranks, run_id: str, wait_s: float, pin: bool) -> list[_Region]:
        """Steps 2-4 of the module docstring; on any error every name of the run is removed, here."""
        names = [f"{NAME_PREFIX}{run_id}-p{i}" for i in range(len(request.payloads))]
        reservations: dict[int, _Reservation] = {}
        regions: list[_Region] = []
        try:
            problem = None
            try:
                for i in range(ranks.rank, len(request.payloads), ranks.world):
                    payload, spec = request.payloads[i]
                    reservations[i] = _reserve(names[i], payload, request.region_bytes(spec))
            except CpkvError as err:
                problem = _problem(err)
            heard = ranks.all_gather("HostSlab.create reservation", wait_s,
                                     ({i: r.where for i, r in reservations.items()}, problem))
            _raise_agreed([h[1] for h in heard], "HostSlab.create: cannot reserve the host slab")
            where = {i: w for h in heard for i, w in h[0].items()}
            problem = None
            try:
                for i, (payload, spec) in enumerate(request.payloads):
                    regions.append(_map(payload, spec, request, where[i], reservations.get(i)))
                    if pin:
                        _pin(regions[-1])
            except CpkvError as err:
                problem = _problem(err)
            # Every rank has mapped every region (or failed) once this returns.
            heard = ranks.all_gather("HostSlab.create mapping", wait_s, problem)
            _raise_agreed(heard, "HostSlab.create: cannot map the host slab")
            for reservation in reservations.values():
                reservation.drop_name()
            # Once create returns on any rank, every name of the run is gone.
            ranks.barrier("HostSlab.create names dropped", wait_s)
        except BaseException:
            _release_all(regions)
            for reservation in reservations.values():
                reservation.drop_name()
            for name in names:  # peers' names too: their creator may be dead
                unlink_now(os.path.join(SHM_DIR, name))
            raise
        return regions

    # -- access -----------------------------------------------------------------------------------

    def rows(self, payload: str) -> Any:
        """The payload's region as uint8 ``[num_layers, num_pages, row_bytes]`` (no copy: writes are shared)."""
        return self._region(payload).rows

    def view(self, payload: str) -> Any:
        """The payload's region as ``[num_layers, num_pages, *page_shape]`` of its dtype (no copy)."""
        return self._region(payload).view

    def _region(self, payload: str) -> _Region:
        if self._closed:
            raise InvalidArgumentError(f"host slab {self._run_id} is closed")
        try:
            return self._regions[payload]
        except (KeyError, TypeError):
            raise UnknownPayloadError(
                f"payload {payload!r} is not in this host slab (it has {list(self._payloads)})") from None

    @property
    def payloads(self) -> Mapping[str, SlabSpec]:
        return self._payloads

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def nbytes(self) -> int:
        """Bytes of page data over all payloads (mappings are rounded up to the page size)."""
        return self._nbytes

    @property
    def kinds(self) -> Mapping[str, str]:
        """Per payload: "hugetlb" (2 MiB huge pages) or "shm" (/dev/shm)."""
        return self._kinds

    @property
    def kind(self) -> str:
        """"hugetlb" when every region is in huge pages, else the other kind (normally "shm")."""
        kinds = set(self._kinds.values())
        if kinds == {"hugetlb"}:
            return "hugetlb"
        return sorted(kinds - {"hugetlb"})[0]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def run_id(self) -> str:
        """Agreed by every rank; part of every name this slab ever had (``cpkv-slab-<run_id>-p<i>``)."""
        return self._run_id

    @property
    def pinned(self) -> bool:
        return self._pinned

    @property
    def closed(self) -> bool:
        return self._closed

    # -- teardown ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Local and idempotent: unpins and drops this slab's mappings.

        Tensors obtained from :meth:`rows`/:meth:`view` stay valid (they keep their mapping alive);
        the memory returns to the system when the last rank drops the last of them.
        """
        self._closed = True
        self._regions = {}
        self._finalizer()

    def __enter__(self) -> HostSlab:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.kind
        return (f"HostSlab({ {n: (s.page_shape, str(s.dtype)) for n, s in self._payloads.items()} }, "
                f"num_pages={self._num_pages}, num_layers={self._num_layers}, rank={self._rank}/"
                f"{self._world_size}, {state})")
