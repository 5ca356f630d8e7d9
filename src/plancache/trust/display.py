"""One rule for showing untrusted text to a person or a parser.

Key ids, comments, provenance values, object names and error details come from sidecars,
stores and files that an attacker may have written. Printed raw, a newline forges a table
row or a plugin log line (``decision=apply …``), an ANSI escape rewrites the terminal, a
bidi override reorders what a reader sees, and a lone surrogate cannot be encoded at all
(``print`` raises, a command dies and hides every other result). So every such string goes
through :func:`safe_text` before it is embedded in an error detail or rendered.

The same rule keeps secrets out of every output: a location, a store URL or a key reference
can carry a credential (``s3://AK:SECRET@bucket``, a SAS ``?sig=``, a presigned
``X-Amz-Signature``, ``pkcs11:…?pin-value=1234``), and it ends up in error details that
SDKs build, in tables, JSON reports and the plugin's log lines. :func:`redact` masks them and
:func:`safe_text` applies it to everything it shows, so one function decides what is secret.
"""

from __future__ import annotations

import re
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


MASK = "***"
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/?#@\s]*)@")
_OCIFS_BUCKET = re.compile(r"[A-Za-z0-9._-]+")
_OCIFS_NAMESPACE = re.compile(r"[A-Za-z0-9-]+(?![\w.@%-]|:[0-9])")
"""Oracle Cloud object storage (fsspec's ``oci://``, ocifs) names a bucket where a URL has its
userinfo: ``oci://bucket@namespace/prefix``. A bucket name (letters, digits, ``._-``) before a
namespace (letters and digits: no dot, no port) is shown; anything else there is masked: a
``user:token``, an encoded character, a host with a dot or a port (a registry's)."""
_BARE_USERINFO = re.compile(r"(?<![\w.+\-/:@])[^\s\"'/@:=?&;,]+:[^\s\"'/@]+@")
"""``user:password@host`` without its scheme, as an SDK echoes a URL's "bucket name"."""
_ENCODED_USERINFO = re.compile(r"(?i)(%3A%2F%2F)(?:(?!%2F|%40)[^/?#@\s\"'])*%40")
_ENCODED_PARAM = re.compile(
    r"(?i)(%3F|%26|%3B)([a-z0-9_.\-]+)%3D((?:(?!%26|%3B|%23)[^&;#\s,\"'\\])*)"
)
"""The same, percent-encoded once, as an SDK quotes a whole URL into another one's query."""
_CUT_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#@\s]*:[^/?#@\s]*$")
_PIN = re.compile(r"(?i)\b(pin-(?:value|source))(?:[=:]|%3D|%3A)[^&;#\s]+")
"""``pin-value=…``, also malformed (``pin-value:…``) or percent-encoded: a separator and a value
are needed, so a harmless word such as ``PIN-VALUE`` is shown as it is."""
_HEADER = re.compile(
    r"(?i)(?<![\w-])((?:proxy-)?authorization|x-amz-security-token|x-api-key|client[_-]secret)"
    r"(\s*[:=]\s*)(?:(bearer|basic|digest|negotiate|token|aws4-hmac-sha256)\s+)?[^\s,;\"'&]+"
)
"""A credential header as an SDK or a proxy echoes it (``Authorization: Bearer …``, ``Basic …``,
``x-amz-security-token: …``, ``client_secret: …``): the scheme stays, the value goes. The quoted
(JSON-ish) and ``name=value`` query forms are :data:`_QUOTED_PARAM`'s and :data:`_PARAM`'s."""
_PARAM = re.compile(r"(?i)(^|[?&;,\s])([a-z0-9_.\-]+)=([^&;#\s,\"'\\]*)")
_QUOTED_PARAM = re.compile(r"""(?i)(["'])([a-z0-9_.\-]+)\1(\s*:\s*)(["'])(?:(?!\4).)*\4""")
_SECRET_NAME = re.compile(
    r"(?i)token|secret|passw|pwd|credential|session|auth|^x-(?:amz|goog|ms)-|^pin-|sig$|"
    r"signature$|key$"
)
"""A parameter whose name looks like it carries a credential: SAS ``sig``, ``token``,
``secret``, ``password``, AWS/GCS/Azure signed-URL ``X-Amz-*``/``X-Goog-*``/``x-ms-*``,
``AccountKey``/``access_key``/``api_key``, PKCS#11 ``pin-*``. Over-masking is harmless."""
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")
"""A JSON Web Token (header and claims both base64url JSON objects): an OIDC identity token that
signs keylessly for its minutes (``SIGSTORE_ID_TOKEN``), wherever an SDK's message echoes it."""
_WINDOW = 4096
"""Input characters looked at beyond ``limit``: far more than any credential, so a secret is
masked whole before the text is cut."""


def _masked_param(match: re.Match[str]) -> str:
    lead, name, value = match.groups()
    equals = (
        "="
        if match.group(0)[len(lead) + len(name)] == "="
        else match.group(0)[len(lead) + len(name) :][:3]
    )
    return f"{lead}{name}{equals}{MASK}" if value and _SECRET_NAME.search(name) else match.group(0)


def _masked_quoted(match: re.Match[str]) -> str:
    quote, name, colon, vquote = match.groups()
    return (
        f"{quote}{name}{quote}{colon}{vquote}{MASK}{vquote}"
        if _SECRET_NAME.search(name)
        else match.group(0)
    )


def _masked_header(match: re.Match[str]) -> str:
    name, separator, scheme = match.groups()
    return f"{name}{separator}{scheme + ' ' if scheme else ''}{MASK}"


def _masked_userinfo(match: re.Match[str]) -> str:
    scheme, userinfo = match.groups()
    if (
        scheme.lower() == "oci://"
        and _OCIFS_BUCKET.fullmatch(userinfo)
        and _OCIFS_NAMESPACE.match(match.string, match.end())
    ):
        return match.group(0)
    return f"{scheme}{MASK}@"


def _needs_no_escape(text: str) -> bool:
    """:func:`safe_text`'s quick test, decided in C: printable ASCII and no backslash."""
    return text.isascii() and text.isprintable() and "\\" not in text


def _nothing_to_redact(text: str) -> bool:
    """:func:`redact`'s quick exit (a JSON Web Token aside): none of the marks its patterns need."""
    return "=" not in text and "@" not in text and ":" not in text and "pin-" not in text.lower()


def is_plain(text: str) -> bool:
    """True only when :func:`safe_text` leaves ``text`` (within its limit) as it is: nothing to
    escape and nothing :func:`redact` looks at, by the same tests they make. True for a text, it
    is true for every part of it, so one check of many texts joined by a space answers for each
    of them (a 10,000-plan table's fingerprints)."""
    return _needs_no_escape(text) and "eyJ" not in text and _nothing_to_redact(text)


def redact(text: str) -> str:
    """``text`` with credentials masked: URL userinfo (``scheme://***@host``; not the bucket of an
    ``oci://bucket@namespace`` URL, see :data:`_OCIFS_NAMESPACE`), the value of any
    ``name=value`` parameter whose name looks secret (after ``?``, ``&``, ``;``, ``,`` or a
    space), and whatever follows ``pin-value``/``pin-source`` and a separator, even malformed
    (``&pin-value:1234``), quoted ``'name': 'value'`` pairs with such names, and credential
    headers (``Authorization: Bearer …``, ``x-amz-security-token: …``), and JSON Web Tokens
    (an OIDC token). Idempotent.
    Applied by :func:`safe_text`; call it directly only where text is shown unescaped."""
    if "eyJ" in text:
        text = _JWT.sub(MASK, text)
    quoted = ":" in text and ('"' in text or "'" in text)
    if _nothing_to_redact(text):
        return text
    if ":" in text or "=" in text:
        text = _HEADER.sub(_masked_header, text)
    text = _USERINFO.sub(_masked_userinfo, text)
    text = _BARE_USERINFO.sub(f"{MASK}@", text)
    text = _PIN.sub(rf"\1={MASK}", text)
    if "%" in text:
        text = _ENCODED_USERINFO.sub(rf"\1{MASK}%40", text)
        text = _ENCODED_PARAM.sub(_masked_param, text)
    if quoted:  # {'secret': '…'} and "token": "…" in an SDK's message or a dict shown whole
        text = _QUOTED_PARAM.sub(_masked_quoted, text)
    return _PARAM.sub(_masked_param, text)


def safe_text(value: object, limit: int = 200) -> str:
    """``value`` as one printable line of at most ``limit`` characters, encodable as UTF-8.

    Escapes use Python's backslash forms (``\\x0a``, ``\\u202e``, ``\\ud800``, ``\\\\``), so
    the output is unambiguous and reads like a ``repr`` without quotes. Beyond ``limit`` the
    text is cut at an escape boundary and ends in "…". Other objects are shown as ``str(value)``.
    Never raises for any ``value`` (a hostile ``__str__`` included): it runs on error paths.

    Raises:
        ValueError: ``limit`` is below 1 (a caller's bug, never the value's).
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
    if len(text) <= limit and _needs_no_escape(text):
        return redact(text)  # the common case, decided in C: nothing to escape, nothing to cut
    escaped = redact("".join(_escape(char) for char in text[: limit + _WINDOW]))
    if len(text) > limit + _WINDOW:  # cut before a userinfo's '@': what is shown may be a password
        escaped = _CUT_USERINFO.sub(rf"\1{MASK}", escaped)
    if len(escaped) <= limit:
        return escaped
    return _cut(escaped, limit)


def _cut(escaped: str, limit: int) -> str:
    """An escaped, redacted text cut to ``limit`` characters at an escape boundary, with "…"."""
    pieces: list[str] = []
    length = 0
    for piece in re.findall(
        r"\\(?:x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|\\)|.", escaped, re.DOTALL
    ):
        if length + len(piece) > limit:
            while length > limit - len(ELLIPSIS):  # make room for the ellipsis
                length -= len(pieces.pop())
            return "".join(pieces) + ELLIPSIS
        pieces.append(piece)
        length += len(piece)
    return "".join(pieces)
