"""HostSlab: one shared host region per payload, mapped by every rank, never a name left in /dev/shm."""

from __future__ import annotations

import errno
import glob
import logging
import math
import mmap
import os
import re
import select
import signal
import time

import pytest
import torch
import torch.distributed as dist

import cpkv.tier.slab as slab_module
from cpkv.errors import CollectiveTimeoutError, FallbackError, InvalidArgumentError, UnknownPayloadError
from cpkv.runtime import shm
from cpkv.runtime.launch import run_ranks
from cpkv.tier import HostSlab, SlabSpec

# K pages in bf16, an fp8 payload with an odd row, and per-page scales: three regions, three creators.
PAYLOADS = {
    "k": SlabSpec((4, 8), torch.bfloat16),
    "fp8": SlabSpec((16, 3), torch.float8_e4m3fn),
    "scale": SlabSpec((3,), torch.float32),
}
NUM_PAGES, NUM_LAYERS = 11, 3
SHM_PATH = re.compile(r"/dev/shm/cpkv-slab-[0-9a-f]+-[0-9a-f]+-p\d+")


def _names_of(run_id: str) -> list[str]:
    return glob.glob(f"/dev/shm/*{run_id}*")


def _page_values(payload: str, page: int, num_layers: int = NUM_LAYERS) -> torch.Tensor:
    """The bytes the owner of ``page`` writes, regenerated identically by every reader."""
    spec = PAYLOADS[payload]
    gen = torch.Generator().manual_seed(1000 * page + len(payload))
    return (torch.randn(num_layers, *spec.page_shape, generator=gen) * 4).to(spec.dtype)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _open_fds(run_id: str) -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return [link for link in links if run_id in link]


def _plain_memfd(data_bytes: int) -> tuple[int, str, int]:
    """The huge-page path with a plain memfd: peers open the creator's /proc/<pid>/fd/<fd>."""
    return 0, "memfd", mmap.PAGESIZE


def _as_if_huge_pages(data_bytes: int) -> tuple[int, str, int]:
    """A host with free 2 MiB huge pages, as the slab sees it (a plain memfd reported as "hugetlb")."""
    return 0, "hugetlb", mmap.PAGESIZE


def _no_huge_pages() -> None:
    """Tests about the /dev/shm path take it on any host: a GPU server often has free huge pages, and
    then the slab (rightly) lives in them, not in /dev/shm."""
    slab_module._free_huge_page_bytes = lambda: 0


@pytest.fixture
def no_huge_pages(monkeypatch):
    monkeypatch.setattr(slab_module, "_free_huge_page_bytes", lambda: 0)


# -- across real processes --------------------------------------------------------------------------


def _share_worker(rank: int, world: int, memfd: bool) -> dict:
    if memfd:
        slab_module._memfd_choice = _plain_memfd
    else:
        _no_huge_pages()
    before = set(glob.glob("/dev/shm/cpkv-slab-*"))
    slab = HostSlab.create(PAYLOADS, num_pages=NUM_PAGES, num_layers=NUM_LAYERS, timeout_s=20)
    after = set(glob.glob("/dev/shm/cpkv-slab-*"))
    # The names are gone as soon as create returns (only a concurrent run could add any).
    assert not [n for n in after - before if slab.run_id in n], after - before
    # The creator closed its own descriptor; what is left is the one each mmap object keeps.
    assert len(_open_fds(slab.run_id)) <= len(PAYLOADS)
    for payload, spec in PAYLOADS.items():
        rows, view = slab.rows(payload), slab.view(payload)
        assert rows.dtype == torch.uint8 and rows.shape == (NUM_LAYERS, NUM_PAGES, spec.row_bytes)
        assert view.dtype == spec.dtype and view.shape == (NUM_LAYERS, NUM_PAGES, *spec.page_shape)
        assert view.data_ptr() == rows.data_ptr()
        for page in range(rank, NUM_PAGES, world):  # the pages this rank owns
            view[:, page] = _page_values(payload, page)
    dist.barrier()
    checked = 0
    for payload in PAYLOADS:
        for page in range(NUM_PAGES):
            want = _as_bytes(_page_values(payload, page))
            assert torch.equal(_as_bytes(slab.view(payload)[:, page]), want), (payload, page)
            assert torch.equal(slab.rows(payload)[:, page], want.view(NUM_LAYERS, -1)), (payload, page)
            checked += 1
    dist.barrier()  # nobody closes while a peer still reads (not needed for safety, only for the check)
    result = {"run_id": slab.run_id, "kind": slab.kind, "kinds": dict(slab.kinds), "checked": checked,
              "nbytes": slab.nbytes, "rank": slab.rank, "world": slab.world_size}
    slab.close()
    return result


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world, memfd", [(2, False), (3, False), (2, True), (3, True)])
def test_every_rank_reads_every_page_any_rank_wrote(world, memfd):
    results = run_ranks(_share_worker, world, memfd, timeout_s=90, collective_timeout_s=20)
    assert [r["rank"] for r in results] == list(range(world))
    assert all(r["world"] == world and r["checked"] == len(PAYLOADS) * NUM_PAGES for r in results)
    assert len({r["run_id"] for r in results}) == 1
    kind = "memfd" if memfd else "shm"
    assert all(r["kind"] == kind and set(r["kinds"].values()) == {kind} for r in results)
    assert results[0]["nbytes"] == sum(NUM_LAYERS * NUM_PAGES * s.row_bytes for s in PAYLOADS.values())
    assert _names_of(results[0]["run_id"]) == []


def _enospc(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _reserve_failure_worker(rank: int, world: int, how: str) -> str:
    _no_huge_pages()
    payloads, num_pages = PAYLOADS, NUM_PAGES
    if how == "one rank's fallocate fails" and rank == world - 1:
        slab_module._fallocate = _enospc
    elif how == "larger than /dev/shm":
        st = os.statvfs("/dev/shm")
        payloads = {"huge": SlabSpec((1 << 20,), torch.uint8)}
        num_pages = st.f_blocks * st.f_frsize // (1 << 20) + 1  # one layer a MiB more than the whole mount
    try:
        HostSlab.create(payloads, num_pages=num_pages, num_layers=1, timeout_s=20)
        return "created"
    except InvalidArgumentError as err:
        return str(err)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["one rank's fallocate fails", "larger than /dev/shm"])
def test_a_failed_reservation_is_the_same_typed_error_on_every_rank_and_leaves_nothing(how):
    start = time.monotonic()
    results = run_ranks(_reserve_failure_worker, 3, how, timeout_s=90, collective_timeout_s=20)
    assert time.monotonic() - start < 60
    assert len(set(results)) == 1, results  # every rank raised, with one message
    message = results[0]
    payload = "scale" if how.startswith("one") else "huge"  # rank 2 creates the third payload; rank 0 the only one
    assert message.startswith("HostSlab.create: cannot reserve the host slab: rank")
    assert f"payload {payload!r}: cannot reserve" in message and "No space left on device" in message
    assert re.search(r"reserve \d+ bytes at ", message) and "bytes free" in message
    path = SHM_PATH.search(message).group(0)
    assert not os.path.exists(path)
    assert glob.glob(path.rsplit("-p", 1)[0] + "-p*") == []  # the regions the others did reserve are gone too


def _kill_worker(rank: int, world: int, when: str, record: str) -> str:
    _no_huge_pages()  # the victim's name must be a /dev/shm path
    if when == "during create" and rank == 1:
        def reserve_then_die(fd: int, offset: int, length: int) -> None:
            with open(record, "w") as f:
                f.write(os.readlink(f"/proc/self/fd/{fd}"))
            os.posix_fallocate(fd, offset, length)
            os.kill(os.getpid(), signal.SIGKILL)

        slab_module._fallocate = reserve_then_die
    try:
        slab = HostSlab.create(PAYLOADS, num_pages=NUM_PAGES, num_layers=NUM_LAYERS, timeout_s=5)
    except CollectiveTimeoutError as err:
        return f"timeout: {err}"
    pids: list = [None] * world
    dist.all_gather_object(pids, os.getpid())
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    # Until the victim has exited (its pidfd turns readable then): its region (payload 1) lives on in
    # the survivors' mappings.
    victim = os.pidfd_open(pids[1])
    try:
        assert select.select([victim], [], [], 30)[0], "the victim was still alive 30 s after its SIGKILL"
    finally:
        os.close(victim)
    rows = slab.rows("fp8")[rank]  # one layer per survivor: they write the same shared region
    rows.fill_(rank + 1)
    assert int(rows.sum()) == rows.numel() * (rank + 1)
    return slab.run_id


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["after create", "during create"])
def test_a_rank_killed_with_sigkill_leaves_nothing_in_dev_shm(when, tmp_path):
    record = str(tmp_path / "victim-name")
    results = run_ranks(_kill_worker, 3, when, record, timeout_s=90, collective_timeout_s=5, expect_failures=True)
    assert results[1] is None  # the victim vanished
    if when == "after create":
        assert results[0] == results[2]
        assert _names_of(results[0]) == []
        return
    for rank in (0, 2):
        assert results[rank].startswith(f"timeout: rank {rank}: HostSlab.create reservation"), results[rank]
    with open(record) as f:
        victim_path = f.read()
    assert SHM_PATH.fullmatch(victim_path), victim_path  # the victim had created its name...
    assert not os.path.exists(victim_path)  # ...and the survivors removed it
    assert glob.glob(victim_path.rsplit("-p", 1)[0] + "-p*") == []


def _argument_worker(rank: int, world: int) -> dict:
    spec = {"k": SlabSpec((8,), torch.uint8), "v": SlabSpec((2, 4), torch.bfloat16)}
    outcomes: dict = {}

    def attempt(label: str, payloads: dict, num_pages: int = 4, num_layers: int = 2) -> None:
        try:
            HostSlab.create(payloads, num_pages=num_pages, num_layers=num_layers, timeout_s=10)
            outcomes[label] = "created"
        except (InvalidArgumentError, UnknownPayloadError) as err:
            outcomes[label] = f"{type(err).__name__}: {err}"

    attempt("num_pages differ", spec, num_pages=4 + rank)
    attempt("order differs", spec if rank == 0 else dict(reversed(spec.items())))
    attempt("dtype differs", {**spec, "v": SlabSpec((2, 4), torch.float16 if rank == 1 else torch.bfloat16)})
    attempt("bad on one rank", spec, num_layers=0 if rank == 1 else 2)
    attempt("empty name on one rank", {"": spec["k"]} if rank == 1 else {"x": spec["k"]})
    real_node_id = slab_module._node_id
    if rank == 0:
        slab_module._node_id = lambda: "another machine"
    attempt("two machines", spec)
    slab_module._node_id = real_node_id
    with HostSlab.create(spec, num_pages=4, num_layers=2, timeout_s=10) as slab:  # the group still works
        outcomes["after"] = (slab.num_pages, slab.num_layers, sorted(slab.payloads))
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bad_or_mismatched_arguments_raise_alike_on_every_rank():
    results = run_ranks(_argument_worker, 2, timeout_s=90, collective_timeout_s=10)
    assert results[0] == results[1], results  # the same error, word for word, on both ranks
    outcome = results[0]
    for label in ("num_pages differ", "order differs", "dtype differs"):
        assert outcome[label].startswith("InvalidArgumentError: HostSlab.create: ranks passed different arguments"), \
            outcome[label]
    assert "rank 1: ((('k', (8,), 'torch.uint8'), ('v', (2, 4), 'torch.bfloat16')), 5, 2)" in outcome["num_pages differ"]
    assert "torch.float16" in outcome["dtype differs"]
    assert outcome["bad on one rank"] == "InvalidArgumentError: HostSlab.create: bad arguments: rank 1: num_layers must be >= 1, got 0"
    assert outcome["empty name on one rank"].startswith("UnknownPayloadError: HostSlab.create: bad arguments: rank 1:")
    assert "spans machines" in outcome["two machines"]
    assert outcome["after"] == (4, 2, ["k", "v"])


# -- one process, no torch.distributed -------------------------------------------------------------


@pytest.mark.parametrize("host", ["no free huge pages", "free huge pages"])
def test_single_process_without_torch_distributed(host, monkeypatch):
    # The kind follows the host: "shm" was assumed once, and failed on hosts with free huge pages.
    if host == "no free huge pages":
        monkeypatch.setattr(slab_module, "_free_huge_page_bytes", lambda: 0)
    else:
        monkeypatch.setattr(slab_module, "_memfd_choice", _as_if_huge_pages)
    kind = "shm" if host == "no free huge pages" else "hugetlb"
    assert not dist.is_initialized()
    before = set(glob.glob("/dev/shm/cpkv-slab-*"))
    pinned = torch.cuda.is_available() and torch.cuda.is_initialized()  # the default: only where CUDA is in use
    with HostSlab.create(PAYLOADS, num_pages=NUM_PAGES, num_layers=NUM_LAYERS) as slab:
        assert (slab.rank, slab.world_size, slab.kind, slab.pinned) == (0, 1, kind, pinned)
        assert set(slab.kinds.values()) == {kind}
        assert [n for n in set(glob.glob("/dev/shm/cpkv-slab-*")) - before if slab.run_id in n] == []
        assert dict(slab.payloads) == PAYLOADS and (slab.num_pages, slab.num_layers) == (NUM_PAGES, NUM_LAYERS)
        for payload in PAYLOADS:
            assert not slab.view(payload).any()  # reserved memory starts zeroed
            slab.view(payload)[1, 7] = _page_values(payload, 7, 1)[0]
            assert torch.equal(slab.rows(payload)[1, 7], _as_bytes(_page_values(payload, 7, 1)[0]).flatten())
            assert not slab.rows(payload)[0].any() and not slab.rows(payload)[2].any()
        # Layer-major: one layer's run of pages is one contiguous range.
        assert slab.rows("k")[2, 3:9].is_contiguous()
        kept = slab.view("k")
        with pytest.raises(UnknownPayloadError, match="'q' is not in this host slab"):
            slab.rows("q")
        assert "HostSlab(" in repr(slab)
    assert slab.closed
    slab.close()  # idempotent
    for access in (slab.rows, slab.view):
        with pytest.raises(InvalidArgumentError, match="closed"):
            access("k")
    assert torch.equal(_as_bytes(kept[1, 7]), _as_bytes(_page_values("k", 7, 1)[0]))  # a held view stays valid
    assert _names_of(slab.run_id) == []


def test_single_process_plain_memfd_through_the_huge_page_path(monkeypatch):
    monkeypatch.setattr(slab_module, "_memfd_choice", _plain_memfd)
    slab = HostSlab.create({"k": PAYLOADS["k"]}, num_pages=3, num_layers=2)
    assert slab.kind == "memfd" and len(_open_fds(slab.run_id)) <= 1
    slab.rows("k").fill_(7)
    assert int(slab.rows("k").sum()) == 7 * slab.nbytes
    slab.close()


def test_no_free_huge_pages_after_all_falls_back_to_dev_shm(monkeypatch, caplog):
    if slab_module._free_huge_page_bytes() > 0:
        pytest.skip("this machine has free huge pages")
    monkeypatch.setattr(slab_module, "_free_huge_page_bytes", lambda: 1 << 40)  # looks available, is not
    assert slab_module._memfd_choice(1)[1:] == ("hugetlb", 2 << 20)
    with caplog.at_level(logging.INFO, logger="cpkv.tier"), \
            HostSlab.create({"k": PAYLOADS["k"]}, num_pages=3, num_layers=2) as slab:
        assert slab.kind == "shm"
    assert any("no hugetlb region" in r.getMessage() for r in caplog.records)


def test_this_hosts_kind_is_what_its_free_huge_pages_allow():
    """No forcing: whatever this host has, the slab says which memory it got."""
    with HostSlab.create({"k": PAYLOADS["k"]}, num_pages=3, num_layers=2) as slab:
        offered = slab_module._memfd_choice(slab.nbytes) is not None
        assert slab.kind in (("hugetlb", "shm") if offered else ("shm",))


def test_the_kind_is_logged_once_per_process(no_huge_pages, monkeypatch, caplog):
    monkeypatch.setattr(slab_module, "_logged_kinds", set())
    with caplog.at_level(logging.INFO, logger="cpkv.tier"):
        for _ in range(3):
            HostSlab.create({"k": PAYLOADS["k"]}, num_pages=2, num_layers=1).close()
    kinds = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cpkv host slab")]
    assert kinds == ["cpkv host slab: POSIX shared memory in /dev/shm (not enough free 2 MiB huge pages)"]


def test_a_failed_reservation_names_payload_bytes_and_path_and_leaves_nothing(no_huge_pages, monkeypatch):
    monkeypatch.setattr(slab_module, "_fallocate", _enospc)
    with pytest.raises(InvalidArgumentError, match=r"payload 'k': cannot reserve 8192 bytes at /dev/shm/") as info:
        HostSlab.create({"k": PAYLOADS["k"]}, num_pages=4, num_layers=32)
    path = SHM_PATH.search(str(info.value)).group(0)
    assert not os.path.exists(path) and path not in shm._owned  # gone, and not left for the exit hook


def test_larger_than_dev_shm_fails_at_once(no_huge_pages):
    st = os.statvfs("/dev/shm")
    pages = st.f_blocks * st.f_frsize // (1 << 20) + 1
    start = time.monotonic()
    with pytest.raises(InvalidArgumentError, match=r"'kv': cannot reserve \d+ bytes at /dev/shm/.*No space left") as info:
        HostSlab.create({"kv": SlabSpec((1 << 19,), torch.bfloat16)}, num_pages=pages, num_layers=1)
    assert time.monotonic() - start < 5
    assert not os.path.exists(SHM_PATH.search(str(info.value)).group(0))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_pages": 0}, InvalidArgumentError, "num_pages must be >= 1, got 0"),
    ({"num_pages": -3}, InvalidArgumentError, "num_pages must be >= 1, got -3"),
    ({"num_pages": 2.5}, InvalidArgumentError, "num_pages must be an int >= 1, got 2.5"),
    ({"num_pages": True}, InvalidArgumentError, "num_pages must be an int >= 1, got True"),
    ({"num_layers": 0}, InvalidArgumentError, "num_layers must be >= 1, got 0"),
    ({"num_layers": "4"}, InvalidArgumentError, "num_layers must be an int >= 1, got '4'"),
    ({"payloads": {}}, InvalidArgumentError, "payloads must be a non-empty mapping"),
    ({"payloads": [("k", PAYLOADS["k"])]}, InvalidArgumentError, "payloads must be a non-empty mapping"),
    ({"payloads": {"": PAYLOADS["k"]}}, UnknownPayloadError, "non-empty strings, got ''"),
    ({"payloads": {3: PAYLOADS["k"]}}, UnknownPayloadError, "non-empty strings, got 3"),
    ({"payloads": {"k": ((4,), torch.bfloat16)}}, InvalidArgumentError, "payload 'k': expected a SlabSpec"),
    ({"timeout_s": 0}, InvalidArgumentError, "timeout_s must be a finite number of seconds in [0.001, 604800], got 0"),
    ({"timeout_s": math.nan}, InvalidArgumentError, "timeout_s must be a finite number of seconds in [0.001, 604800], got nan"),
    ({"pin": "yes"}, InvalidArgumentError, "pin must be True, False or None, got 'yes'"),
    ({"num_pages": 1 << 62}, InvalidArgumentError, "does not fit in an address space"),
])
def test_bad_arguments_are_typed_errors_naming_the_value(kwargs, error, match):
    args = {"payloads": {"k": PAYLOADS["k"]}, "num_pages": 4, "num_layers": 2, **kwargs}
    with pytest.raises(error, match=re.escape(match)):
        HostSlab.create(args.pop("payloads"), **args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_pinning_without_cuda_is_refused():
    with pytest.raises(InvalidArgumentError, match="pin=True but CUDA is not available"):
        HostSlab.create({"k": PAYLOADS["k"]}, num_pages=2, num_layers=1, pin=True)


@pytest.mark.parametrize("page_shape, dtype, match", [
    ((0, 4), torch.bfloat16, "dimension 0 must be >= 1"),
    ((4, -1), torch.bfloat16, "dimension -1 must be >= 1"),
    ((), torch.bfloat16, "at least one dimension"),
    (4, torch.bfloat16, "must be a sequence of positive ints, got 4"),
    ("ab", torch.bfloat16, "must be a sequence of positive ints, got 'ab'"),
    ((2.5,), torch.bfloat16, "dimension 2.5 is not an int"),
    ((True,), torch.bfloat16, "dimension True is not an int"),
    ((4,), torch.complex64, "dtype torch.complex64 is not supported"),
    ((4,), torch.bool, "dtype torch.bool is not supported"),
    ((4,), "bfloat16", "dtype 'bfloat16' is not supported"),
])
def test_bad_slab_specs_are_typed_errors(page_shape, dtype, match):
    with pytest.raises(InvalidArgumentError, match=re.escape(match)):
        SlabSpec(page_shape, dtype)


def test_slab_spec_sizes():
    assert SlabSpec([16, 2, 64], torch.bfloat16).page_shape == (16, 2, 64)
    assert SlabSpec((16, 2, 64), torch.bfloat16).row_bytes == 4096
    assert SlabSpec((16, 3), torch.float8_e4m3fn).row_bytes == 48
    assert SlabSpec((3,), torch.float32) == PAYLOADS["scale"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_failed_pin_is_a_fallback_error_not_a_silent_slow_path(no_huge_pages, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUDA seems present; registering fails
    created: list[str] = []
    monkeypatch.setattr(slab_module, "create_owned", lambda path: (created.append(path), shm.create_owned(path))[1])
    with pytest.raises(FallbackError, match=r"payload 'k': cudaHostRegister of 4096 bytes failed: .*pin=False"):
        HostSlab.create({"k": PAYLOADS["k"]}, num_pages=2, num_layers=1, pin=True)
    assert len(created) == 1 and not os.path.exists(created[0]) and created[0] not in shm._owned
    assert HostSlab.create({"k": PAYLOADS["k"]}, num_pages=2, num_layers=1, pin=False).pinned is False


@pytest.mark.parametrize("in_use", [False, True])
def test_by_default_only_a_process_already_using_cuda_pins(monkeypatch, in_use):
    """A GPU machine (CUDA available) running a CPU-only user: no page-locking, no CUDA context.
    Before the fix the default pinned whenever CUDA was available."""
    registered = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: in_use)
    monkeypatch.setattr(slab_module, "_pin", lambda region: registered.append(region.payload))
    monkeypatch.setattr(slab_module, "_unpin", lambda region: None)
    with HostSlab.create({"k": PAYLOADS["k"]}, num_pages=2, num_layers=1) as slab:
        assert slab.pinned is in_use and registered == (["k"] if in_use else [])
    with HostSlab.create({"k": PAYLOADS["k"]}, num_pages=2, num_layers=1, pin=False) as slab:
        assert slab.pinned is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_regions_are_pinned_for_cuda():
    """Random bytes both ways through pinned regions with asynchronous copies (an all-zero slab would
    pass whatever the copies did); 32 MiB in the large payload, so an unsynchronised read would see
    old bytes."""
    payloads = {**PAYLOADS, "large": SlabSpec((8192,), torch.uint8)}
    with HostSlab.create(payloads, num_pages=2048, num_layers=2, pin=True) as slab:
        assert slab.pinned
        for payload in payloads:
            rows = slab.rows(payload)
            assert rows.is_pinned()
            gen = torch.Generator().manual_seed(len(payload))
            rows.copy_(torch.randint(0, 256, rows.shape, dtype=torch.uint8, generator=gen))
            want = rows.clone()
            device = rows.to("cuda", non_blocking=True)  # host -> device from the pinned slab
            torch.cuda.synchronize()
            assert torch.equal(device.cpu(), want)
            fresh = torch.randint(0, 256, rows.shape, dtype=torch.uint8, device="cuda")
            rows.copy_(fresh, non_blocking=True)  # device -> host into the pinned slab
            torch.cuda.synchronize()
            assert torch.equal(rows, fresh.cpu()) and not torch.equal(rows, want)
