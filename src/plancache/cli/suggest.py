"""Argument errors a newcomer can act on: which command complained, and the closest known word.

argparse reports an unknown option on the top-level parser ("plancache: unrecognized
arguments"), lumped with whatever positional followed it, and names the top-level help. Here
the leftover arguments go back to the subcommand that was being parsed, the first unknown
option is named on its own with the nearest option of *that* command (difflib), and an
invalid choice (a misspelled subcommand, ``--format``) gets the nearest choice.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known word nearest ``word``, if any is near enough to be the one meant.

    difflib is imported here, when a suggestion is wanted: a command that parses cleanly (a
    boot-time ``pull``) never pays for it."""
    import difflib

    matches = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` or nothing."""
    match = closest(word, known)
    return f"; did you mean {match!r}?" if match else ""


def leaf_parser(
    parser: argparse.ArgumentParser, namespace: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub)parser of the command that was parsed, e.g. ``plancache compile-cache sign``'s."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(namespace, action.dest, None) or "")
            if chosen is not None:
                return leaf_parser(chosen, namespace)
    return parser


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """What to say about arguments ``parser`` (the leaf) did not take."""
    options = [a for a in extras if a.startswith("-") and a != "-"]
    if options:
        name = options[0].split("=", 1)[0]
        known = (
            [o for o in parser._option_string_actions if o.startswith("--")]
            if name.startswith("--")
            else list(parser._option_string_actions)
        )
        if (
            name in parser._option_string_actions
        ):  # given before the command, where only --version is taken
            return f"{name} goes after the command: {parser.prog} {name} ..."
        prefixed = [o for o in known if o.startswith(name)] if name.startswith("--") else []
        hint = (
            f"; did you mean {prefixed[0]!r}? (options are not abbreviated)"
            if len(prefixed) == 1
            else did_you_mean(name, known)
        )
        return f"unknown option {name!r}{hint}"
    return f"unexpected argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}"


def with_suggestion(message: str) -> str:
    """argparse's message, plus the nearest choice for an invalid one."""
    match = _INVALID_CHOICE.search(message)
    if not match:
        return message
    choices = re.findall(r"'([^']*)'", match.group(2))
    return message + did_you_mean(match.group(1), choices)
