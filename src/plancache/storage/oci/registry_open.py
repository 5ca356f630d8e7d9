"""Opening ``oci://HOST[:PORT]/REPOSITORY``: the storage options a registry takes, checked.

* ``plain_http``: ``true`` for HTTP, not HTTPS, to the registry itself. The default on a
  loopback registry without ``ca_file`` (a registry there that speaks TLS is said to: give its
  ``ca_file``); for any other host it must be asked for, and credentials are still never sent
  over it. It is the origin's alone: a mirror's scheme is the mirror's own configuration's;
* ``ca_file``: a PEM bundle of the CAs the registry's (and its token service's) certificate
  chains to (a regular file, read capped: a FIFO is refused, never waited on);
* ``token_realms``: hosts (comma-separated) besides the registry's own whose token service
  may be sent the registry's credentials (:mod:`.access.registry_session` says why only these);
* ``auth_file``: a docker ``config.json`` or podman ``auth.json`` read before the usual
  places (:mod:`.access.credential_files`);
* ``mirror``: ``HOST[:PORT]`` (or ``https://…``, ``http://…``) of a pull-through mirror every
  read goes to; writes and deletes go to the registry. Without it, the mirror the node's
  container runtime is configured with, if any (:mod:`.mirrors`). Its scheme is its own:
  ``http://`` here, ``http://`` in ``hosts.toml``, ``insecure = true`` in ``registries.conf``
  make the mirror plain HTTP (never given a secret off loopback) and leave the registry on TLS;
* ``mirror_reads``: ``false`` to read the registry itself even where a mirror is configured
  (what ``verify``, ``ls`` and ``prune --dry-run`` do unless told ``mirror_reads=true``: an
  audit audits the registry; and what every push and every prune that deletes does, whatever
  it is told: :func:`.registry_urls.write_options`);
* ``mirror_config``: where that configuration is (a containerd hosts directory, a
  ``hosts.toml`` or a ``registries.conf``), or ``none`` to read none;
* ``subject``: an image of the repository (``TAG``, ``@sha256:…``, ``HOST/REPO:TAG``): pushes
  attach to it, reads and listings see only what is attached to it;
* ``connect_timeout``, ``read_timeout``: per-request timeouts (default: from the budget, as
  for every store).

Nothing here touches the network: the first request is made by the first operation, under
its deadline.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from ...clock import REAL_CLOCK, Clock
from ...settings import unknown_option
from ...trust.errors import ConfigError
from ..local.files import read_config_file
from .access.credential_files import Credentials, find_credentials
from .access.registry_session import MirrorOf
from .mirrors.mirror_choice import configured_mirror
from .mirrors.mirror_hosts import MirrorHost
from .registry_urls import Registry, check_authority, parse_store_url

OPTIONS = {
    "plain_http",
    "ca_file",
    "auth_file",
    "mirror",
    "mirror_config",
    "mirror_reads",
    "token_realms",
    "subject",
    "connect_timeout",
    "read_timeout",
    "skip_instance_cache",
    "use_listings_cache",
}
"""What a registry store takes (the last two: fsspec's own, which plancache's layers may add,
meaningless here). :func:`..checks.check_options` names any other before the open, and the
opener itself does, in the same words, for a caller that opens without that check."""
BACKEND = "plancache.storage.oci.registry.RegistryBackend"


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


MAX_CA_FILE = 4 * 1024 * 1024
"""A CA bundle larger than this is not one (the system's whole bundle is about 200 KiB)."""


def _ssl(*ca_files: str) -> ssl.SSLContext | None:
    """A context trusting the system's CAs and ``ca_files``, each read as a regular file only
    and capped (a FIFO named as ``ca`` in a ``hosts.toml`` would otherwise hold the open until
    the budget)."""
    if not ca_files:
        return None
    context = ssl.create_default_context()
    for ca_file in ca_files:
        path = os.path.expanduser(ca_file)
        pem = read_config_file(path, MAX_CA_FILE, "ca_file", explicit=True)
        assert pem is not None  # explicit: absent is a ConfigError
        try:
            context.load_verify_locations(cadata=pem.decode("ascii"))
        except (UnicodeDecodeError, ValueError, ssl.SSLError) as exc:
            raise ConfigError(
                f"ca_file {path}: not a readable PEM bundle ({exc.__class__.__name__})"
            ) from None
    return context


def _endpoint(text: str, has_ca: bool, where: str) -> tuple[Registry, bool]:
    """(mirror, plain HTTP?) of ``HOST[:PORT]`` or ``scheme://HOST[:PORT]``: plain HTTP when
    its own configuration says ``http://`` (or, with no scheme, on loopback without a CA), so
    a plain in-cluster mirror needs no ``plain_http=true``, which would downgrade the origin."""
    scheme = None
    if "://" in text:
        scheme, text = text.split("://", 1)
        if scheme not in ("http", "https"):
            raise ConfigError(f"{where}: only http:// or https://")
    registry = check_authority(text.rstrip("/"), where)
    if scheme is None:
        return registry, registry.loopback and not has_ca
    return registry, scheme == "http"


def _hosts(options: Mapping[str, Any], key: str) -> frozenset[str]:
    """A comma-separated list of host names (``token_realms``), each checked."""
    text = _text(options, key)
    if text is None:
        return frozenset()
    return frozenset(
        check_authority(name.strip(), f"storage option {key}").hostname
        for name in text.split(",")
        if name.strip()
    )


def registry_opener(
    url: str,
    options: Mapping[str, Any],
    timeouts: tuple[float, float],
    *,
    clock: Clock = REAL_CLOCK,
) -> tuple[type, Callable[[], Any], str]:
    """(class, a function making the filesystem, its root) for a registry store URL.

    Raises:
        ConfigError: a bad URL, an unknown option or value, an unreadable CA bundle.
    """
    from .registry import RegistryBackend
    from .registry_http import RegistryClient

    registry, repository = parse_store_url(url)
    unknown = [key for key in options if key not in OPTIONS]
    if unknown:
        raise ConfigError(
            unknown_option(unknown[0], protocol="oci", backend=BACKEND, accepted=OPTIONS)
        )
    plain_option = _flag(options, "plain_http")
    ca_file = _text(options, "ca_file")
    auth_file = _text(options, "auth_file")
    mirror_text = _text(options, "mirror")
    mirror_config = _text(options, "mirror_config")
    subject = _text(options, "subject")
    mirror_reads = _flag(options, "mirror_reads") is not False
    token_realms = _hosts(options, "token_realms")
    timeouts = (
        _seconds(options, "connect_timeout", timeouts[0]),
        _seconds(options, "read_timeout", timeouts[1]),
    )
    context = _ssl(*([ca_file] if ca_file else []))
    if plain_option is None:
        plain = registry.loopback and ca_file is None
    else:
        plain = plain_option
    if plain and ca_file is not None:
        raise ConfigError("ca_file is for TLS: drop plain_http=true")
    plain_allowed = bool(plain_option)

    async def credentials(authority: str) -> Credentials:
        return await find_credentials(authority, auth_file)

    host = (
        MirrorHost(
            mirror_text, repository, resolves=True, pulls=True, source="storage option mirror"
        )
        if mirror_text
        else configured_mirror(registry, repository, mirror_config, os.environ)
    )
    if not mirror_reads:
        host = None
    mirror_at = None
    if host is not None:
        where = "mirror" if mirror_text else f"the mirror in {host.source}"
        has_ca = ca_file is not None or bool(host.ca_files)
        mirror_at = (*_endpoint(host.endpoint, has_ca, where), _ssl(*host.ca_files))

    def make() -> Any:
        origin = RegistryClient(
            registry,
            repository,
            plain_http=plain,
            plain_http_allowed=plain_allowed,
            ssl_context=context,
            credentials=credentials,
            timeouts=timeouts,
            token_realms=token_realms,
            clock=clock,
        )
        if host is None or mirror_at is None:
            return RegistryBackend(origin, None, subject)
        mirror = RegistryClient(
            mirror_at[0],
            host.repository,
            plain_http=mirror_at[1],
            plain_http_allowed=mirror_at[1],
            ssl_context=mirror_at[2] or context,
            credentials=credentials,
            timeouts=timeouts,
            namespace=registry.authority,
            token_realms=token_realms,
            mirror_of=MirrorOf(host.source, f"{registry.authority}/{repository}"),
            clock=clock,
        )
        return RegistryBackend(
            origin,
            mirror,
            subject,
            mirror_resolves=host.resolves,
            mirror_pulls=host.pulls,
        )

    return RegistryBackend, make, repository
