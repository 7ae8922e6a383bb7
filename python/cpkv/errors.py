"""The cpkv exception hierarchy.

Every error cpkv raises is a :class:`CpkvError`. Lookup failures are also
``KeyError``, bad arguments also ``ValueError`` (and, when the type is wrong,
``TypeError`` too), so callers can catch either the cpkv class or the builtin
they already expect. The Rust extension raises these very classes, imported
once when it loads, with one conversion per core error type, in one place
(``crates/cpkv-py/src/errors.rs``).
"""

from __future__ import annotations

__all__ = [
    "CpkvError",
    "CpkvKeyError",
    "UnknownKeyError",
    "DuplicateKeyError",
    "UnknownNodeError",
    "CpkvValueError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "UnknownPayloadError",
    "NotCommittedError",
    "SnapshotError",
    "UnknownPolicyError",
    "TraceError",
    "LockError",
    "SpanError",
    "CopyTableError",
    "CollectiveTimeoutError",
    "DivergenceError",
    "FallbackError",
    "GroupBrokenError",
    "ClusterUnavailableError",
    "EngineVersionError",
    "InternalError",
]


class CpkvError(Exception):
    """Base class of every cpkv error."""


class CpkvKeyError(CpkvError, KeyError):
    """A key, node or name that should exist does not (or should not, and does)."""

    # KeyError.__str__ shows repr(message); show the message as written.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownKeyError(CpkvKeyError):
    """An allocator key that is not live."""


class DuplicateKeyError(CpkvKeyError):
    """An allocator key that is already live."""


class UnknownNodeError(CpkvKeyError):
    """A prefix-tree node id that does not exist (or was evicted)."""


class CpkvValueError(CpkvError, ValueError):
    """An argument cpkv cannot accept; nothing was changed."""


class InvalidArgumentError(CpkvValueError):
    """A count, position or shape out of range."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type: a float, bool, str, bytes, mapping or set where an int or an
    ordered sequence of ints belongs, or ``None`` where a value is required."""


class UnknownPayloadError(CpkvValueError):
    """A payload name the allocator was not built with (or an empty/repeated one)."""


class NotCommittedError(CpkvValueError):
    """An operation that needs a committed object got an uncommitted one."""


class SnapshotError(CpkvValueError):
    """Snapshot bytes that are truncated, corrupted or of an unknown version."""


class UnknownPolicyError(CpkvValueError):
    """An eviction policy name that does not exist."""


class TraceError(CpkvValueError):
    """A request trace that cannot be read or breaks the format; the message names path and line."""


class LockError(CpkvValueError):
    """Unlocking below zero, or an operation a lock forbids."""


class SpanError(CpkvValueError):
    """Slot spans that overlap, leave the buffer or contradict each other."""


class CopyTableError(InvalidArgumentError):
    """A native row copy refused before moving a byte: a buffer that is not a contiguous CPU
    array, rows of different sizes or dtypes, a misaligned or overlapping buffer, or a run
    outside its buffers."""


class CollectiveTimeoutError(CpkvError, TimeoutError):
    """A barrier or collective did not complete in time (a rank died or stalled)."""


class DivergenceError(CpkvError):
    """Ranks that must agree computed different state (digests differ)."""


class FallbackError(CpkvError, RuntimeError):
    """An unexpected fallback to a slow path where none is allowed (CUDA)."""


class GroupBrokenError(CpkvError, RuntimeError):
    """A compose group that saw an error inside its protocol: its ranks may be out of step, so it
    refuses every further call until it is closed."""


class EngineVersionError(CpkvError, ImportError):
    """A serving engine that is missing, not the exact version an integration was built for, or unable
    to build the native code it compiles on first use."""


class ClusterUnavailableError(CpkvError, ConnectionError):
    """The cluster tier's store (a Mooncake master or store server) is missing, dead or does not
    answer in time; the message names the setting (``--cluster-master``) or the call."""


class InternalError(CpkvError, RuntimeError):
    """A bug inside cpkv (a Rust panic). The object it happened in may be half-changed, so it
    refuses every further call with this error; build a new one (from a peer's snapshot where
    there is one)."""
