"""Device kernels (Triton), each with a torch reference implementation.

Imported as ``cpkv.kernels`` (``python/cpkv/kernels/__init__.py`` adds this folder to its path; a
wheel carries these modules, and cpkv.kernels finds them there).

- :mod:`~cpkv.kernels.gather`: the CP compose gather through a 2 * cp source table.
"""
