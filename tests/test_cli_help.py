"""The ``cpkv`` command line's help and version: plain text, and only the named command is imported.

Bad command lines are tested in test_cli_errors.py and test_cli_catalogue.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import cpkv
from conftest import REPO_ROOT
from cpkv.cli import COMMANDS, main

COMMAND_MODULES = sorted({module for _, module, _ in COMMANDS})
# reStructuredText or Markdown that a terminal would show raw: ``code``, `code`, :mod:`x`, **bold**.
MARKUP = re.compile(r"`|:(mod|class|func|meth|attr|data):|\*\*")

# Every help screen: the top level, the bench group, and each command.
HELP_LINES = [[], ["bench"], *[list(words) for words, _, _ in COMMANDS]]


def _imported_by(argv: list[str]) -> tuple[int, str, list[str], bool]:
    """Runs ``main(argv)`` in a fresh interpreter: exit code, stdout, the command modules it
    imported, and whether it imported torch."""
    code = ("import json, sys\nfrom cpkv.cli import main\n"
            f"status = main({argv!r})\n"
            f"modules = sorted(m for m in {COMMAND_MODULES!r} if m in sys.modules)\n"
            "print(json.dumps([status, modules, 'torch' in sys.modules]), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    status, modules, torch_imported = json.loads(proc.stderr.splitlines()[-1])
    return status, proc.stdout, modules, torch_imported


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["--version"]], ids=" ".join)
def test_the_top_level_imports_no_command_module_and_no_torch(argv):
    status, out, modules, torch_imported = _imported_by(argv)
    assert status == 0 and out
    assert modules == [] and not torch_imported, (modules, torch_imported)


@pytest.mark.parametrize("words,module", [(["bench", "allocator"], "cpkv.bench.allocator"),
                                          (["hitrate"], "cpkv.hitrate"),
                                          (["bench", "tier"], "cpkv.bench.tier")],
                         ids=["bench allocator", "hitrate", "bench tier"])
def test_a_command_imports_its_own_module_only(words, module):
    status, out, modules, torch_imported = _imported_by([*words, "--help"])
    assert status == 0 and "usage: cpkv " + " ".join(words) in out
    assert modules == [module] and not torch_imported, (modules, torch_imported)


def test_version_is_one_line_naming_the_package_version():
    proc = subprocess.run([sys.executable, "-m", "cpkv", "--version"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"cpkv {cpkv.__version__}"] and proc.stderr == ""


@pytest.mark.parametrize("words", HELP_LINES, ids=lambda words: " ".join(words) or "top level")
def test_every_help_is_plain_text(words, capsys):
    assert main([*words, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cpkv"), out
    markup = [line for line in out.splitlines() if MARKUP.search(line)]
    assert markup == [], markup


@pytest.mark.parametrize("module", ["cpkv.gpu_check", "cpkv.bench.compose_gpu"])
def test_the_modules_run_on_their_own_have_plain_help_too(module):
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: python -m {module}"), proc.stderr
    markup = [line for line in proc.stdout.splitlines() if MARKUP.search(line)]
    assert markup == [], markup


def test_the_markup_check_sees_markup():
    # The check above passes on plain text only if it would fail on what the top level once showed.
    assert MARKUP.search("The ``cpkv`` command line") and MARKUP.search("see :mod:`cpkv.compose`")
    assert not MARKUP.search("replay only the first N requests (default 800)")
