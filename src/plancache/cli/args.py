"""Argument types shared by the subcommands: durations, KEY=VALUE facts, locations."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import Any

from ..settings import parse_duration, parse_key_value


def duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` -> timedelta, up to 100 years (argparse type;
    the rule is :func:`~plancache.settings.parse_duration`, which the plugin reads its
    environment with).

    Raises:
        argparse.ArgumentTypeError: not a positive whole number and a unit, or longer than 100
            years.
    """
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as JSON where it parses (argparse type).

    Raises:
        argparse.ArgumentTypeError: no ``=`` or an empty KEY, or a VALUE nested too deeply.
    """
    try:
        return parse_key_value(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """A whole number of at least 1 (argparse type).

    Raises:
        argparse.ArgumentTypeError: not a whole number, or below 1.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


_SIZE = re.compile(r"(\d+)\s*([KMGT]i?B?|B)?", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "ki": 2**10,
    "kib": 2**10,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": 2**20,
    "mib": 2**20,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": 2**30,
    "gib": 2**30,
    "t": 1000**4,
    "tb": 1000**4,
    "ti": 2**40,
    "tib": 2**40,
}


def byte_count(text: str) -> int:
    """``85899345920`` or ``80GiB`` / ``80G`` (whole numbers; GiB = 2**30, GB = 10**9) -> bytes
    (argparse type).

    Raises:
        argparse.ArgumentTypeError: not a whole number with an optional known unit.
    """
    match = _SIZE.fullmatch(text.strip())
    unit = (match.group(2) or "").lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count like 85899345920 or 80GiB")
    return int(match.group(1)) * _SIZE_UNITS[unit]
