"""containers' ``registries.conf`` (version 2: CRI-O, podman, skopeo): the mirror it names.

Read as containers/image reads it: the files in order (:mod:`.mirror_hosts`), a drop-in's
``[[registry]]`` replacing an earlier one of the same prefix. The ``[[registry]]`` whose
``prefix`` (default: its ``location``) is the longest match of ``HOST[:PORT]/REPOSITORY`` at a
``/`` (``*.example.com`` matches any host under example.com) applies; ``blocked = true``
refuses the store (ConfigError), as podman refuses the pull. Of its ``[[registry.mirror]]``
tables the first is the mirror, the repository mapped as containers map it: what follows the
prefix, appended to the mirror's ``location`` (``mirror.internal/cache`` serves
``registry.example/team/app`` as ``cache/team/app``). ``pull-from-mirror`` says which reads it
serves: ``all`` (the default), ``digest-only`` (tags are resolved by the registry),
``tag-only``; the registry's ``mirror-by-digest-only = true`` makes it ``digest-only``.
``insecure = true`` means plain HTTP, which plancache uses only to a loopback mirror or with
``plain_http=true`` (ConfigError otherwise), never TLS without verification.

Not read: a ``location`` that moves the registry itself (the store URL names the registry
plancache writes to and reads tags from), version 1's ``[registries.*]`` (no mirrors), the
search and alias tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ....trust.display import safe_text
from ....trust.errors import ConfigError
from ..registry_urls import Registry, check_authority, check_repository
from .mirror_hosts import MAX_ENTRIES, MirrorHost, flag_of, read_toml, text_of

PULL_FROM = {"all": (True, True), "digest-only": (False, True), "tag-only": (True, False)}
"""``pull-from-mirror`` -> (serves tags, serves digests)."""


def _matches(name: str, prefix: str) -> bool:
    if prefix.startswith("*."):
        host = name.split("/", 1)[0]
        return host.endswith(prefix[1:])
    return name == prefix or name.startswith(prefix + "/")


def _registries(files: list[Path], explicit: bool) -> dict[str, tuple[dict[str, Any], Path]]:
    """Prefix -> (its ``[[registry]]`` table, the file it came from), later files winning."""
    found: dict[str, tuple[dict[str, Any], Path]] = {}
    for index, path in enumerate(files):
        doc = read_toml(path, explicit and index == 0)
        if doc is None:
            continue
        entries = doc.get("registry", [])
        if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
            raise ConfigError(f"{path}: [[registry]] is not a list of tables")
        for entry in entries:
            if not isinstance(entry, dict):
                raise ConfigError(f"{path}: a [[registry]] is not a table")
            prefix = entry.get("prefix") or entry.get("location")
            found[text_of(prefix, "a registry's prefix", path).rstrip("/")] = (entry, path)
    return found


def registries_conf_mirror(
    files: list[Path], registry: Registry, repository: str, *, explicit: bool
) -> MirrorHost | None:
    """The mirror the registries.conf ``files`` name for the repository (module docstring).

    Raises:
        ConfigError: a file unreadable or malformed, the registry blocked, a mirror's location
            not a registry host and repository.
    """
    name = f"{registry.authority}/{repository}"
    registries = _registries(files, explicit)
    best = max((p for p in registries if _matches(name, p)), key=len, default=None)
    if best is None:
        return None
    entry, path = registries[best]
    shown = safe_text(best, 80)
    if flag_of(entry.get("blocked"), "blocked", path):
        raise ConfigError(f"{path}: registry {shown!r} is blocked (blocked = true)")
    mirrors = entry.get("mirror", [])
    if not isinstance(mirrors, list) or len(mirrors) > MAX_ENTRIES:
        raise ConfigError(f"{path}: the mirrors of {shown!r} are not a list of tables")
    if not mirrors:
        return None
    mirror = mirrors[0]
    if not isinstance(mirror, dict):
        raise ConfigError(f"{path}: a mirror of {shown!r} is not a table")
    location = text_of(mirror.get("location"), "a mirror's location", path).rstrip("/")
    if "://" in location:
        raise ConfigError(f"{path}: a mirror's location takes no scheme (containers refuse it)")
    mode = (
        "digest-only"
        if flag_of(entry.get("mirror-by-digest-only"), "mirror-by-digest-only", path)
        else "all"
    )
    mode = mirror.get("pull-from-mirror") or mode
    if mode not in PULL_FROM:
        raise ConfigError(f"{path}: pull-from-mirror is all, digest-only or tag-only")
    rest = name[len(name.split("/", 1)[0]) :] if best.startswith("*.") else name[len(best) :]
    authority, _, mapped = (location + rest).partition("/")
    where = f"{path}: mirror {safe_text(location, 80)!r}"
    host = check_authority(authority, where)
    resolves, pulls = PULL_FROM[mode]
    insecure = flag_of(mirror.get("insecure"), "insecure", path)
    return MirrorHost(
        f"http://{host.authority}" if insecure else host.authority,
        check_repository(mapped, where),
        resolves=resolves,
        pulls=pulls,
        source=str(path),
    )
