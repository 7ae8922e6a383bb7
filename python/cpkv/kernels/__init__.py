"""``cpkv.kernels``: device kernels (Triton), each with a torch reference.

The kernel sources exist once, in the repository's top-level ``kernels/`` folder (the layout of the
design card). This package adds that folder to its search path, so ``cpkv.kernels.gather`` is
``kernels/gather.py``:

- in a checkout or an editable install: ``<repo>/kernels``, two levels above ``python/cpkv``;
- in an installed wheel: the ``kernels`` folder next to ``cpkv`` in site-packages, which the wheel
  carries through maturin's ``include`` (pyproject.toml). It holds the modules only, no
  ``__init__.py``, so it is no importable top-level package of its own: only this one reads it.

No symlink is involved, so wheels and checkouts without symlink support both work.
"""

from pathlib import Path as _Path


def _sources() -> str:
    here = _Path(__file__).resolve().parent
    for candidate in (here.parents[1] / "kernels", here.parents[2] / "kernels"):
        if (candidate / "gather.py").is_file():
            return str(candidate)
    raise ImportError(f"cpkv.kernels: the kernel sources are missing (looked next to {here.parent} and in the "
                      f"checkout's top-level kernels/ folder)")


__path__.append(_sources())  # noqa: F821 -- a package's __path__
