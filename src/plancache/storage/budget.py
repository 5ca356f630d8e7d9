"""Time budgets for remote operations, and plancache's defaults for the fsspec backends.

A store can be slow, down or hostile, and a booting vLLM worker must not wait on it for
minutes. The SDKs' defaults would make it wait: s3fs retries at two layers of its own on top
of botocore's retries (a black-holed endpoint took 423 s), gcsfs sets no request timeout
at all and retries six times with exponential backoff. So plancache

* wraps every remote operation in one overall deadline (``asyncio.wait_for`` on fsspec's
  event loop, plus a join timeout on the calling thread);
* switches the SDK retry layers off (botocore ``total_max_attempts=1``, s3fs ``retries=1``)
  and retries transient failures itself, with short backoff, only while the deadline allows,
  and never a refused connection (nobody is listening: failing in milliseconds is the point);
* gives every request connect and read timeouts derived from the budget;
* keeps s3fs off its HEAD-before-GET path (``max_concurrency=1``; plancache also always reads
  with a byte range, which s3fs serves with one ranged GET);
* uses gcsfs's plain ``GCSFileSystem`` unless ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` is set
  to true explicitly, so no bucket-type probe goes through gRPC (55 s per call against an
  emulator).

Every default yields to an explicit storage option (``--storage-option``) and to fsspec's
own configuration (``FSSPEC_S3_*`` variables, fsspec config files); what the SDKs read from
the environment (``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``, credential chains) is left
to them.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from ..trust.errors import PlanCacheError, Reason

T = TypeVar("T")

DEFAULT_TIMEOUT = 3.0
"""Overall budget of one remote operation when the caller names none (a boot-time pull)."""

MAX_ATTEMPTS = 3
"""Tries of one object read or write, all inside the operation's deadline."""

BACKOFF_BASE = 0.05
CONCURRENCY = 64
"""Requests in flight per operation; also the connection pool size plancache asks for."""

GCS_HNS_ENV = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"


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


def is_refused(exc: BaseException) -> bool:
    """A refused connection anywhere in the exception chain (no listener: do not retry)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError):
            return True
        text = str(current)
        if "Connection refused" in text or "Connect call failed" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def is_transient(exc: BaseException) -> bool:
    """Worth another try within the deadline: server errors, dropped or silent connections."""
    if isinstance(exc, PlanCacheError):
        return exc.reason is Reason.STORE_ERROR and exc.detail.startswith("truncated")
    if isinstance(exc, (FileNotFoundError, PermissionError, FileExistsError, NotImplementedError)):
        return False
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return False  # bad arguments or options: another try would fail the same way
    return not is_refused(exc)


async def with_retries(attempt: Callable[[], Awaitable[T]], deadline: float) -> T:
    """Run ``attempt`` up to MAX_ATTEMPTS times while transient failures leave time to retry."""
    for number in range(MAX_ATTEMPTS):
        try:
            return await attempt()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            pause = BACKOFF_BASE * (2**number) * (0.5 + random.random())
            if number == MAX_ATTEMPTS - 1 or not is_transient(exc) or time.monotonic() + pause >= deadline:
                raise
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")


def one_line(exc: BaseException) -> str:
    """An exception as one short line: SDK errors can carry multi-line XML or JSON bodies."""
    if isinstance(exc, PlanCacheError):
        return exc.detail
    text = " ".join(str(exc).split()) or type(exc).__name__
    if is_refused(exc):
        text = f"connection refused ({text})"
    return text[:300]
