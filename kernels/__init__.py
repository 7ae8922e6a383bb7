"""Device kernels (Triton), each with a torch reference implementation.

Imported as ``cpkv.kernels`` (``python/cpkv/kernels`` links here).
"""
