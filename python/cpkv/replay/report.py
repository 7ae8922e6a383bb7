"""The replay's report: one table, the same numbers as JSON, exit code 1 on a wrong byte."""

from __future__ import annotations

from typing import Any

from cpkv.replay.options import ReplayOptions


def report(options: ReplayOptions, requests: list[tuple[int, ...]], results: list[dict], wall_s: float,
           json_path: str | None) -> int:
    from cpkv._report import Table, emit
    from cpkv.hitrate import replay as tree_only

    first = results[0]
    digests = {r["digest"] for r in results}
    failures = sum(r["verification_failures"] for r in results)
    blocks = first["blocks"]
    no_host_hits, total = tree_only(requests, options.device_pages, options.policy)
    forwards = max(first["forwards"], 1)
    tokens = blocks * options.page_size

    def total_of(key: str) -> int:
        return sum(r[key] for r in results)

    devices = sorted({r["device"] for r in results})
    where = "" if options.device == "cpu" else f" on {', '.join(devices)}"
    table = Table(f"cpkv replay: {options.ranks} ranks{where}, {len(requests):,} requests, policy {options.policy}, "
                  f"{options.device_pages} device / {options.host_pages} host pages", ["metric", "value"])
    rows: list[tuple[str, Any]] = [
        ("requests", len(requests)),
        ("blocks (pages) / tokens", f"{blocks:,} / {tokens:,}"),
        ("forwards", first["forwards"]),
        ("prefix hit rate: device", first["device_hit_blocks"] / blocks),
        ("prefix hit rate: host", first["host_hit_blocks"] / blocks),
        ("prefix hit rate: total", (first["device_hit_blocks"] + first["host_hit_blocks"]) / blocks),
        ("prefix hit rate with no host tier", no_host_hits / total),
        ("device evictions (victims / pages)", f"{first['device_victims']:,} / {first['device_evicted_pages']:,}"),
        ("host evictions (victims / pages)", f"{first['host_victims']:,} / {first['host_evicted_pages']:,}"),
        ("backups committed / skipped", f"{first['backups_committed']:,} / {first['backups_skipped']:,}"),
        ("MB composed (all ranks)", total_of("composed_bytes") / 1e6),
        ("MB backed up (all ranks)", total_of("bytes_backed_up") / 1e6),
        ("MB loaded (all ranks)", total_of("bytes_loaded") / 1e6),
        ("collectives per forward (commit + check)", first["collectives"] / forwards),
        ("compose barriers per forward", first["compose_barriers"] / forwards),
        ("agreement checks passed", first["agreement_checks"]),
        ("verification failures (pages)", failures),
        ("final digest", f"{first['digest']:#018x}" + ("" if len(digests) == 1 else " (ranks differ!)")),
        ("wall time (s)", wall_s),
        ("ms per forward (slowest rank)", max(r["forward_s"] for r in results) / forwards * 1e3),
        ("compose GB/s per rank", _rate(results, "compose_timed_bytes", "compose_s")),
        ("ms in compose barriers per forward (slowest rank)", max(r["barrier_s"] for r in results) / forwards * 1e3),
        ("backup GB/s per rank", _rate(results, "backup_copy_bytes", "backup_copy_ns", 1e-9)),
        ("load-back GB/s per rank", _rate(results, "load_copy_bytes", "load_copy_ns", 1e-9)),
        ("requests / s", len(requests) / wall_s),
        ("tokens / s", tokens / wall_s),
    ]
    l3: dict[str, Any] = {}
    if options.l3_dir is not None:
        # Replicated counts from rank 0; pages written and read are each rank's share, summed.
        l3 = {"hit_rate_l3": first["l3_hit_blocks"] / blocks,
              "l3_pages_written": total_of("l3_pages_written"), "l3_pages_read": total_of("l3_pages_read"),
              "l3_pages_written_in_place": total_of("l3_pages_written_in_place"),
              "l3_pages_read_in_place": total_of("l3_pages_read_in_place"),
              "l3_corrupt_dropped": first["l3_corrupt_dropped"],
              "l3_recovered_pages": first["l3_recovered_pages"],
              "l3_recovery_s": max(r["l3_recovery_s"] for r in results),
              "l3_pages_spilled_at_stop": first["l3_pages_spilled_at_stop"],
              "l3_disk_bytes": first["l3_disk_bytes"], "l3_cap_bytes": first["l3_cap_bytes"]}
        at = [name for name, _ in rows].index("prefix hit rate with no host tier")
        rows[at:at] = [
            ("prefix hit rate: L3", l3["hit_rate_l3"]),
            ("prefix hit rate: total with L3",
             (first["device_hit_blocks"] + first["host_hit_blocks"] + first["l3_hit_blocks"]) / blocks),
        ]
        at = [name for name, _ in rows].index("MB composed (all ranks)")
        rows[at:at] = [
            ("L3 pages written / read (all ranks)", f"{l3['l3_pages_written']:,} / {l3['l3_pages_read']:,}"),
            ("L3 pages of those moved in place (no copy)",
             f"{l3['l3_pages_written_in_place']:,} / {l3['l3_pages_read_in_place']:,}"),
            ("L3 records dropped as corrupt", l3["l3_corrupt_dropped"]),
            ("L3 recovery: pages / ms (slowest rank)",
             f"{l3['l3_recovered_pages']:,} / {l3['l3_recovery_s'] * 1e3:.1f}"),
            ("L3 pages placed at the clean stop", l3["l3_pages_spilled_at_stop"]),
            ("L3 disk MB / cap MB", f"{l3['l3_disk_bytes'] / 1e6:.1f} / {l3['l3_cap_bytes'] / 1e6:.1f}"),
        ]
    cluster: dict[str, Any] = {}
    if options.cluster_master is not None:
        # Replicated counts from rank 0 (hits, availability); puts, reads and corrupt records are each
        # rank's own, summed.
        cluster = {"hit_rate_cluster": first["cluster_hit_blocks"] / blocks,
                   "cluster_pages_put": total_of("cluster_pages_put"),
                   "cluster_pages_read": total_of("cluster_pages_read"),
                   "cluster_corrupt_dropped": total_of("cluster_corrupt_dropped"),
                   "cluster_unavailable_s": max(r["cluster_unavailable_s"] for r in results),
                   "cluster_unavailable_marks": first["cluster_unavailable_marks"],
                   "cluster_reattaches": first["cluster_reattaches"]}
        at = [name for name, _ in rows].index("prefix hit rate with no host tier")
        rows[at:at] = [
            ("prefix hit rate: cluster", cluster["hit_rate_cluster"]),
            ("prefix hit rate: total with the cluster",
             (first["device_hit_blocks"] + first["host_hit_blocks"] + first.get("l3_hit_blocks", 0)
              + first["cluster_hit_blocks"]) / blocks),
        ]
        at = [name for name, _ in rows].index("MB composed (all ranks)")
        rows[at:at] = [
            ("cluster pages put / read (all ranks)",
             f"{cluster['cluster_pages_put']:,} / {cluster['cluster_pages_read']:,}"),
            ("cluster records dropped as corrupt", cluster["cluster_corrupt_dropped"]),
            ("cluster tier unavailable: times / seconds",
             f"{cluster['cluster_unavailable_marks']} / {cluster['cluster_unavailable_s']:.2f}"),
        ]
    for name, value in rows:
        table.add(name, value)
    numbers = dict(rows)
    numbers.update(l3)
    numbers.update(cluster)
    numbers["verified_bytes"] = total_of("verified_bytes")
    numbers["composed_bytes"] = total_of("composed_bytes")
    emit("replay", [table], json_path, report=numbers, per_rank=results)
    return 1 if failures or len(digests) != 1 else 0


def _rate(results: list[dict], bytes_key: str, time_key: str, seconds_per_unit: float = 1.0) -> float:
    """GB/s of one kind of copy, all ranks' bytes over all ranks' time in it (a rank's own rate,
    weighted by its bytes; ranks on one GPU share it, so the GPU moved up to ranks times this).
    0.0 when nothing was copied."""
    seconds = sum(r[time_key] for r in results) * seconds_per_unit
    return sum(r[bytes_key] for r in results) / seconds / 1e9 if seconds > 0 else 0.0
