"""safe_text: untrusted text becomes one printable, bounded, UTF-8-encodable line."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from plancache.trust.display import ELLIPSIS, safe_text

_FORBIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}
_CHARS = st.characters(exclude_categories=()) | st.sampled_from(
    "\n\r\x00\x1b\x7f\x85\u2028\u2029\u202e\ud800\udfff\\"
)
"""Every code point, lone surrogates included, with the dangerous ones drawn often."""


def assert_one_safe_line(out: str, limit: int) -> None:
    assert len(out) <= limit
    assert out.splitlines() in ([], [out])
    assert not any(unicodedata.category(c) in _FORBIDDEN for c in out), ascii(out)
    out.encode("utf-8")  # no lone surrogates survive


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=_CHARS, max_size=400), st.integers(1, 300))
def test_any_text_becomes_one_safe_bounded_line(value: str, limit: int) -> None:
    assert_one_safe_line(safe_text(value, limit), limit)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_CHARS, max_size=60))
@example("PIN-VALUE")  # drawn once on a fresh clone: a word, not a credential (issue 40)
@example("pin-source")
def test_escaping_is_reversible_when_nothing_is_cut(value: str) -> None:
    """Injective: the shown text decodes back to the original, so no two values look alike.
    A draw shaped like a credential (``0:0@`` is a URL's user and password, ``KEY=0`` a
    secret's assignment) is masked on purpose: that is redaction, tested on its own."""
    out = safe_text(value, 1000)
    assume("***" not in out or "***" in value)
    assert not out.endswith(ELLIPSIS) or value.endswith(ELLIPSIS)
    assert (
        out.encode("ascii", "backslashreplace").decode("unicode_escape", "surrogatepass") == value
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("SHA256:abc\ndecision=apply", "SHA256:abc\\x0adecision=apply"),
        ("a\rb\tc\x1b[31m", "a\\x0db\\x09c\\x1b[31m"),
        ("\ud800", "\\ud800"),
        ("\x7f\x85\u2028\u2029", "\\x7f\\x85\\u2028\\u2029"),
        ("\u202eevil", "\\u202eevil"),
        ("back\\slash", "back\\\\slash"),
        ("naïve 日本 😀", "naïve 日本 😀"),
        (None, "None"),
        (42, "42"),
    ],
)
def test_examples(value: object, shown: str) -> None:
    assert safe_text(value) == shown


def test_truncation_keeps_escapes_whole_and_marks_the_cut() -> None:
    assert safe_text("x" * 300) == "x" * 199 + ELLIPSIS
    assert safe_text("x" * 200) == "x" * 200
    assert safe_text("\n" * 10, 9) == "\\x0a\\x0a" + ELLIPSIS  # never half an escape
    assert safe_text("abc", 1) == ELLIPSIS


def test_values_that_cannot_even_be_printed() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert safe_text(Hostile()) == "<unprintable Hostile>"
    assert safe_text(10**5000) == "<unprintable int>"
    with pytest.raises(ValueError):
        safe_text("x", 0)
