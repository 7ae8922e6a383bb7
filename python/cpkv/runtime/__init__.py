"""What several rooms share: processes, time and shared memory, none of it a replicated decision.

- :mod:`~cpkv.runtime.layout`: :class:`CpLayout`, which rank owns a logical page and at which row
  (the rule itself is computed in the Rust core);
- :mod:`~cpkv.runtime.timeouts`: the one timeout rule (finite, in range, named), and a failed or stalled
  collective becomes an error naming rank and layer;
- :mod:`~cpkv.runtime.agree`: the one cross-rank digest agreement (all 64 bits, one MIN all-reduce,
  the timeout rule above), used by the cache controller and the compose groups;
- :mod:`~cpkv.runtime.gloo_group`: a gloo group over a process group's ranks (host values beside NCCL);
- :mod:`~cpkv.runtime.memory`: the one limit on host memory a buffer may ask for, checked before allocating;
- :mod:`~cpkv.runtime.shm`: shared-memory hygiene, no /dev/shm name left behind by any exit;
- :mod:`~cpkv.runtime.segment`: a /dev/shm segment mapped as a tensor (ShmGroup's memory);
- :mod:`~cpkv.runtime.launch`: ``run_ranks``, cp real processes in a gloo group (tests, benchmarks,
  ``cpkv replay``).

The compose path (:mod:`cpkv.compose`) and the two-tier cache (:mod:`cpkv.tier`) both build on these;
none of them imports either.
"""
