"""Checks for command-line values that argparse's ``type=`` cannot express.

Every command validates its inputs before any work and fails with one line:
never a traceback, and never a NaN or an infinity that makes a loop run
forever. Each check raises a ``CpkvValueError`` that
names the option; ``cpkv.cli.main`` prints it as ``cpkv: error: ...``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable, Sequence

from cpkv.errors import InvalidArgumentError, UnknownPolicyError


def positive_int(value: int | None, option: str) -> None:
    """A count that must be >= 1 when given."""
    if value is not None and value < 1:
        raise InvalidArgumentError(f"{option} must be a positive integer, got {value}")


def positive_ints(text: str, option: str) -> list[int]:
    """A comma list of positive integers (``1000,5859``); nan, inf, 0, -5, 1.5 and junk are refused."""
    values = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            value = None
        if value is None or value < 1:
            try:
                finite = math.isfinite(float(item))
            except ValueError:
                finite = True
            what = "not finite" if not finite else "not a positive integer"
            raise InvalidArgumentError(f"{option}: {item!r} is {what} (want positive integers, comma separated)")
        values.append(value)
    if not values:
        raise InvalidArgumentError(f"{option} needs at least one positive integer, got {text!r}")
    return values


def policy_list(text: str, known: Sequence[str], option: str = "--policy") -> list[str]:
    """A comma list of eviction policy names, each known, in the order given, without repeats."""
    names: list[str] = []
    for name in (part.strip() for part in text.split(",")):
        if not name:
            continue
        if name not in known:
            raise UnknownPolicyError(f"{option}: unknown eviction policy {name!r} (known: {', '.join(known)})")
        if name not in names:
            names.append(name)
    if not names:
        raise InvalidArgumentError(f"{option} needs at least one policy (known: {', '.join(known)})")
    return names


def output_file(path: str | None, option: str) -> None:
    """An output path whose folder exists and which is not itself a folder, checked before the work."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise InvalidArgumentError(f"{option} {path}: is a directory")
    if not p.parent.is_dir():
        raise InvalidArgumentError(f"{option} {path}: directory {p.parent} does not exist")


# -- argparse ``type=`` callables: a bad value is an argparse error (one line, exit 2) -------------


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An integer option in [minimum, maximum] (either bound optional); 1.5, nan and junk are refused."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer{_range(minimum, maximum)}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{value} is out of range{_range(minimum, maximum)}")
        return value

    parse.__name__ = "integer"
    return parse


def real(minimum: float | None = None, maximum: float | None = None, *, above: float | None = None,
         ) -> Callable[[str], float]:
    """A finite number in [minimum, maximum], or > ``above``; nan, inf and junk are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not finite")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"{text} must be > {above:g}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{text} is out of range{_range(minimum, maximum)}")
        return value

    parse.__name__ = "number"
    return parse


def output_path(text: str) -> str:
    """An output file path (``--json PATH``, ...): its folder must exist and it must not be a folder."""
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory")
    if not p.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: directory {p.parent} does not exist")
    return text


def _range(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" (want {minimum:g} to {maximum:g})"
    if minimum is not None:
        return f" (want >= {minimum:g})"
    if maximum is not None:
        return f" (want <= {maximum:g})"
    return ""


def integer_list(minimum: int, maximum: int) -> Callable[[str], list[int]]:
    """A comma list of integers in [minimum, maximum] (``2,4,8``), at least one."""
    one = integer(minimum, maximum)

    def parse(text: str) -> list[int]:
        values = [one(item.strip()) for item in text.split(",") if item.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} has no value (want integers {minimum} to {maximum}, "
                                             "comma separated)")
        return values

    parse.__name__ = "integer list"
    return parse
