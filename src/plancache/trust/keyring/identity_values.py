"""What a ``sigstore`` line's values must look like to match anything Fulcio writes.

A line whose issuer, pin or expression is spelled so that no certificate can ever match it is
harmless as a trusted line (the first verification says ``wrong-identity``, naming the field)
but silent as ``@revoked``: it revokes nothing while its author believes the identity revoked.
So each such spelling is refused at load, with the spelling Fulcio writes (issue 48 items 5
and 8): an issuer without its scheme, a repository without its scheme or with a trailing slash
or ``.git``, a short ref, an expression spelling the (lower-cased) scheme or host with
capitals. Pure: text in, nothing or a :class:`~..errors.ConfigError` out.
"""

from __future__ import annotations

import re

from ..display import safe_text
from ..errors import ConfigError


def check_issuer(issuer: str) -> None:
    """An OIDC issuer is an http(s) URL: Fulcio writes it so, and a bare host never matches.

    Raises:
        ConfigError: no scheme, or not http(s), with the likely fix.
    """
    scheme, sep, rest = issuer.partition("://")
    if not sep and ":/" not in issuer:
        raise ConfigError(
            f"issuer '{safe_text(issuer, 80)}' has no scheme: an OIDC issuer is a URL, "
            f"write issuer=https://{safe_text(issuer, 80)}"
        )
    if scheme.lower() not in ("https", "http") or not rest:
        raise ConfigError(f"issuer '{safe_text(issuer, 80)}' is not an https:// URL")


def check_pins(values: dict[str, str]) -> None:
    """Exact pins spelled as Fulcio never writes them (a repository without its scheme, with a
    trailing slash or ``.git``, a ref without ``refs/``) match no certificate: a trusted line
    fails visibly, but an ``@revoked`` one would revoke nothing, silently.

    Raises:
        ConfigError: such a pin, with the spelling Fulcio writes.
    """
    for key in ("source-repository", "build-config"):
        if key not in values:
            continue
        value = values[key]
        if "://" not in value:
            raise ConfigError(
                f"{key}={safe_text(value, 80)} has no scheme: Fulcio writes a URL, "
                f"{key}=https://{safe_text(value, 80)}"
            )
        if value.endswith("/") or (key == "source-repository" and value.endswith(".git")):
            raise ConfigError(
                f"{key}={safe_text(value, 80)}: Fulcio writes the URL without a trailing "
                "slash or .git, so it would never match"
            )
    ref = values.get("source-ref", "refs/")
    if not ref.startswith("refs/"):
        raise ConfigError(
            f"source-ref={safe_text(ref, 80)} is not a full ref: Fulcio writes "
            f"source-ref=refs/heads/{safe_text(ref, 80)} (or refs/tags/…)"
        )


def _capital_in_host(expression: str) -> bool:
    """Whether an expression spells its URL's scheme or host with a capital letter as a literal
    (outside a ``[...]`` class, not an escape such as ``\\D``): the text it is matched with has
    them in lower case (:func:`~.identity_match.normal_url`), so such a line could never match
    anything, and as ``@revoked`` would revoke nothing, silently."""
    scheme, sep, rest = expression.partition("://")
    if not sep or re.compile(expression, re.ASCII).flags & re.IGNORECASE:
        return False
    prefix, escaped, depth = scheme + sep + rest.partition("/")[0], False, 0
    for char in prefix:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            depth += 1
        elif char == "]" and depth:
            depth -= 1
        elif "A" <= char <= "Z" and not depth:
            return True
    return False


def _nested_repetition(expression: str) -> bool:
    """Whether a group holding an unbounded repetition (``*``, ``+``, ``{n,}``) is itself
    repeated: the classic exponential backtracking (``(/.*)*``, ``(a+)+``). Read from the text
    (escapes and ``[...]`` classes skipped), not from ``re``'s private parser. It does not catch
    every slow expression (``(a|aa)*`` overlaps without nesting); the length cap
    (:data:`~.identity_match.MAX_MATCHED_TEXT`) bounds the polynomial ones."""
    unbounded = [False]  # per open group: does it hold an unbounded repetition?
    escaped, in_class, closed = False, False, False
    for at, char in enumerate(expression):
        was_closed, closed = closed, False
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            unbounded.append(False)
        elif char == ")" and len(unbounded) > 1:
            inner = unbounded.pop()
            closed = inner
            unbounded[-1] = unbounded[-1] or inner
        elif char in "*+" or (char == "{" and re.match(r"\{\d*,\d*\}", expression[at:])):
            bound = re.match(r"\{\d*,(\d*)\}", expression[at:]) if char == "{" else None
            if was_closed and (bound is None or not bound.group(1) or int(bound.group(1)) > 1):
                return True
            if bound is None or not bound.group(1):
                unbounded[-1] = True
    return False


def compile_expression(key: str, expression: str) -> re.Pattern[str]:
    """An ``identity-regexp=`` or ``…-regexp=`` value, compiled with ASCII classes.

    Raises:
        ConfigError: it does not compile, or it spells a URL's host with capitals
            (:func:`_capital_in_host`).
    """
    try:
        pattern = re.compile(expression, re.ASCII)
    except re.error as exc:
        raise ConfigError(f"{key} does not compile: {safe_text(str(exc), 80)}") from None
    if _nested_repetition(expression):
        raise ConfigError(
            f"{key}={safe_text(expression, 80)} repeats a group that itself repeats without "
            "bound (like (/.*)*): matching it against a hostile SAN can take exponential time; "
            "write the group without the outer repetition"
        )
    if _capital_in_host(expression):
        raise ConfigError(
            f"{key}={safe_text(expression, 80)} spells the scheme or host with capitals, but "
            "they are matched in lower case (as URLs compare): write them in lower case"
        )
    return pattern
