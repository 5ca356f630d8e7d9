"""A JSON reader that refuses what Python's ``json`` quietly accepts.

``json.loads`` keeps the last of duplicate keys, accepts ``NaN``/``Infinity`` and raises a
zoo of exception types on hostile input (``ValueError``, ``RecursionError``, ...). Two
parsers disagreeing about duplicate keys is a classic signature-bypass, so everything the
trust core reads goes through :func:`loads`, which raises only ``Rejected(MALFORMED)``.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from .display import safe_text
from .errors import Reason, Rejected


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)  # built in C; fewer keys than pairs means a key came twice
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return obj


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


_SPACE = " \t\n\r"
"""JSON's whitespace, as ``json.decoder.WHITESPACE`` has it."""

_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
"""One decoder for every document: ``json.loads`` with hooks would build a new one per call."""


def loads(data: bytes, what: str) -> Any:
    """Parse UTF-8 JSON strictly; ``what`` names the document in the error. The document is
    ``Any``, as :func:`json.loads`'s: its shape is the caller's to check, with ``isinstance``.

    Raises:
        Rejected: not UTF-8, not JSON, a duplicate key, ``NaN`` or ``Infinity``, or nested too
            deep to parse (reason ``malformed``).
    """
    try:
        text = data.decode("utf-8")
        if text[:1] not in _SPACE:  # "" is in every string: an empty text goes to decode
            # decode's own steps without its two whitespace patterns (a plan's verify reads
            # two documents); anything else, errors included, as decode reads it
            obj, end = _DECODER.raw_decode(text)
            if end == len(text) or not text[end:].strip(_SPACE):
                return obj
        return _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise Rejected(Reason.MALFORMED, f"{what} is not valid JSON ({_short(exc)})") from None


def _short(exc: BaseException) -> str:
    return safe_text(str(exc) or type(exc).__name__, 120)
