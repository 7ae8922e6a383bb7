"""Smoke test of an installed cpkv wheel (run by ``make test-wheel`` in a fresh virtualenv).

Checks that installing the wheel added only ``cpkv`` and its dist-info to site-packages (argument:
a listing of site-packages taken just before the install), that cpkv comes from the wheel (not the
checkout), that the extension is the abi3 build, that ``cpkv.kernels`` is a package of plain files
inside it, and that a LocalGroup compose through ``cpkv.kernels.gather`` gives the bytes a plain loop
over the plan's spans gives. Not collected by pytest (the name does not start with ``test_``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import sysconfig
import time
from pathlib import Path

started = time.perf_counter()
site = Path(sysconfig.get_paths()["purelib"]).resolve()
before = set(Path(sys.argv[1]).read_text().split())
version = importlib.metadata.version("cpkv")
added = {entry.name for entry in site.iterdir()} - before
assert added == {"cpkv", f"cpkv-{version}.dist-info"}, f"the wheel added {sorted(added)} to {site}"
outside = sorted(str(f) for f in importlib.metadata.files("cpkv") or []
                 if f.parts[0] not in ("cpkv", f"cpkv-{version}.dist-info", ".."))  # "..": the cpkv script
assert not outside, f"the wheel's RECORD lists files outside cpkv: {outside}"
assert importlib.util.find_spec("kernels") is None, "a top-level 'kernels' is importable"

import cpkv  # noqa: E402
import cpkv._cpkv  # noqa: E402
import cpkv.kernels.gather  # noqa: E402

for module in (cpkv, cpkv._cpkv, cpkv.kernels, cpkv.kernels.gather):
    where = Path(module.__file__).resolve()
    assert site in where.parents, f"{module.__name__} comes from {where}, not from the wheel in {site}"
assert cpkv._cpkv.__file__.endswith(".abi3.so"), cpkv._cpkv.__file__
kernel_files = sorted(Path(cpkv.kernels.__file__).parent.glob("*.py"))
assert [f.name for f in kernel_files] == ["__init__.py", "gather.py"], kernel_files
assert not any(f.is_symlink() for f in [*kernel_files, Path(cpkv.kernels.__file__).parent]), kernel_files

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cpkv.compose import ComposePlan, LocalGroup, SlotSpans  # noqa: E402

cp, page_size = 2, 4
requests = [SlotSpans([(0, 0, 3)], [(3, 3, 2)]), SlotSpans([(5, 10, 2)], [])]
plan = ComposePlan(cp, page_size, requests, 8)
gen = torch.Generator().manual_seed(0)
pools = [torch.randint(0, 256, (8, 16), dtype=torch.uint8, generator=gen) for _ in range(cp)]
current = [torch.randint(0, 256, (plan.num_current(r), 16), dtype=torch.uint8, generator=gen) for r in range(cp)]
dense = LocalGroup(cp).compose(plan, pools, current)

# The reference: every slot by hand (page p lives on rank p % cp at row p // cp; current pages are
# each writer's rows in order; unused slots are zero).
want = torch.zeros(8, 16, dtype=torch.uint8)
written = [0] * cp
for request in requests:
    for slot, page, count in request.prefix:
        for i in range(count):
            want[slot + i] = pools[(page + i) % cp][(page + i) // cp]
for request in requests:
    for slot, page, count in request.current:
        for i in range(count):
            owner = (page + i) % cp
            want[slot + i] = current[owner][written[owner]]
            written[owner] += 1
for rank in range(cp):
    assert torch.equal(dense[rank], want), rank
assert isinstance(cpkv.PrefixTree(page_size, "lru"), cpkv.PrefixTree)
assert np.array_equal(plan.current_pages(0), [4])

# The cluster tier's store (the `cluster` extra, Mooncake Store; here the dev venv's copy, through
# the .pth, when it has one): its store module loads and its master program runs.
import subprocess  # noqa: E402

from cpkv.tier.cluster import mooncake  # noqa: E402

assert site in Path(mooncake.__file__).resolve().parents, mooncake.__file__
if importlib.util.find_spec("mooncake") is not None:
    assert mooncake.store_class().__name__ == "MooncakeDistributedStore"
    shown = subprocess.run([mooncake.program("mooncake_master"), "--help"], capture_output=True, text=True, timeout=60)
    assert "enable_http_metadata_server" in shown.stdout + shown.stderr, (shown.stdout + shown.stderr)[-500:]
    cluster = "Mooncake Store's mooncake.store and mooncake_master --help work"
else:
    cluster = "Mooncake Store not installed here: the cluster tier's check skipped"

print(f"wheel smoke test passed in {time.perf_counter() - started:.2f} s "
      f"(cpkv {cpkv.__version__} from {Path(cpkv.__file__).parent}, Python {sys.version.split()[0]}; {cluster})")
