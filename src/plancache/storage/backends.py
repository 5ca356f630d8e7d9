"""Opening fsspec filesystems with plancache's defaults for each SDK (which backend class holds
one: :func:`.store.open_backend`).

The SDKs' defaults would make a booting worker wait for minutes: s3fs retries at two layers
of its own on top of botocore's retries (a black-holed endpoint took 423 s), gcsfs sets no
request timeout at all and retries six times with exponential backoff. So plancache

* switches the SDK retry layers off (botocore ``total_max_attempts=1``, s3fs ``retries=1``,
  gcsfs's retry decorator)
  and retries transient failures itself inside the deadline (:mod:`.deadline`);
* gives every request connect and read timeouts derived from the budget;
* keeps s3fs off its HEAD-before-GET path (``max_concurrency=1``; plancache also always reads
  with a byte range, which s3fs serves with one ranged GET);
* uses gcsfs's plain ``GCSFileSystem`` unless ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` is set
  to true explicitly, so no bucket-type probe goes through gRPC (55 s per call against an
  emulator);
* opens Azure Blob (``az://``, ``abfs://``, ``abfss://``) with :mod:`.azure.blob`'s subclass of
  adlfs's filesystem, whose client has no SDK retries and plancache's capped transport.

Every default yields to fsspec's own configuration (``FSSPEC_S3_*`` variables, fsspec config
files), then to options in the URL, then to explicit storage options; what the SDKs read
from the environment (``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``, credential chains) is
left to them. fsspec and the SDKs are imported here lazily, on first use.
"""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..clock import REAL_CLOCK, Clock
from ..trust.errors import ConfigError, PlanCacheError
from .deadline import one_line
from .fsspec_backends import CONCURRENCY

GCS_HNS_ENV = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"

AZURE_PROTOCOLS = ("az", "abfs", "abfss")

HTTP_PROTOCOLS = ("http", "https")
"""fsspec's HTTPFileSystem: a store on a plain web server (``any other fsspec protocol``)."""


class FilesystemClass(Protocol):
    """An fsspec filesystem class, as plancache reads it before making the filesystem (fsspec
    ships no types; an instance is ``Any``, see :mod:`.fsspec_backends`)."""

    protocol: str | tuple[str, ...]

    def __call__(self, **options: Any) -> Any: ...

    def _get_kwargs_from_urls(self, path: str) -> dict[str, Any]: ...

    def _strip_protocol(self, path: str) -> str: ...


def request_timeouts(budget: float) -> tuple[float, float]:
    """(connect, read) timeouts for one request: a fraction of the budget, within sane bounds.

    A read timeout below the budget lets a silent connection be dropped and retried while
    time remains; the overall deadline still bounds a body that trickles in forever.
    """
    connect = min(max(budget / 3, 0.2), 3.0)
    read = min(max(budget / 2, 0.5), 15.0)
    return connect, read


def backend_defaults(protocol: str, budget: float) -> dict[str, Any]:
    """plancache's storage options for one protocol (explicit options override them)."""
    connect, read = request_timeouts(budget)
    if protocol in ("s3", "s3a"):
        return {
            "max_concurrency": 1,
            "use_listings_cache": False,
            "retries": 1,  # not an s3fs constructor argument: applied to the instance
            "config_kwargs": {
                "connect_timeout": connect,
                "read_timeout": read,
                "retries": {"total_max_attempts": 1, "mode": "standard"},
                "max_pool_connections": CONCURRENCY,
            },
        }
    if protocol in ("gs", "gcs"):
        return {
            "requests_timeout": {"total": None, "sock_connect": connect, "sock_read": read},
        }
    if protocol in AZURE_PROTOCOLS:
        return {"connection_timeout": connect, "read_timeout": read}
    if protocol == "file":
        return {"auto_mkdir": True}
    return {}


def merge_options(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Later layers win; nested dicts (``config_kwargs``, ``client_kwargs``) merge key by key."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = merge_options(out[key], value)
            else:
                out[key] = value
    return out


def _filesystem_class(protocol: str, url: str) -> FilesystemClass:
    """The fsspec filesystem class for ``protocol``; ConfigError if it cannot be had."""
    import fsspec  # lazy: see the module docstring

    if protocol in ("gs", "gcs") and os.environ.get(GCS_HNS_ENV, "").lower() not in ("true", "1"):
        try:
            with warnings.catch_warnings():  # google-api-core warns on stderr under Python 3.10
                warnings.simplefilter("ignore", FutureWarning)
                from gcsfs.core import GCSFileSystem  # the plain class: no gRPC bucket probe
        except ImportError:
            raise ConfigError(
                f"{url}: gcsfs is not installed (pip install 'plancache[gcs]')"
            ) from None
        return GCSFileSystem
    if protocol in AZURE_PROTOCOLS:
        try:
            from .azure.blob import BoundedAzureBlobFileSystem
        except ImportError:
            raise ConfigError(
                f"{url}: adlfs is not installed (pip install 'plancache[azure]')"
            ) from None
        return BoundedAzureBlobFileSystem
    try:
        return fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        hint = {"s3": "s3", "s3a": "s3"}.get(protocol)
        extra = f" (pip install 'plancache[{hint}]')" if hint else ""
        raise ConfigError(f"{url}: {one_line(exc)}{extra}") from None
    except ValueError as exc:
        raise ConfigError(f"{url}: {one_line(exc)}{_nearest_protocol(protocol)}") from None


def _nearest_protocol(protocol: str) -> str:
    """``; did you mean 'oci://'?`` for a mistyped scheme (``oic://``), or nothing: the
    protocols fsspec knows, plus the registry's own ``oci``."""
    import difflib

    import fsspec

    known = {*fsspec.available_protocols(), "oci"}
    match = difflib.get_close_matches(protocol, sorted(known), n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}://'?" if match else ""


def _opener(
    cls: FilesystemClass,
    protocol: str,
    url: str,
    defaults: Mapping[str, Any],
    options: Mapping[str, Any],
) -> Callable[[], Any]:
    """A function instantiating the filesystem, mapping every setup failure to one CONFIG line.

    The options are merged now (bad ones fail at open); the instance is made by the caller,
    who may have to do it under a deadline (GCS discovers credentials in its constructor).
    """
    from fsspec.config import conf

    protos = cls.protocol if isinstance(cls.protocol, (tuple, list)) else [cls.protocol]
    configured: dict[str, Any] = {}
    for proto in protos:
        configured = merge_options(configured, conf.get(proto))
    merged = merge_options(defaults, configured, options, _hardening(protocol))
    retries = merged.pop("retries", None) if protocol in ("s3", "s3a") else None
    if protocol in ("gs", "gcs"):
        merged["requests_timeout"] = _aiohttp_timeout(merged.get("requests_timeout"))

    def instantiate() -> Any:
        try:
            fs = cls(**merged)
        except PlanCacheError:
            raise
        except Exception as exc:  # bad option names or values, missing credentials files, ...
            raise ConfigError(f"cannot open {url}: {one_line(exc)}") from None
        if retries is not None:
            fs.retries = int(retries)
        if protocol in ("gs", "gcs"):
            _without_gcsfs_retries(fs)
        return fs

    return instantiate


def _without_gcsfs_retries(fs: Any) -> None:
    """Call gcsfs's request function without its retry decorator (six tries, sleeping 1, 2,
    4, ... s between them, a refused connection included): plancache retries inside the
    deadline itself. The decorator keeps the undecorated function as ``__wrapped__``."""
    request = getattr(type(fs), "_request", None)
    undecorated = getattr(request, "__wrapped__", None)
    if undecorated is not None:
        fs._request = types.MethodType(undecorated, fs)


def _hardening(protocol: str) -> dict[str, Any]:
    """Options applied over every other layer: body caps and no redirects (:mod:`.caps.http`),
    and a filesystem of our own per store.

    Not defaults an option may switch off: they are what keeps a hostile endpoint bounded.
    fsspec otherwise hands back a cached instance for the same options, whose credentials and
    endpoint may come from an environment that has changed since (``AWS_ENDPOINT_URL``,
    ``AZURE_STORAGE_CONNECTION_STRING``), and whose attributes plancache sets per budget.
    """
    own = {"skip_instance_cache": True}
    if protocol in ("s3", "s3a"):
        from .caps.http import capped_aiobotocore_session

        return {**own, "config_kwargs": {"http_session_cls": capped_aiobotocore_session()}}
    if protocol in ("gs", "gcs"):
        from .caps.http import session_kwargs

        return {**own, "session_kwargs": session_kwargs()}
    if protocol in HTTP_PROTOCOLS:
        # fsspec's HTTPFileSystem reads a body whole (``await r.read()``), the range it asked
        # for or not, and inflates gzip: capped and never inflated like gcsfs's session (its
        # redirects are left to it: a plain web server may send a store elsewhere)
        from .caps.http import CappedResponse

        return {
            **own,
            "client_kwargs": {
                "response_class": CappedResponse,
                "auto_decompress": False,
                "headers": {"Accept-Encoding": "identity"},
            },
        }
    return own


def _aiohttp_timeout(value: Any) -> Any:
    """gcsfs passes ``requests_timeout`` to aiohttp: accept seconds or a dict of its fields."""
    if value is None:
        return None
    import aiohttp

    if isinstance(value, (int, float)):
        return aiohttp.ClientTimeout(total=float(value))
    if isinstance(value, Mapping):
        return aiohttp.ClientTimeout(**value)
    return value


def filesystem_opener(
    url: str,
    storage_options: Mapping[str, Any] | None,
    budget: float,
    *,
    clock: Clock = REAL_CLOCK,
) -> tuple[type | FilesystemClass, Callable[[], Any], str]:
    """(filesystem class, a function making the instance, root path).

    Everything that can be checked without a network call is checked here; the function fails
    with ConfigError too (bad option names or values, missing credentials files).

    Raises:
        ConfigError: not a store URL, a chained URL, or a backend that is not installed or does
            not take the protocol (reason ``config-error``).
    """
    if "://" not in url:
        raise ConfigError(f"not a store URL: {url!r} (expected e.g. s3://bucket/prefix)")
    if "::" in url:
        raise ConfigError(f"chained URLs are not supported: {url}")
    protocol = url.split("://", 1)[0].lower()
    if protocol == "oci" and "@" not in url.split("://", 1)[1].split("/", 1)[0]:
        try:  # a registry; ocifs URLs hold bucket@ns
            from .oci.registry_open import registry_opener
        except ImportError as exc:
            if (exc.name or "").split(".")[0] != "aiohttp":
                raise
            raise ConfigError(
                f"{url}: aiohttp is not installed (pip install 'plancache[oci]')"
            ) from None

        return registry_opener(url, storage_options or {}, request_timeouts(budget), clock=clock)
    cls = _filesystem_class(protocol, url)
    try:
        from_url = cls._get_kwargs_from_urls(url)
    except (ImportError, ValueError):
        from_url = {}
    make = _opener(
        cls,
        protocol,
        url,
        backend_defaults(protocol, budget),
        merge_options(from_url, storage_options),
    )
    root = cls._strip_protocol(url)
    root = root.rstrip("/") if root not in ("/", "") else root
    return cls, make, root
