"""``import cpkv`` never imports SGLang; the SGLang adapter refuses to load without exactly 0.5.23."""

import subprocess
import sys


def test_import_cpkv_does_not_import_sglang() -> None:
    code = ("import sys, cpkv, cpkv.integrations, cpkv.cli; "
            "print(sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_adapter_refuses_to_load_without_sglang() -> None:
    import importlib

    import pytest

    from cpkv.errors import EngineVersionError

    with pytest.raises(EngineVersionError, match="sglang==0.5.23"):
        importlib.import_module("cpkv.integrations.sglang")
