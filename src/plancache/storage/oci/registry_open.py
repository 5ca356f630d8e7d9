"""Opening ``oci://HOST[:PORT]/REPOSITORY``: the storage options a registry takes, checked.

* ``plain_http``: ``true`` for HTTP, not HTTPS. The default on a loopback registry without
  ``ca_file``; for any other host it must be asked for, and credentials are still never sent
  over it;
* ``ca_file``: a PEM bundle of the CAs the registry's (and its token service's) certificate
  chains to;
* ``auth_file``: a docker ``config.json`` or podman ``auth.json`` read before the usual
  places (:mod:`.credential_files`);
* ``mirror``: ``HOST[:PORT]`` (or ``https://…``, ``http://…``) of a pull-through mirror every
  read goes to; writes and deletes go to the registry;
* ``subject``: an image of the repository (``TAG``, ``@sha256:…``, ``HOST/REPO:TAG``): pushes
  attach to it, reads and listings see only what is attached to it;
* ``connect_timeout``, ``read_timeout``: per-request timeouts (default: from the budget, as
  for every store).

Nothing here touches the network: the first request is made by the first operation, under
its deadline.
"""

from __future__ import annotations

import difflib
import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from ...trust.errors import ConfigError
from .credential_files import Credentials, find_credentials
from .registry_urls import Registry, check_authority, parse_store_url

OPTIONS = {
    "plain_http",
    "ca_file",
    "auth_file",
    "mirror",
    "subject",
    "connect_timeout",
    "read_timeout",
}
IGNORED = {"skip_instance_cache", "use_listings_cache"}
"""fsspec's own options, which plancache's layers may add: meaningless here."""


def _flag(options: Mapping[str, Any], key: str) -> bool | None:
    value = options.get(key)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"storage option {key} must be true or false")


def _text(options: Mapping[str, Any], key: str) -> str | None:
    value = options.get(key)
    if value is None or (isinstance(value, str) and value):
        return value
    raise ConfigError(f"storage option {key} must be a non-empty string")


def _seconds(options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise ConfigError(f"storage option {key} must be a positive number of seconds")
    return float(value)


def _ssl(ca_file: str | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    path = os.path.expanduser(ca_file)
    try:
        return ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"ca_file {path}: not a readable PEM bundle ({exc.__class__.__name__})"
        ) from None


def _endpoint(text: str, plain_allowed: bool, has_ca: bool, where: str) -> tuple[Registry, bool]:
    """(registry, plain HTTP?) of ``HOST[:PORT]`` or ``scheme://HOST[:PORT]``."""
    scheme = None
    if "://" in text:
        scheme, text = text.split("://", 1)
        if scheme not in ("http", "https"):
            raise ConfigError(f"{where}: only http:// or https://")
    registry = check_authority(text.rstrip("/"), where)
    if scheme is None:
        plain = registry.loopback and not has_ca
    else:
        plain = scheme == "http"
    if plain and not (registry.loopback or plain_allowed):
        raise ConfigError(
            f"{where}: plain HTTP to {registry.authority} only with "
            "--storage-option plain_http=true"
        )
    return registry, plain


def registry_opener(
    url: str, options: Mapping[str, Any], timeouts: tuple[float, float]
) -> tuple[type, Callable[[], Any], str]:
    """(class, a function making the filesystem, its root) for a registry store URL.

    Raises:
        ConfigError: a bad URL, an unknown option or value, an unreadable CA bundle.
    """
    from .registry_fs import RegistryFileSystem
    from .registry_http import RegistryClient

    registry, repository = parse_store_url(url)
    unknown = sorted(set(options) - OPTIONS - IGNORED)
    if unknown:
        guess = difflib.get_close_matches(unknown[0], sorted(OPTIONS), n=1)
        hint = (
            f"; did you mean {guess[0]!r}?" if guess else f" (known: {', '.join(sorted(OPTIONS))})"
        )
        raise ConfigError(f"unknown storage option {unknown[0]!r} for an oci:// registry{hint}")
    plain_option = _flag(options, "plain_http")
    ca_file = _text(options, "ca_file")
    auth_file = _text(options, "auth_file")
    mirror_text = _text(options, "mirror")
    subject = _text(options, "subject")
    timeouts = (
        _seconds(options, "connect_timeout", timeouts[0]),
        _seconds(options, "read_timeout", timeouts[1]),
    )
    context = _ssl(ca_file)
    if plain_option is None:
        plain = registry.loopback and ca_file is None
    else:
        plain = plain_option
    if plain and ca_file is not None:
        raise ConfigError("ca_file is for TLS: drop plain_http=true")
    plain_allowed = bool(plain_option)

    def credentials(authority: str) -> Credentials:
        return find_credentials(authority, auth_file)

    def client(where: Registry, is_plain: bool) -> RegistryClient:
        return RegistryClient(
            where,
            repository,
            plain_http=is_plain,
            plain_http_allowed=plain_allowed,
            ssl_context=context,
            credentials=credentials,
            timeouts=timeouts,
        )

    mirror_endpoint = (
        _endpoint(mirror_text, plain_allowed, ca_file is not None, "mirror")
        if mirror_text
        else None
    )

    def make() -> Any:
        origin = client(registry, plain)
        mirror = client(*mirror_endpoint) if mirror_endpoint is not None else None
        return RegistryFileSystem(origin, mirror, subject, skip_instance_cache=True)

    return RegistryFileSystem, make, repository
