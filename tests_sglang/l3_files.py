"""What the SGLang L3 tests share: a copy of a filled directory, the agreement-and-bytes check of a
run, and a pool store's live records read from its logs (as recovery reads them) to damage them."""

from __future__ import annotations

import shutil
from pathlib import Path


def copy_filled(filled: tuple[Path, list[dict]], tmp_path: Path) -> Path:
    """A copy of a module fixture's filled L3 directory, for a test to restart on (or damage)."""
    target = tmp_path / "l3"
    shutil.copytree(filled[0], target)
    return target


def check_agreed_and_exact(results: list[dict]) -> None:
    """Every rank's hit count before SGLang's MIN is the same, and every page loaded is exact (its KV
    bytes, and its sidecar's where the model has one)."""
    pre = [[f["pre"] for f in res["fetched"]] for res in results]
    assert all(p == pre[0] for p in pre), pre
    for res in results:
        for f in res["fetched"]:
            assert f["wrong"] == 0 and f.get("sidecar_wrong", 0) == 0, f


def live_records(pool_dir: Path, ranks: int, log_ranks: int | None = None) -> tuple[int, list[tuple[int, int, int]], int]:
    """(namespace, live (key, slot, sequence) entries, slot bytes) of one pool's store, from the logs
    of its first ``log_ranks`` ranks (all ``ranks`` by default); every log must be whole."""
    from cpkv import _cpkv

    logs = [(pool_dir / f"index-r{r}.log").read_bytes() for r in range(ranks if log_ranks is None else log_ranks)]
    namespace, slot_bytes, slots = (int.from_bytes(logs[0][at:at + 8], "little") for at in (16, 24, 32))
    index, _, valid = _cpkv.L3Index.recover(slots, ranks, logs, namespace, slot_bytes)
    assert valid == [len(log) for log in logs]
    return namespace, sorted(index.entries()), slot_bytes


def lost_records(pool_dir: Path, ranks: int, page_bytes: int) -> tuple[int, int]:
    """(records one pool's logs name, how many of them fail their check on disk): every record named
    by the node's logs (recovered as a restart would) is read and checked."""
    import numpy as np

    from cpkv import _cpkv

    namespace, entries, slot_bytes = live_records(pool_dir, ranks)
    lost = 0
    with open(pool_dir / "data-0.bin", "rb") as f:
        for key, slot, sequence in entries:
            f.seek(slot * slot_bytes)  # one data file: the stores are tiny
            record = np.frombuffer(f.read(slot_bytes), dtype=np.uint8)
            lost += _cpkv.l3_check(record, namespace, key, sequence, page_bytes) is not None
    return len(entries), lost


def damage(pool_dir: Path, records: int, ranks: int = 2) -> int:
    """Flips one payload byte in each of the first ``records`` of rank 0's live records in one pool's
    store (a store of ``ranks`` ranks, one data file); returns how many."""
    _, entries, slot_bytes = live_records(pool_dir, ranks, log_ranks=1)
    with open(pool_dir / "data-0.bin", "r+b") as f:
        for _key, slot, _seq in entries[:records]:
            at = slot * slot_bytes + 7
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
    return min(records, len(entries))
