"""Batch admission for CP prefill: warm/cold affinity and chunked-prefill budgeting.

Every decision is a pure function of replicated inputs (the queue, each
request's prefix match, the scan state), so every CP rank forms the same batch.

Concepts, one per file: :mod:`~cpkv.scheduling.candidate` (a waiting request
and its match), :mod:`~cpkv.scheduling.classify` (warm or cold),
:mod:`~cpkv.scheduling.affinity` (the decision table and its bounds),
:mod:`~cpkv.scheduling.budget` (extend, cached-token and staging caps),
:mod:`~cpkv.scheduling.backup` (the backup floor rule),
:mod:`~cpkv.scheduling.scan` (``form_batch`` and the scan state), and
:mod:`~cpkv.scheduling.sim` (``cpkv schedsim``, a trace replay).

An engine's scheduling loop, one pass per forward:

>>> from cpkv.scheduling import (AffinityPolicy, BudgetConfig, Candidate, ScanState,
...                              backup_range, form_batch)
>>> policy = AffinityPolicy(floor_tokens=64, cp_mode=True)
>>> budget = BudgetConfig(page_size=64, extend_cap=1024, staging_pages=17, mixing=True)
>>> queue = [Candidate(1, device_hit=4096, host_hit=0, extend_tokens=100),   # warm
...          Candidate(2, device_hit=0, host_hit=0, extend_tokens=3000),     # cold, long
...          Candidate(3, device_hit=1024, host_hit=512, extend_tokens=50)]  # warm
>>> state, chunked, backed_up = ScanState(), None, {}
>>> while queue or chunked is not None:
...     step = form_batch(queue, state, policy, budget, chunked=chunked)
...     # ... run the forward on step.batch, then back up each request's new
...     # pages, telling the floor rule whether this was its last chunk:
...     for a in step.batch:
...         r = backup_range(backed_up_tokens=backed_up.get(a.request_id, a.cached_tokens // 64 * 64),
...                          computed_tokens=a.cached_tokens + a.extend_tokens,
...                          page_size=64, is_final=a.is_final)
...         backed_up[a.request_id] = r.end_token
...         print(a.request_id, a.role.value, a.extend_tokens, (r.start_token, r.end_token), end="; ")
...     print(step.stop and step.stop.value)
...     queue = [c for c in queue if c.request_id not in step.taken_from_queue]
...     state, chunked = step.state, step.carried
1 whole 100 (4096, 4196); 3 whole 50 (1536, 1586); None
2 intermediate 1024 (0, 1024); started a chunk
2 intermediate 1024 (1024, 2048); batch budget full
2 final 952 (2048, 3000); batch budget full

The cold request 2 was skipped by the warm-led first batch, then led its own.
"""

from cpkv.scheduling.affinity import Action, AffinityPolicy, BatchClass, Bounds, Decision, Reason, decide
from cpkv.scheduling.backup import BackupRange, backup_range
from cpkv.scheduling.budget import Budget, BudgetConfig, Fit, FitKind
from cpkv.scheduling.candidate import Candidate
from cpkv.scheduling.classify import DEFAULT_FLOOR_TOKENS, RequestClass, classify
from cpkv.scheduling.scan import Admission, ChunkRole, Pass, ScanState, Step, form_batch

__all__ = [
    "Action",
    "Admission",
    "AffinityPolicy",
    "BackupRange",
    "BatchClass",
    "Bounds",
    "Budget",
    "BudgetConfig",
    "Candidate",
    "ChunkRole",
    "DEFAULT_FLOOR_TOKENS",
    "Decision",
    "Fit",
    "FitKind",
    "Pass",
    "Reason",
    "RequestClass",
    "ScanState",
    "Step",
    "backup_range",
    "classify",
    "decide",
    "form_batch",
]
