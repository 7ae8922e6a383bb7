"""What SGLang needs from the environment to build the native code it compiles on first use.

SGLang 0.5.23 hashes HiCache pages with a C++ extension (``hicache_hash_cpp``) that it builds the
first time a page is hashed, through torch's ``cpp_extension``, which runs ``ninja`` found on
``PATH``. The ``ninja`` SGLang depends on is the pip package installed next to the interpreter
(``.venv-sglang/bin/ninja``): run as ``.venv-sglang/bin/python -m cpkv ...`` without the venv on
``PATH``, the build fails inside SGLang's threads (tracebacks, and every hash query of the run fails).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from cpkv.errors import EngineVersionError

__all__ = ["build_native_hash", "interpreter_tools_env"]


def interpreter_tools_env() -> dict[str, str]:
    """This process's ``PATH`` with the interpreter's own bin directory first (where the engine's
    pip-installed tools live), put into ``os.environ`` (so what this process builds, and the
    processes it starts, find them) and returned as ``{"PATH": ...}`` for a launcher's ``env``."""
    tools = str(Path(sys.executable).parent)
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != tools]
    os.environ["PATH"] = os.pathsep.join([tools, *rest])
    return {"PATH": os.environ["PATH"]}


def build_native_hash() -> None:
    """Builds SGLang's native page hash here (or loads the build torch cached), once, before any rank
    of a run needs it. Raises :class:`~cpkv.errors.EngineVersionError` naming the cause when it
    cannot be built (no ``ninja`` or C++ compiler on ``PATH``), instead of a traceback per thread."""
    interpreter_tools_env()
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    # SGLang's loader warns of a "stale" torch lock on every load after the first (torch leaves its
    # lock file behind): not a failure, and the one line a failure prints must stay the only one.
    loader_log = logging.getLogger("sglang.srt.utils.cpp_extension_loader")
    level = loader_log.level
    loader_log.setLevel(logging.ERROR)
    try:
        get_storage_hash_str([1, 2], None, page_size=1)
    except RuntimeError as err:
        cause: BaseException = err
        while cause.__cause__ is not None:  # SGLang wraps torch's reason ("Ninja is required ...")
            cause = cause.__cause__
        reason = " ".join(str(cause).split())
        raise EngineVersionError(
            f"SGLang's native page hash (hicache_hash_cpp, which SGLang compiles on first use with ninja and a "
            f"C++ compiler found on PATH) could not be built: {reason}") from None
    finally:
        loader_log.setLevel(level)
