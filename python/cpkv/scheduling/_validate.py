"""Argument checks shared by the scheduling dataclasses (one message style)."""

from __future__ import annotations

from cpkv.errors import InvalidArgumentError


def non_negative_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{owner}.{name} must be an int, got {value!r}")
    if value < 0:
        raise InvalidArgumentError(f"{owner}.{name} must be >= 0, got {value}")


def positive_int(owner: str, name: str, value: object) -> None:
    non_negative_int(owner, name, value)
    if value == 0:
        raise InvalidArgumentError(f"{owner}.{name} must be > 0, got 0")


def flag(owner: str, name: str, value: object) -> None:
    # A decision reads an authoritative flag set for this step; a flag that arrives as 0/1/None
    # is a caller passing something else (a counter, a missing value), so only a real bool is accepted.
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{owner}.{name} must be a bool, got {value!r}")
