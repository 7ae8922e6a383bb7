"""cpkv.tier.l3.L3Store in one process: warm restart, the record checks under injected faults
(bit flips, truncation, torn 4 KiB writes, a slot reused under a reader, a namespace change: every
one a counted miss, no wrong page), disk bytes within the cap at every sample, typed refusals."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cpkv import _cpkv
from cpkv.errors import DuplicateKeyError, InvalidArgumentError
from cpkv.tier.l3 import L3Store, disk_bytes
from l3_pages import PAGE_BYTES, namespace, page

CAP = 64 * 4096 + 64 * 1024  # about 64 slots of 4 KiB records


def open_store(path, cap=CAP, ns=None, **kw) -> L3Store:
    return L3Store(path, cap, ns or namespace(), **kw)


def fill(store: L3Store, keys) -> None:
    store.put([(k, page(k)) for k in keys])


def served_exactly(store: L3Store, key: int) -> bool | None:
    """True: served with the right bytes; None: a miss; a wrong page fails the test."""
    got = store.get(key)
    if got is None:
        return None
    assert np.array_equal(got, page(key)), f"wrong bytes served for key {key}"
    return True


def slot_path_offset(store: L3Store, key: int) -> tuple[str, int]:
    slot, _ = store.index.peek(key)
    return (str(store.directory / f"data-{slot // store.slots_per_file}.bin"),
            (slot % store.slots_per_file) * store.slot_bytes)


def test_pages_round_trip_and_a_restart_is_warm(tmp_path):
    with open_store(tmp_path) as store:
        keys = list(range(1, store.slots + 1))
        for i in range(0, len(keys), 7):
            fill(store, keys[i:i + 7])
        digest = store.digest()
        assert all(served_exactly(store, k) for k in keys)
        assert store.stats()["mode"] in ("o_direct", "buffered")
    with open_store(tmp_path) as again:
        assert again.recovery["kept"] == len(keys)
        assert again.index.entries() == [(k, i, i + 1) for i, k in enumerate(keys)]
        assert all(served_exactly(again, k) for k in keys)
        assert digest != 0


def test_eviction_under_the_cap_is_least_recently_used(tmp_path):
    with open_store(tmp_path) as store:
        n = store.slots
        fill(store, range(n))
        assert served_exactly(store, 0)  # key 0 used: key 1 is now the oldest
        placed = store.put([(10_000, page(10_000))])
        assert placed[0][3] == 1
        assert store.get(1) is None and served_exactly(store, 0) and served_exactly(store, 10_000)


def _flip(path: str, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


@pytest.mark.parametrize("part, where, reason", [
    ("payload", 0, "checksum"), ("payload", 100, "checksum"), ("payload", PAGE_BYTES - 1, "checksum"),
    ("header", 0, "bad_magic"), ("header", 9, "version"), ("header", 13, "reserved"),
    ("header", 20, "foreign_namespace"), ("header", 27, "wrong_key"), ("header", 33, "stale_sequence"),
    ("header", 41, "length"), ("header", 49, "checksum"), ("header", 55, "reserved")])
def test_a_bit_flip_anywhere_is_a_counted_miss(tmp_path, part, where, reason):
    with open_store(tmp_path) as store:
        fill(store, range(1, 9))
        path, offset = slot_path_offset(store, 5)
        before = store.digest()
        header_at = store.slot_bytes - _cpkv.L3_HEADER_BYTES  # the header is the record's last bytes
        _flip(path, offset + where + (header_at if part == "header" else 0))
        assert served_exactly(store, 5) is None
        assert store.stats()["corrupt_dropped"] == 1 and store.rejects == {reason: 1}
        assert store.digest() != before and store.index.peek(5) is None
        assert all(served_exactly(store, k) for k in (1, 2, 3, 4, 6, 7, 8))
    with open_store(tmp_path) as again:  # the tombstone keeps the dropped page dropped
        assert again.index.peek(5) is None and again.recovery["kept"] == 7


def test_a_truncated_data_file_is_a_miss_and_reopening_restores_its_size(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, range(1, 9))
        path, offset = slot_path_offset(store, 8)
        os.truncate(path, offset + 100)
        assert served_exactly(store, 8) is None and store.rejects == {"truncated": 1}
        assert all(served_exactly(store, k) for k in range(1, 8))


def test_a_torn_write_is_a_miss(tmp_path):
    big = namespace(page_bytes=3 * 4096)  # records of four 4 KiB blocks
    with L3Store(tmp_path, 1 << 20, big) as store:
        store.put([(1, page(1, big.page_bytes))])
        path, offset = slot_path_offset(store, 1)
        found = store.index.peek(1)
        with open(path, "rb") as f:
            original = (f.seek(offset), f.read(store.slot_bytes))[1]

        def torn(record: np.ndarray, blocks: int, head: bool) -> str | None:
            """The slot with the first ``blocks`` blocks of ``record`` (``head``) or the rest of it, the
            other blocks as before; the reason the read gives, then the slot restored."""
            part = slice(0, blocks * 4096) if head else slice(blocks * 4096, store.slot_bytes)
            with open(path, "r+b") as f:
                f.seek(offset + part.start)
                f.write(record[part].tobytes())
            reason = store.last_reject if store.read(1, *found) is None else None
            with open(path, "r+b") as f:
                f.seek(offset)
                f.write(original)
            assert np.array_equal(store.read(1, *found), page(1, big.page_bytes))
            return reason

        for other_key, sequence in ((2, 99), (1, found[1])):  # another key; this key, other bytes
            other = np.zeros(store.slot_bytes, dtype=np.uint8)
            other[:big.page_bytes] = page(2, big.page_bytes)
            _cpkv.l3_seal(other, store.namespace_id, other_key, sequence, big.page_bytes)
            for torn_blocks in (1, 2, 3):
                # A newer record's payload blocks over the old record: its header stays, the CRC fails.
                assert torn(other, torn_blocks, head=True) == "checksum"
                # The newer record's last blocks (its header) over the old payload.
                assert torn(other, torn_blocks, head=False) == ("wrong_key" if other_key == 2 else "checksum")


@pytest.mark.parametrize("direct", [True, False])
def test_pages_in_aligned_memory_move_in_place_with_the_same_records_as_a_copy(tmp_path, direct):
    """Pages of whole blocks in page-aligned memory (as slab rows are) are written from and read into
    their own memory; the records on disk are byte for byte those of the copying path, every read
    path serves exact bytes, and a damaged or cut record read in place is a counted miss."""
    from cpkv.tier.l3.direct import aligned_empty

    ns = namespace(page_bytes=2 * 4096)
    keys = list(range(1, 9))
    rows = aligned_empty(len(keys), ns.page_bytes)
    for j, key in enumerate(keys):
        rows[j] = page(key, ns.page_bytes)
    (tmp_path / "copied").mkdir()
    (tmp_path / "in_place").mkdir()
    with L3Store(tmp_path / "copied", 1 << 20, ns, direct=direct) as copied, \
            L3Store(tmp_path / "in_place", 1 << 20, ns, direct=direct) as in_place:
        copied.put([(key, np.array(rows[j])) for j, key in enumerate(keys)])  # heap copies: unaligned
        in_place.put([(key, rows[j]) for j, key in enumerate(keys)])
        assert in_place.stats()["pages_written_in_place"] == len(keys)
        assert copied.stats()["pages_written_in_place"] == (0 if direct else len(keys))
        assert (tmp_path / "copied" / "data-0.bin").read_bytes() == (tmp_path / "in_place" / "data-0.bin").read_bytes()
        found = [(key, *in_place.lookup(key)) for key in keys]
        out = aligned_empty(len(keys), ns.page_bytes)
        assert in_place.read_many(found[::-1], out) == [None] * len(keys)
        assert in_place.stats()["pages_read_in_place"] == len(keys)
        assert np.array_equal(out, rows[::-1])
        kept = np.zeros_like(out)
        assert in_place.read_many(found, kept, keep_records=True) == [None] * len(keys)
        assert np.array_equal(kept, rows) and in_place.stats()["pages_read_in_place"] == len(keys)
        path, offset = slot_path_offset(in_place, 3)
        _flip(path, offset + 5000)
        os.truncate(path, slot_path_offset(in_place, 8)[1] + in_place.slot_bytes - 1)
        out[:] = 0
        reasons = in_place.read_many(found, out)
        assert reasons == [None, None, "checksum", None, None, None, None, "truncated"]
        assert all(np.array_equal(out[j], rows[j]) for j in range(len(keys)) if reasons[j] is None)


def test_a_slot_reused_under_a_reader_is_a_miss(tmp_path):
    with open_store(tmp_path) as reader_side, open_store(tmp_path, rank=0) as writer_side:
        fill(reader_side, range(reader_side.slots))
        fill(writer_side, range(reader_side.slots))
        found = reader_side.lookup(0)
        # Another handle evicts key 0 and reuses its slot before the reader reads it.
        placed = writer_side.put([(777, page(777))])
        assert placed[0][1] == found[0] and placed[0][3] == 0
        assert reader_side.read(0, *found) is None and reader_side.last_reject == "wrong_key"


def test_a_namespace_change_serves_nothing_of_the_old_one(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, range(1, 9))
    with open_store(tmp_path, ns=namespace(dtype="bfloat16")) as other:
        assert other.recovery["foreign_logs"] == 1 and len(other.index) == 0
        assert all(other.get(k) is None for k in range(1, 9))
        # A record of the old namespace in a slot the new index names is refused by its header (once
        # the placement's write is done: before, a failed check is a transient miss).
        other.index.place([1])
        other.order.give_up(*other.index.peek(1))
        assert other.read(1, *other.index.peek(1)) is None and other.last_reject == "foreign_namespace"
    with open_store(tmp_path, ns=namespace(dtype="bfloat16")) as again:
        assert len(again.index) == 0  # the log was restarted for the new namespace


def test_a_torn_log_tail_keeps_the_entries_before_it(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, range(1, 6))
        fill(store, range(6, 9))
    log = tmp_path / "index-r0.log"
    whole = log.stat().st_size
    with open(log, "ab") as f:
        f.write(b"\x07" * 20)  # half an entry
    with open_store(tmp_path) as again:
        assert again.recovery["kept"] == 8 and log.stat().st_size == whole
    with open(log, "r+b") as f:  # a flipped bit in the 7th entry: entries 7 and 8 are lost, 1..6 kept
        f.seek(_cpkv.L3_LOG_HEADER_BYTES + 6 * 32 + 3)
        f.write(b"\xff")
    with open_store(tmp_path) as again:
        assert [k for k, _, _ in again.index.entries()] == [1, 2, 3, 4, 5, 6]
        assert all(served_exactly(again, k) for k in range(1, 7))


def test_disk_bytes_stay_within_the_cap_at_every_sample(tmp_path):
    rng = np.random.default_rng(5)
    with open_store(tmp_path) as store:
        batch_bytes = 8 * store.slot_bytes
        for step in range(300):  # many evictions and several log compactions
            base = 1000 * step
            fill(store, [base + i for i in range(int(rng.integers(1, 9)))])
            assert disk_bytes(tmp_path) <= CAP + batch_bytes
        assert store.counters["compactions"] >= 3
        store.index.check_invariants()
        live = [k for k, _, _ in store.index.entries()]
        assert len(live) == store.slots
    with open_store(tmp_path) as again:
        assert [k for k, _, _ in again.index.entries()] == live
        assert all(served_exactly(again, k) for k in live)


def test_a_smaller_cap_gives_the_blocks_back(tmp_path):
    with open_store(tmp_path, cap=4 * CAP) as store:
        fill(store, range(1, 40))
    with open_store(tmp_path, cap=CAP // 2) as small:
        assert disk_bytes(tmp_path) <= CAP // 2
        assert len(small.index) == 0 and small.recovery["foreign_logs"] == 1


def test_bad_inputs_are_typed_and_change_nothing(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, [1])
        before = store.digest()
        with pytest.raises(DuplicateKeyError, match="0x0000000000000005"):
            store.put([(5, page(5)), (5, page(5))])
        with pytest.raises(InvalidArgumentError, match="does not fit the store's"):
            fill(store, range(100, 100 + store.slots + 1))
        with pytest.raises(InvalidArgumentError, match="page 0x9 has 10 bytes"):
            store.put([(9, b"x" * 10)])
        assert store.digest() == before
    with pytest.raises(InvalidArgumentError, match="holds no page"):
        open_store(tmp_path, cap=4096)
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        open_store(tmp_path / "absent")
    with pytest.raises(InvalidArgumentError, match="rank 2 is not below ranks_on_node 2"):
        open_store(tmp_path, rank=2, ranks_on_node=2)


def test_buffered_mode_is_said(tmp_path):
    with open_store(tmp_path, direct=False) as store:
        fill(store, [1])
        assert store.stats()["mode"] == "buffered" and store.stats()["mode_reason"]
        assert served_exactly(store, 1)


def test_a_file_system_that_refuses_o_direct_falls_back_to_buffered_and_says_why(tmp_path, monkeypatch):
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing_open)
    with open_store(tmp_path) as store:
        fill(store, [1, 2])
        stats = store.stats()
        assert stats["mode"] == "buffered" and "O_DIRECT refused by the file system (EINVAL)" in stats["mode_reason"]
        assert served_exactly(store, 1) and served_exactly(store, 2)


def test_a_batch_read_serves_the_good_pages_and_names_the_bad_one(tmp_path):
    with open_store(tmp_path) as store:
        keys = list(range(1, 11))
        fill(store, keys)
        path, offset = slot_path_offset(store, 4)
        _flip(path, offset + 7)
        found = [(k, *store.lookup(k)) for k in reversed(keys)]  # out of slot order
        out = np.zeros((len(found), PAGE_BYTES), dtype=np.uint8)
        reasons = store.read_many(found, out)
        for (key, _, _), reason, row in zip(found, reasons, out):
            if key == 4:
                assert reason == "checksum" and not row.any()
            else:
                assert reason is None and np.array_equal(row, page(key))
        assert store.counters["pages_read"] == 9
        with pytest.raises(InvalidArgumentError, match="out holds"):
            store.read_many(found, out[:3])
        with pytest.raises(InvalidArgumentError, match="C-contiguous"):
            store.read_many(found[:5], out[::2])


def test_named_writers_own_their_records_through_compaction_and_a_restart(tmp_path):
    """Two ranks of a node, each page's writer named by the caller (the opposite of the index's own
    rule, as the SGLang backend names a slab row's writer), the other rank given no bytes (None):
    each record is written once, by its named writer; each log keeps its own records through
    compactions; a restart recovers every live page, byte-exact."""
    ranks = [open_store(tmp_path, rank=r, ranks_on_node=2) for r in range(2)]
    slots = ranks[0].slots
    key = 1
    for _ in range(5 * slots // 4):  # more placements than 2 x slots log entries: compactions on both
        batch = list(range(key, key + 4))
        key += 4
        writers = [1 - ranks[0].index.writer(k) for k in batch]
        for r, store in enumerate(ranks):
            store.put([(k, page(k) if w == r else None) for k, w in zip(batch, writers)], writers=writers)
    assert all(s.counters["compactions"] > 0 for s in ranks)
    assert ranks[0].digest() == ranks[1].digest()
    assert sum(s.counters["pages_written"] for s in ranks) == key - 1  # each page once per node
    live = [k for k, _, _ in ranks[0].index.entries()]
    for s in ranks:
        s.close()
    again = open_store(tmp_path, rank=0, ranks_on_node=2)
    assert again.recovery["kept"] == len(live) == slots
    assert all(served_exactly(again, k) for k in live)
    again.close()


def test_a_page_without_bytes_is_placed_but_never_served(tmp_path):
    """A writer with no bytes for a page (None) places it like its peers and writes nothing: the slot
    keeps its older record, whose key and sequence fail the check, a counted miss."""
    store = open_store(tmp_path)
    fill(store, range(1, store.slots + 1))  # every slot holds a record
    store.put([(10_000, None)])  # evicts the least recently used page, writes nothing
    assert store.index.peek(10_000) is not None
    assert store.get(10_000) is None and store.counters["corrupt_dropped"] == 1
    with pytest.raises(InvalidArgumentError, match="writers"):
        store.put([(20_000, page(20_000))], writers=[2])
    assert store.index.peek(20_000) is None
    store.close()


def test_the_batch_record_calls_refuse_bad_arguments_and_write_nothing():
    """l3_seal_tails / l3_check_split / l3_seal_records name what is wrong and leave their output
    untouched; a batch seals the records that sealing one at a time gives."""
    length, tail = 8192, 4096
    payloads = [np.full(length, 3, dtype=np.uint8), np.full(length, 4, dtype=np.uint8)]
    tails = np.full(2 * tail, 0xEE, dtype=np.uint8)
    for bad_payloads, bad_tails, named in ((payloads[:1] + [payloads[1][:100]], tails, "payload 1 has 100 bytes"),
                                           (payloads, tails[:tail], "tails holds 4096 bytes")):
        with pytest.raises(InvalidArgumentError, match=named):
            _cpkv.l3_seal_tails(bad_tails, bad_payloads, 1, [1, 2], [1, 1], length)
        assert (tails == 0xEE).all()
    with pytest.raises(InvalidArgumentError, match="differ in length"):
        _cpkv.l3_seal_tails(tails, payloads, 1, [1], [1, 1], length)
    _cpkv.l3_seal_tails(tails, payloads, 1, [1, 2], [5, 6], length)
    out = np.concatenate(payloads)
    assert _cpkv.l3_check_split(tails, out, [0, 1], [True, True], 1, [1, 2], [5, 6], length) == [None, None]
    assert _cpkv.l3_check_split(tails, out, [1, 0], [True, False], 1, [1, 2], [5, 6], length) == ["checksum",
                                                                                                  "truncated"]
    with pytest.raises(InvalidArgumentError, match="row 2 is outside out"):
        _cpkv.l3_check_split(tails, out, [0, 2], [True, True], 1, [1, 2], [5, 6], length)
    with pytest.raises(InvalidArgumentError, match="differ in length"):
        _cpkv.l3_check_split(tails, out, [0, 1], [True], 1, [1, 2], [5, 6], length)
    # Whole records in one call: the same bytes as sealing each in turn, and the same tails.
    records = np.full(2 * (length + tail), 0xEE, dtype=np.uint8)
    with pytest.raises(InvalidArgumentError, match="records holds"):
        _cpkv.l3_seal_records(records[:-1], payloads, 1, [1, 2], [5, 6], length)
    assert (records == 0xEE).all()
    _cpkv.l3_seal_records(records, payloads, 1, [1, 2], [5, 6], length)
    for j, (key, sequence) in enumerate(((1, 5), (2, 6))):
        one = np.zeros(length + tail, dtype=np.uint8)
        one[:length] = payloads[j]
        _cpkv.l3_seal(one, 1, key, sequence, length)
        assert np.array_equal(records[j * (length + tail):(j + 1) * (length + tail)], one)
        assert np.array_equal(one[length:], tails[j * tail:(j + 1) * tail])


def test_disk_bytes_skips_a_file_another_rank_renames_between_listing_and_stat(tmp_path, monkeypatch):
    # Ranks share a node's directory: a compaction's temporary file can be renamed away after
    # scandir lists it and before its stat (found by CI in SGLang's skew test: FileNotFoundError).
    (tmp_path / "kept").write_bytes(b"x" * 8192)
    (tmp_path / "index-r1.tmp").write_bytes(b"y" * 4096)
    real_scandir = os.scandir

    class ListedThenRenamed:
        def __enter__(self):
            with real_scandir(tmp_path) as it:
                entries = list(it)
            (tmp_path / "index-r1.tmp").unlink()
            return iter(entries)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(os, "scandir", lambda _path: ListedThenRenamed())
    assert disk_bytes(tmp_path) == os.stat(tmp_path / "kept").st_blocks * 512
