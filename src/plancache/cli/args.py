"""Argument types shared by the subcommands: durations, KEY=VALUE facts, locations."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import Any

from ..settings import parse_key_value

_DURATION = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` -> timedelta (argparse type)."""
    match = _DURATION.fullmatch(text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30d, 12h, 90m, 2w")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as JSON where it parses (argparse type)."""
    try:
        return parse_key_value(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value
