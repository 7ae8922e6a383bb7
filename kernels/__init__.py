"""Device kernels (Triton), each with a torch reference implementation.

Imported as ``cpkv.kernels`` (``python/cpkv/kernels`` links here).

- :mod:`~cpkv.kernels.gather`: the CP compose gather through a 2 * cp source table.
"""
