"""The shape every mirror configuration is read into (:class:`MirrorHost`), and how their files
are read: capped (:data:`MAX_CONFIG`), regular files only, never a FIFO (the reader every
configuration file of the node's takes, :func:`...local.files.read_config_file`), strict TOML,
a malformed one a ConfigError naming the file, never an excerpt of it. Shared by
:mod:`.containerd_hosts` and :mod:`.registries_conf`; which of them applies is
:mod:`.mirror_choice`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....trust.errors import ConfigError
from ...local.files import read_config_file

try:  # Python 3.11+; on 3.10 only a file named by mirror_config is an error
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - the suite runs on 3.11
    tomllib = None  # type: ignore[assignment]  # Python 3.10 has no tomllib

MAX_CONFIG = 1024 * 1024
MAX_ENTRIES = 256
"""Hosts of a ``hosts.toml``, registries (or mirrors of one) of a ``registries.conf``, drop-ins
of a directory: more is not a configuration a runtime was given."""


@dataclass(frozen=True)
class MirrorHost:
    """A mirror for one repository: where, which reads it serves, and what it was read from."""

    endpoint: str
    """``HOST[:PORT]``, or ``http://…`` / ``https://…`` when the file says which."""
    repository: str
    """The repository's name on the mirror (registries.conf may map it under another path)."""
    resolves: bool
    """Serves tags (containerd's ``resolve``; registries.conf's ``all`` or ``tag-only``)."""
    pulls: bool
    """Serves content by digest (containerd's ``pull``; ``all`` or ``digest-only``)."""
    source: str
    ca_files: tuple[str, ...] = ()


def read_toml(path: Path, explicit: bool) -> dict[str, Any] | None:
    """A TOML file's table; None if absent (ConfigError if ``explicit``), or unreadable TOML on
    Python 3.10 when not explicit.

    Raises:
        ConfigError: unreadable, not a regular file, larger than MAX_CONFIG, not TOML.
    """
    raw = read_config_file(path, MAX_CONFIG, "mirror configuration", explicit=explicit)
    if raw is None:
        return None
    if tomllib is None:
        if explicit:
            raise ConfigError(f"reading {path} needs Python 3.11 (tomllib)")
        return None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        raise ConfigError(f"mirror configuration {path} is not TOML") from None


def text_of(value: Any, what: str, source: Path) -> str:
    """A short printable string from a configuration file.

    Raises:
        ConfigError: anything else, naming ``what`` and the file.
    """
    if not (isinstance(value, str) and 0 < len(value) <= 512 and value.isprintable()):
        raise ConfigError(f"{source}: {what} is not a string")
    return value


def flag_of(value: Any, what: str, source: Path) -> bool:
    """A TOML boolean from a configuration file, False when unset.

    Raises:
        ConfigError: anything but true or false, naming ``what`` and the file.
    """
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: {what} is not true or false")
    return value
