"""Which ``oci://`` URLs are registries, and the names of things in one: repositories, image
references, tags and digests, all checked against the OCI distribution grammar before use.

fsspec maps ``oci://`` to Oracle Cloud's object storage (ocifs), whose URLs always carry
``bucket@namespace`` in the authority. A registry's authority is ``HOST[:PORT]`` and never
holds an ``@`` (credentials never travel in a store URL), so the ``@`` tells the two apart:
``oci://bucket@namespace/prefix`` still goes to fsspec, ``oci://registry.example/team/plans``
is a registry.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...trust.display import safe_text
from ...trust.errors import ConfigError

SCHEME = "oci://"

_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]{2,45}\]")
_PORT = re.compile(r"[0-9]{1,5}")
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_REPOSITORY = 255


def is_registry_url(url: str) -> bool:
    """An ``oci://`` URL whose authority has no ``@`` (see the module docstring)."""
    if url[: len(SCHEME)].lower() != SCHEME:
        return False
    authority = url[len(SCHEME) :].split("/", 1)[0]
    return "@" not in authority


def write_options(url: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` for a store opened to write: on a registry, ``mirror_reads=false`` whatever
    was given, so that what a push reads to decide (is it stored? which manifest does the tag
    name? the subject image) comes from the registry it writes to, never from a mirror that
    may be stale or hostile. Other stores' options are returned as they are."""
    given = dict(options or {})
    return {**given, "mirror_reads": False} if is_registry_url(url) else given


@dataclass(frozen=True)
class Registry:
    """A registry's authority (``host`` or ``host:port``), and whether it is on loopback."""

    authority: str

    @property
    def hostname(self) -> str:
        host = self.authority
        if host.startswith("["):
            return host[1 : host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def loopback(self) -> bool:
        name = self.hostname
        if name == "localhost":
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False


def check_authority(authority: str, where: str) -> Registry:
    """``HOST[:PORT]`` checked.

    Raises:
        ConfigError: a bad port or host, naming ``where`` (reason ``config-error``).
    """
    host, _, port = (
        authority.rpartition(":") if not authority.endswith("]") else (authority, "", "")
    )
    if not host:
        host, port = authority, ""
    if port and (not _PORT.fullmatch(port) or not 0 < int(port) < 65536):
        raise ConfigError(f"{where}: bad port in {safe_text(authority, 80)!r}")
    if not (_HOST.fullmatch(host) or _IPV6.fullmatch(host)) or len(host) > 253:
        raise ConfigError(f"{where}: not a registry host: {safe_text(authority, 80)!r}")
    return Registry(authority.lower())


def check_repository(repository: str, where: str) -> str:
    """``repository`` checked as a distribution repository name.

    Raises:
        ConfigError: not such a name, naming ``where`` (reason ``config-error``).
    """
    if len(repository) > MAX_REPOSITORY or not _REPOSITORY.fullmatch(repository):
        raise ConfigError(
            f"{where}: not a repository name: {safe_text(repository, 80)!r} (lowercase "
            "letters, digits, separators . _ __ -, components joined by /)"
        )
    return repository


def parse_store_url(url: str) -> tuple[Registry, str]:
    """(registry, repository) of ``oci://HOST[:PORT]/REPOSITORY``; ConfigError otherwise.

    Raises:
        ConfigError: not a registry store URL (a tag or digest, credentials, a query, a bad
            host, port or repository name).
    """
    shown = safe_text(url, 120)
    if not is_registry_url(url):
        raise ConfigError(f"not a registry URL: {shown!r} (expected oci://HOST[:PORT]/REPOSITORY)")
    rest = url[len(SCHEME) :].rstrip("/")
    if any(c in rest for c in "?#"):
        raise ConfigError(f"{shown}: a registry store URL takes no query or fragment")
    authority, _, repository = rest.partition("/")
    if not repository:
        raise ConfigError(f"{shown}: name a repository (oci://HOST[:PORT]/REPOSITORY)")
    if "@" in repository or ":" in repository:
        raise ConfigError(
            f"{shown}: a store is a repository, not an image: drop the tag or digest "
            "(push --subject IMAGE attaches to an image)"
        )
    return check_authority(authority, shown), check_repository(repository, shown)


@dataclass(frozen=True)
class ImageReference:
    """An image named by ``--subject``: in the store's repository, by tag or digest."""

    repository: str
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        return self.repository + (f"@{self.digest}" if self.digest else f":{self.tag}")


def parse_image_reference(text: str, registry: Registry, repository: str) -> ImageReference:
    """``TAG``, ``@sha256:…``, ``sha256:…``, or a full ``[oci://]HOST[:PORT]/REPO(:TAG|@DIGEST)``
    in the store's own registry and repository (the referrers of an image are per repository).

    Raises:
        ConfigError: not a reference, or one to another registry or repository.
    """
    shown = safe_text(text, 120)
    ref = text[len(SCHEME) :] if text.lower().startswith(SCHEME) else text
    if DIGEST.fullmatch(ref.lstrip("@")):
        return ImageReference(repository, None, ref.lstrip("@"))
    if TAG.fullmatch(ref):
        return ImageReference(repository, ref, None)
    name, digest = ref.split("@", 1) if "@" in ref else (ref, None)
    tag = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    authority, _, repo = name.partition("/")
    if (digest is None and tag is None) or not repo:
        raise ConfigError(
            f"--subject {shown}: name an image by tag or digest (REPO:TAG, REPO@sha256:…)"
        )
    if digest is not None and not DIGEST.fullmatch(digest):
        raise ConfigError(f"--subject {shown}: not a sha256 digest")
    if tag is not None and not TAG.fullmatch(tag):
        raise ConfigError(f"--subject {shown}: not a tag")
    if check_authority(authority, f"--subject {shown}") != registry or repo != repository:
        raise ConfigError(
            f"--subject {shown}: an artifact is attached to an image of its own repository; "
            f"the store is {registry.authority}/{repository}"
        )
    return ImageReference(repository, tag if digest is None else None, digest)
