"""The cluster tier: pages shared by every instance through Mooncake Store, below the node's tiers.

- :mod:`cpkv.tier.cluster.mooncake`: Mooncake's programs and a client whose every call is bounded.
- :mod:`cpkv.tier.cluster.local`: a local cluster (master + one store server) for trying it and tests.
- :mod:`cpkv.tier.cluster.tier`: :class:`ClusterTier`, one rank's reads and writes of checked records.
- :mod:`cpkv.tier.cluster.pages`: the engines' clients and pages (no collective of their own).
- :mod:`cpkv.tier.cluster.probe`: :class:`StoreProbe`, whether the store answers again (every tier's).
- :mod:`cpkv.tier.cluster.serve`: ``cpkv cluster serve``.
"""
