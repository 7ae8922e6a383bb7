"""``cpkv.kernels``: device kernels (Triton), each with a torch reference implementation.

The sources live here, in the repository's top-level ``kernels/`` folder; ``python/cpkv/kernels/``
holds one tracked symlink per file, so a checkout imports them as ``cpkv.kernels`` and the wheel
carries them as plain files inside the ``cpkv`` package (nothing else lands in site-packages).

- :mod:`~cpkv.kernels.gather`: the CP compose gather through a 2 * cp source table.
"""
