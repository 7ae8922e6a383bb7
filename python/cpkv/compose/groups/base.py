"""What every compose group shares: argument checks, byte views and honest counters."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, TypeVar

from cpkv.compose.debug import check_current, check_plan
from cpkv.compose.plan import ComposePlan, PlanCache
from cpkv.compose.spans import SlotSpans
from cpkv.config import config
from cpkv.errors import GroupBrokenError, InvalidArgumentError
from cpkv.kernels.gather import as_byte_rows, gather_runs
from cpkv.runtime.agree import agree
from cpkv.runtime.timeouts import guarded

_EVERY_RANK = "_cpkv_raised_on_every_rank"


def on_every_rank(err: BaseException) -> BaseException:
    """Marks an error that every rank raises alike, at the same step, having changed nothing
    (decided from exchanged or agreed values): the ranks stay in step, so it does not break the group."""
    setattr(err, _EVERY_RANK, True)
    return err


_Group = TypeVar("_Group", bound="DistributedGroup")


@dataclass
class GroupStats:
    """What a group actually issued (the benchmark divides these by layers)."""

    composes: int = 0
    barriers: int = 0
    collectives: int = 0
    fallbacks: int = 0
    agreements: int = 0  # plan-digest agreements (one small all-reduce each, once per batch)
    barrier_s: float = 0.0  # wall time spent waiting in barriers (what the stragglers cost)


class ComposeGroup:
    """One interface, three transports (:class:`LocalGroup`, :class:`ShmGroup`, :class:`CudaIpcGroup`).

    ``compose`` is the staged single-gather path; ``compose_allreduce`` the
    dense all-reduce baseline. Both give byte-identical dense buffers.
    """

    cp_size: int

    def __init__(self, cp_size: int) -> None:
        if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
            raise InvalidArgumentError(f"cp_size must be an integer >= 1, got {cp_size!r}")
        self.cp_size = cp_size
        self.stats = GroupStats()

    def _check_plan(self, plan: ComposePlan) -> None:
        if not isinstance(plan, ComposePlan):
            raise InvalidArgumentError(f"expected a ComposePlan, got {type(plan).__name__}")
        if plan.cp_size != self.cp_size:
            raise InvalidArgumentError(f"plan is for cp_size {plan.cp_size}, group has {self.cp_size}")


class DistributedGroup(ComposeGroup):
    """A rank of a ``torch.distributed`` process group (:class:`ShmGroup`, :class:`CudaIpcGroup`).

    Subclasses provide ``_dist``, ``_pg``, ``rank``, ``timeout_s``, ``plans``,
    ``device``, ``_payloads`` (records with ``rows``, ``row_bytes``, ``dtype``,
    ``page_shape`` and ``pools``, one per rank), ``_out`` and ``_compose``, and
    call :meth:`_init_protocol`.

    Agreement: a batch's plan is agreed by :func:`cpkv.runtime.agree.agree` (one small all-reduce
    of its digest, all 64 bits) when its first layer (``layer == 0``) is composed; ranks that
    differ raise :class:`DivergenceError` on every rank, naming which ranks hold which digest. The trigger reads only replicated values (the layer index and the call sequence),
    so every rank issues the all-reduce or none does: a plan that changed since the last layer-0
    call is agreed again, and consecutive layer-0 calls with one plan (one per payload: every
    payload of a batch shares the digest) are agreed once. A rank whose plan alone changes in the
    middle of a batch issues an all-reduce its peers do not: every rank then fails with
    :class:`CollectiveTimeoutError` (bounded by ``timeout_s``) rather than composing wrong bytes.

    Broken state: an error escaping any step of the protocol (registration, compose, barrier,
    agreement) may leave the ranks out of step (unless every rank raised it alike, having changed
    nothing: see :func:`on_every_rank`) (a staging parity, a barrier one rank skipped), so
    the group marks itself broken and every later call raises :class:`GroupBrokenError` until
    :meth:`close` (which then releases locally, without a collective).
    """

    _dist: Any
    _pg: Any
    rank: int
    timeout_s: float
    plans: PlanCache
    device: Any
    _payloads: dict[str, Any]

    def _init_protocol(self) -> None:
        self._batch_digest: int | None = None  # the last agreed plan digest
        self._last_call: tuple[int, int] | None = None  # (layer, digest) of the last compose
        self._broken: str | None = None
        self._closed = False

    @property
    def broken(self) -> str | None:
        """Why the group is broken (the first error inside its protocol), or None."""
        return self._broken

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Collective: waits until no peer reads, then releases. A broken group releases locally."""
        if self._closed:
            return
        if self._broken is not None:
            self._release()
            return
        try:
            self._quiesce()
            self.barrier("close", layer=-1)
        finally:
            self._release()

    def barrier(self, what: str = "barrier", *, layer: int = -1) -> None:
        """Collective: every rank of the group has arrived (bounded by ``timeout_s``)."""
        raise NotImplementedError

    def _quiesce(self) -> None:
        """This rank's own queued work, finished before the closing barrier (none on the CPU)."""

    def _release(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Group) -> _Group:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """A clean exit closes the group (with its ranks); an exception aborts it (locally)."""
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _check_usable(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the group is closed")
        if self._broken is not None:
            raise GroupBrokenError(
                f"rank {self.rank}: the group is broken by an earlier error ({self._broken}); "
                "its ranks may be out of step, so it refuses every call: close it and build a new one"
            )

    @contextmanager
    def _protocol(self, what: str) -> Iterator[None]:
        """One step of the protocol: refused when broken or closed; any error in it breaks the group."""
        self._check_usable()
        try:
            yield
        except BaseException as err:
            if self._broken is None and not self._closed and not getattr(err, _EVERY_RANK, False):
                detail = str(err).splitlines()[0] if str(err) else ""
                self._broken = f"{what}: {type(err).__name__}: {detail}"[:500]
            raise

    def _agreement_group(self) -> Any:
        """The process group that carries the agreement (a CPU int64 all-reduce)."""
        return self._pg

    def _agree(self, plan: ComposePlan, layer: int) -> None:
        """Every rank holds a plan with the same digest, or every rank raises DivergenceError."""
        digest = plan.digest
        first_layer = layer == 0 and self._last_call != (0, digest)
        self._last_call = (layer, digest)
        if not first_layer and digest == self._batch_digest:
            return
        self.stats.collectives += 1
        self.stats.agreements += 1
        agree(digest, group=self._agreement_group(), rank=self.rank,
              step=f"layer {layer}: the plan agreement ({plan!r})", timeout_s=self.timeout_s)
        self._batch_digest = digest

    def _payload(self, payload: str) -> Any:
        self._check_usable()
        try:
            return self._payloads[payload]
        except KeyError:
            raise InvalidArgumentError(f"payload {payload!r} is not registered") from None

    def pool(self, payload: str) -> Any:
        """This rank's pool for ``payload``, ``[rows, *page_shape]`` of its dtype (its peers read what it writes)."""
        p = self._payload(payload)
        return p.pools[self.rank].view(p.dtype).view(p.rows, *p.page_shape)

    def compose(self, plan: ComposePlan, payload: str, current: Any, *, layer: int = 0, out: Any = None) -> Any:
        """This rank's dense buffer ``[num_slots, *page_shape]``: stage, one barrier, one gather.

        The first compose of a batch's plan first agrees on its digest (see the class doc).
        """
        with self._protocol(f"compose of layer {layer}"):
            return self._compose(plan, payload, current, layer, out)

    def _compose(self, plan: ComposePlan, payload: str, current: Any, layer: int, out: Any) -> Any:
        raise NotImplementedError

    def _out(self, plan: ComposePlan, p: Any, out: Any) -> Any:
        """The uint8 ``[num_slots, row_bytes]`` dense buffer: ``out`` checked, or a new one."""
        raise NotImplementedError

    def plan(self, payload: str, page_size: int, requests: Sequence[SlotSpans], num_slots: int) -> ComposePlan:
        """The batch's plan for ``payload``, from this group's cache (keyed by everything it depends on)."""
        return self.plans.get(self.cp_size, page_size, requests, num_slots, device=str(self.device),
                              payload=payload, pool_rows=self._payload(payload).rows)

    def compose_allreduce(
        self, plan: ComposePlan, payload: str, current: Any, *, layer: int = 0, out: Any = None
    ) -> Any:
        """The explicit dense baseline: zero, fill the slots this rank owns, all-reduce (uint8 SUM) the buffer."""
        with self._protocol(f"compose_allreduce of layer {layer}"):
            return self._compose_allreduce(plan, payload, current, layer, out)

    def _compose_allreduce(self, plan: ComposePlan, payload: str, current: Any, layer: int, out: Any) -> Any:
        p = self._payload(payload)
        self._check_plan(plan)
        self._agree(plan, layer)
        pool = check_pool(plan, self.rank, self.pool(payload), payload)
        rows = check_current_rows(plan, self.rank, current, p.row_bytes, plan.staging_rows(self.rank))
        dense = self._out(plan, p, out).zero_()
        gather_runs(dense, [pool, rows], plan.owned_runs(self.rank))
        # Exactly one rank contributes each slot and the rest add zeros: the byte sum is exact.
        guarded("all-reduce", self.rank, layer, self.timeout_s,
                lambda: self._dist.all_reduce(dense, op=self._dist.ReduceOp.SUM, group=self._pg))
        self.stats.collectives += 1
        self.stats.composes += 1
        return dense.view(p.dtype).view(plan.num_slots, *p.page_shape)


def resolve_device(device: Any) -> Any:
    """``device`` as a ``torch.device`` with an index where one is implied: ``"cuda"`` is the current
    CUDA device (``cuda:N``), so two spellings of one device compare equal; CPU stays ``cpu``."""
    import torch

    resolved = device if isinstance(device, torch.device) else torch.device(device)
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def check_pool(plan: ComposePlan, rank: int, pool: Any, payload: str | None = None) -> Any:
    """``rank``'s pool as byte rows, after checking it is the pool ``plan`` was made for.

    A plan built with a device, payload or pool capacity in its key serves only
    that device, payload and capacity.
    """
    if pool.dim() < 1:
        raise InvalidArgumentError(f"rank {rank}: pool must be [rows, *page_shape], got shape {tuple(pool.shape)}")
    key = plan.key
    if key.pool_rows is not None and pool.shape[0] != key.pool_rows:
        raise InvalidArgumentError(
            f"rank {rank}: plan was built for pools of {key.pool_rows} rows, this pool has {pool.shape[0]}"
        )
    if key.payload is not None and payload != key.payload:
        raise InvalidArgumentError(f"rank {rank}: plan was built for payload {key.payload!r}, not {payload!r}")
    if key.device is not None and str(pool.device) != key.device \
            and resolve_device(pool.device) != resolve_device(key.device):  # "cuda" is "cuda:0" on device 0
        raise InvalidArgumentError(f"rank {rank}: plan was built for device {key.device}, pool is on {pool.device}")
    plan.check_pool_rows(pool.shape[0])
    return as_byte_rows(pool)


def check_current_rows(plan: ComposePlan, rank: int, current: Any, row_bytes: int, staging_rows: int) -> Any:
    """``rank``'s current rows as byte rows, after checking count and row size."""
    rows = as_byte_rows(current)
    if rows.shape[0] != plan.num_current(rank):
        raise InvalidArgumentError(
            f"rank {rank}: {rows.shape[0]} current rows given, plan.current_pages({rank}) has {plan.num_current(rank)}"
        )
    if rows.shape[1] != row_bytes:
        raise InvalidArgumentError(f"rank {rank}: current rows are {rows.shape[1]} bytes, pool rows {row_bytes}")
    if config().debug:
        check_current(plan, rank, rows.shape[0], staging_rows)
        check_plan(plan, rank)
    return rows


def gather_planned(out: Any, sources: Any, plan: ComposePlan, rank: int) -> Any:
    """``rank``'s gather: the plan's copy runs in one native call on CPU (``sources``: a list of
    buffers or a ``RowSources``), torch copies on a device."""
    return gather_runs(out, sources, plan.copy_runs(rank))
