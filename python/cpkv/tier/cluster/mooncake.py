"""Mooncake Store as the cluster tier's store: where its programs are, and a client whose every call
is bounded in time.

``MooncakeDistributedStore``'s calls block, and how long depends on how the master failed: a killed
master fails them in milliseconds (connection reset), a stopped one only after its 30 s RPC timeout.
They release the GIL, so :class:`BoundedStore` runs each on its one worker thread and waits at most
``timeout_s``. A call still running then leaves the client *stuck*: every later call fails at once
(:class:`~cpkv.errors.ClusterUnavailableError`) until the stuck one returns, so a dead store never
costs more than one timeout however many calls follow.

Return codes (Mooncake's ``ErrorCode``): ``batch_is_exist`` gives 1, 0 or a negative code per key;
``batch_get_into`` the bytes read or a negative code; ``batch_put_from`` 0 or a negative code.
:func:`is_fault` says which codes mean the store is in trouble (an RPC or transfer failure) rather
than an ordinary answer (an object not there, a full store, a put of a key that exists).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from cpkv.errors import ClusterUnavailableError

T = TypeVar("T")

DISTRIBUTION = "mooncake-transfer-engine-non-cuda"
# Codes that are answers, not faults: the object is missing or not complete yet, it exists
# already (a put racing another writer), it holds a lease, or no segment has room for it.
OBJECT_NOT_FOUND = -704
_ANSWERS = frozenset({-200, -703, -704, -705, -706})


def is_fault(code: int) -> bool:
    """A negative code that says the store is in trouble (RPC, transfer or internal failure)."""
    return code < 0 and code not in _ANSWERS


def package_dir() -> Path:
    """The installed ``mooncake`` package's directory (its programs live in it)."""
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        raise ClusterUnavailableError(f"the cluster tier needs Mooncake Store: pip install {DISTRIBUTION} "
                                      "(cpkv's `cluster` extra) and Debian's libibverbs1")
    return Path(next(iter(spec.submodule_search_locations)))


def program(name: str) -> str:
    """The path of one of the wheel's programs (``mooncake_master``, ``mooncake_client``)."""
    path = package_dir() / name
    if not path.is_file():
        raise ClusterUnavailableError(f"{path}: Mooncake's {name} is not installed with its package")
    if not os.access(path, os.X_OK):  # the wheel's own launchers set the bit the same way
        path.chmod(path.stat().st_mode | 0o111)
    return str(path)


def store_class() -> Any:
    """``mooncake.store.MooncakeDistributedStore`` (imported on first use: the extension is large)."""
    package_dir()
    # Mooncake logs through glog to stderr, an error line even for a lookup of a name it has not
    # seen yet; cpkv reports what failed itself (a user's own GLOG_minloglevel wins).
    os.environ.setdefault("GLOG_minloglevel", "3")
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as err:  # libibverbs1 missing, most often
        raise ClusterUnavailableError(f"mooncake.store does not load: {err} (Debian: apt-get install "
                                      "libibverbs1)") from err
    return MooncakeDistributedStore


def check_reachable(master: str, metadata: str, timeout_s: float) -> None:
    """Before a client's ``setup``, which holds the GIL while it retries an absent master for
    about 90 s: the master's port accepts a connection and the metadata server answers HTTP."""
    host, _, port = master.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ClusterUnavailableError(f"--cluster-master {master}: no Mooncake master answers there "
                                      f"({err.strerror or err})") from err
    try:
        urllib.request.urlopen(metadata, timeout=timeout_s).close()
    except urllib.error.HTTPError:
        pass  # an HTTP answer (404 for the bare path): the server is there
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise ClusterUnavailableError(f"--cluster-metadata {metadata}: no metadata server answers there "
                                      f"({reason})") from err


class BoundedStore:
    """A Mooncake Store client whose calls are each bounded by ``timeout_s``. Not for concurrent callers."""

    def __init__(self, master: str, metadata: str, timeout_s: float, *, hostname: str = "127.0.0.1",
                 segment_bytes: int = 0) -> None:
        self.master, self.metadata, self.timeout_s = master, metadata, timeout_s
        check_reachable(master, metadata, timeout_s)
        self._store = store_class()()
        self._lock = threading.Condition()
        self._job: Callable[[], Any] | None = None
        self._busy = False  # a call is running on the worker (stuck, once its caller gave up)
        self._result: tuple[bool, Any] | None = None
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="cpkv-cluster-store", daemon=True)
        self._worker.start()
        # segment_bytes: memory this client lends the store (0: the store servers hold every object).
        code = self.call("setup", lambda: self._store.setup(hostname, metadata, segment_bytes, 0, "tcp", "", master))
        if code != 0:
            raise ClusterUnavailableError(f"the Mooncake master at {master} (metadata {metadata}) refused this "
                                          f"client: setup returned {code}")

    @property
    def stuck(self) -> bool:
        """A call outlived its timeout and still runs (the store is unresponsive)."""
        with self._lock:
            return self._busy

    def call(self, what: str, job: Callable[[], T]) -> T:
        """Runs ``job`` on the worker; its result, or :class:`ClusterUnavailableError` when it did not
        finish within ``timeout_s`` (or an earlier call still runs)."""
        with self._lock:
            if self._closed:
                raise ClusterUnavailableError(f"cluster store client closed ({what})")
            if self._busy:
                raise ClusterUnavailableError(f"{what}: an earlier call to the Mooncake master at {self.master} "
                                              "has not returned")
            self._job, self._busy, self._result = job, True, None
            self._lock.notify_all()
            if not self._lock.wait_for(lambda: self._result is not None, self.timeout_s):
                raise ClusterUnavailableError(f"{what}: the Mooncake master at {self.master} did not answer within "
                                              f"{self.timeout_s:g} s")
            result, self._result = self._result, None
        assert result is not None
        ok, value = result
        if not ok:
            raise ClusterUnavailableError(f"{what}: {value}") from value
        return value

    def start(self, job: Callable[[], Any]) -> bool:
        """Hands ``job`` to the worker without waiting (a probe of a store that may not answer); False
        when a call still runs. Its outcome is :meth:`take`'s."""
        with self._lock:
            if self._closed or self._busy:
                return False
            self._job, self._busy, self._result = job, True, None
            self._lock.notify_all()
            return True

    def take(self) -> tuple[bool, Any] | None:
        """The outcome of the last job once it finished ((True, its value) or (False, its error)),
        once; None while it runs or when there is none."""
        with self._lock:
            if self._busy:
                return None
            result, self._result = self._result, None
            return result

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._job is not None or self._closed)
                if self._job is None:
                    return
                job, self._job = self._job, None
            try:
                result: tuple[bool, Any] = (True, job())
            except Exception as err:  # handed to the caller as ClusterUnavailableError
                result = (False, err)
            with self._lock:
                self._result, self._busy = result, False
                self._lock.notify_all()

    # -- the calls cpkv makes (each bounded) --------------------------------------------------

    def round_trip(self, key: str, src: Any, dst: Any) -> bool:
        """Unbounded (run it through :meth:`start`): an upsert of ``src`` under ``key`` and a get into
        ``dst`` (registered uint8 arrays of one size) give back the same bytes."""
        size = int(src.nbytes)
        if self._store.batch_upsert_from([key], [src.ctypes.data], [size]) != [0]:
            return False
        return bool(self._store.batch_get_into([key], [dst.ctypes.data], [size]) == [size] and (src == dst).all())

    def register(self, address: int, nbytes: int) -> None:
        code = self.call("register_buffer", lambda: self._store.register_buffer(address, nbytes))
        if code != 0:
            raise ClusterUnavailableError(f"register_buffer of {nbytes} bytes returned {code}")

    def exist(self, keys: Sequence[str]) -> list[int]:
        return list(self.call("batch_is_exist", lambda: self._store.batch_is_exist(list(keys))))

    def get_into(self, keys: Sequence[str], addresses: Sequence[int], sizes: Sequence[int]) -> list[int]:
        return list(self.call("batch_get_into", lambda: self._store.batch_get_into(list(keys), list(addresses),
                                                                                    list(sizes))))

    def put_from(self, keys: Sequence[str], addresses: Sequence[int], sizes: Sequence[int], *,
                 replace: bool = False) -> list[int]:
        """``batch_put_from`` (a key that exists keeps its old value), or with ``replace``
        ``batch_upsert_from`` (the object is written again)."""
        put = self._store.batch_upsert_from if replace else self._store.batch_put_from
        return list(self.call("batch_upsert_from" if replace else "batch_put_from",
                              lambda: put(list(keys), list(addresses), list(sizes))))

    def close(self) -> None:
        """Closes the client when no call is stuck (a stuck one would block the close too)."""
        with self._lock:
            if self._closed:
                return
            stuck = self._busy
            self._closed = True
            self._lock.notify_all()
        if not stuck:
            self._worker.join(self.timeout_s)
            try:
                self._store.close()
            except Exception:  # a dead master: nothing left to release on its side
                pass
