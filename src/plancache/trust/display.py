"""One rule for showing untrusted text to a person or a parser.

Key ids, comments, provenance values, object names and error details come from sidecars,
stores and files that an attacker may have written. Printed raw, a newline forges a table
row or a plugin log line (``decision=apply …``), an ANSI escape rewrites the terminal, a
bidi override reorders what a reader sees, and a lone surrogate cannot be encoded at all
(``print`` raises, a command dies and hides every other result). So every such string goes
through :func:`safe_text` before it is embedded in an error detail or rendered.
"""

from __future__ import annotations

import unicodedata

_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Controls (C0, DEL, C1), format characters (bidi overrides, zero-width), surrogates, and
the Unicode line and paragraph separators that ``str.splitlines`` and JSON readers in other
languages treat as line breaks."""

ELLIPSIS = "…"


def _escape(char: str) -> str:
    if char == "\\":
        return "\\\\"  # escape the escape, so `\x0a` in the output always means one newline
    if unicodedata.category(char) not in _ESCAPED_CATEGORIES:
        return char
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe_text(value: object, limit: int = 200) -> str:
    """``value`` as one printable line of at most ``limit`` characters, encodable as UTF-8.

    Escapes use Python's backslash forms (``\\x0a``, ``\\u202e``, ``\\ud800``, ``\\\\``), so
    the output is unambiguous and reads like a ``repr`` without quotes. Beyond ``limit`` the
    text is cut at an escape boundary and ends in "…". Other objects are shown as ``str(value)``.
    Never raises (but for ``limit < 1``): it runs on error paths.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if isinstance(value, str):
        text = value
    else:
        try:
            text = str(value)
        except Exception:  # a hostile __str__, or an int too long to print
            text = f"<unprintable {type(value).__name__}>"
    if len(text) <= limit and text.isascii() and text.isprintable() and "\\" not in text:
        return text  # the common case, decided in C: nothing to escape, nothing to cut
    pieces: list[str] = []
    length = 0
    for char in text:
        piece = _escape(char)
        if length + len(piece) > limit:
            while length > limit - len(ELLIPSIS):  # make room for the ellipsis
                length -= len(pieces.pop())
            return "".join(pieces) + ELLIPSIS
        pieces.append(piece)
        length += len(piece)
    return "".join(pieces)
