"""containerd's ``hosts.toml``: the mirror it names for a registry, found as containerd finds it.

containerd (1.5+, the CRI's ``config_path``) looks under its hosts root for the registry's
directory: ``host_port_`` (``registry.example_5000_`` for ``registry.example:5000``), then
``host:port``, then ``_default``; the first that exists is the one, even without a
``hosts.toml`` (it then holds certificates only: no mirror). In the file each
``[host."https://mirror…"]`` table is a host tried before the registry itself, in the order
written, with ``capabilities`` (all of ``pull``, ``resolve``, ``push`` when unset): plancache
reads through the first that can ``pull`` (content by digest) or ``resolve`` (tags). Without
such a table, a top-level ``server`` other than the registry is the one host containerd reads
from, and so does plancache. A mirror is sent ``?ns=<registry>`` as containerd sends it.

Read here: the host's URL (``https`` unless it says ``http``; its path must be the API root,
``/v2`` or none: ``override_path`` is not followed), ``capabilities``, ``ca`` (a path or
paths, relative to the file's directory). Refused as a ConfigError, because they change whom
the connection trusts: ``skip_verify = true`` (plancache always verifies TLS) and ``client``
certificates (it presents none). Not read: ``header``, ``dial_timeout`` (the store's own
timeouts apply).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ....trust.display import safe_text
from ....trust.errors import ConfigError
from ..registry_urls import Registry, check_authority
from .mirror_hosts import MAX_ENTRIES, MirrorHost, flag_of, read_toml, text_of

CAPABILITIES = {"pull", "resolve", "push", "referrers"}
HOSTS_FILE = "hosts.toml"
DEFAULT_DIR = "_default"


def host_directories(registry: Registry) -> list[str]:
    """containerd's directory names for a registry, in its order (Unix)."""
    authority = registry.authority
    names = []
    colon = authority.rfind(":")
    if colon > 0 and not authority.endswith("]"):
        names.append(f"{authority[:colon]}_{authority[colon + 1 :]}_")
    return [*names, authority, DEFAULT_DIR]


def hosts_dir_mirror(root: Path, registry: Registry, repository: str) -> MirrorHost | None:
    """The mirror of the first of the registry's directories under ``root`` that exists.

    Raises:
        ConfigError: its ``hosts.toml`` is unreadable, malformed, or asks what plancache
            refuses (``skip_verify``, ``client``).
    """
    for name in host_directories(registry):
        directory = root / name
        if directory.exists():
            return hosts_file_mirror(directory / HOSTS_FILE, registry, repository, explicit=False)
    return None


def hosts_file_mirror(
    path: Path, registry: Registry, repository: str, *, explicit: bool
) -> MirrorHost | None:
    """The mirror one ``hosts.toml`` names for the registry (see the module docstring).

    Raises:
        ConfigError: the file is unreadable or malformed, or asks for ``skip_verify`` or
            ``client`` certificates.
    """
    doc = read_toml(path, explicit)
    if doc is None:
        return None
    hosts = doc.get("host", {})
    if not isinstance(hosts, dict) or len(hosts) > MAX_ENTRIES:
        raise ConfigError(f"{path}: [host] is not a table of hosts")
    for url, table in hosts.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: host {safe_text(url, 80)!r} is not a table")
        found = _host(url, table, path, registry, repository)
        if found is not None:
            return found
    server = doc.get("server")
    if server is None:
        return None
    return _host(text_of(server, "server", path), doc, path, registry, repository)


def _host(
    url: str, table: dict[str, Any], path: Path, registry: Registry, repository: str
) -> MirrorHost | None:
    """A host's table as a mirror; None for the registry itself or a host that cannot read."""
    shown = safe_text(url, 80)
    parts = urlsplit(url if url.startswith(("http://", "https://")) else "https://" + url)
    if parts.path.rstrip("/") not in ("", "/v2") or parts.query or parts.fragment:
        raise ConfigError(
            f"{path}: host {shown!r} has an API path of its own: plancache reads a mirror at /v2/"
        )
    if "@" in parts.netloc:
        raise ConfigError(f"{path}: host {shown!r} carries credentials")
    where = check_authority(parts.netloc, f"{path}: host {shown!r}")
    if where == registry:
        return None
    capabilities = table.get("capabilities")
    if capabilities is None:
        wanted = CAPABILITIES
    elif isinstance(capabilities, list) and len(capabilities) <= len(CAPABILITIES) * 2:
        wanted = {text_of(c, "a capability", path).lower() for c in capabilities}
        if not wanted <= CAPABILITIES:
            raise ConfigError(f"{path}: host {shown!r} has an unknown capability")
    else:
        raise ConfigError(f"{path}: host {shown!r}: capabilities is not a list")
    if not wanted & {"pull", "resolve"}:
        return None
    if flag_of(table.get("skip_verify"), "skip_verify", path):
        raise ConfigError(
            f"{path}: host {shown!r} asks to skip TLS verification: plancache verifies every "
            "connection (give its CA with ca = ...)"
        )
    if table.get("client") is not None:
        raise ConfigError(f"{path}: host {shown!r} wants a client certificate: not supported")
    return MirrorHost(
        f"{parts.scheme}://{where.authority}",
        repository,
        resolves="resolve" in wanted,
        pulls="pull" in wanted,
        source=str(path),
        ca_files=_ca_files(table.get("ca"), path),
    )


def _ca_files(value: Any, path: Path) -> tuple[str, ...]:
    if value is None:
        return ()
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or len(listed) > MAX_ENTRIES:
        raise ConfigError(f"{path}: ca is not a path or a list of paths")
    return tuple(str(path.parent / text_of(p, "a ca path", path)) for p in listed)
