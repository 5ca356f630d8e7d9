"""A plan mirror on any fsspec URL (``s3://``, ``gs://``, ``file://``, ``memory://``, ...).

The store moves bytes and decides nothing: :meth:`Store.fetch` returns raw plan and sidecar
bytes for the trust core to verify, :meth:`Store.put_many` uploads what the caller hands it.
The remote layout mirrors vLLM's directory: ``<prefix>/startup_plan_<fp>.json`` and
``<prefix>/startup_plan_<fp>.json.sig``.

What it does guarantee is bounded cost, whatever the store does:

* every read is capped: one ranged read of ``cap + 1`` bytes (on S3 the declared length is
  checked before the body is read), so an oversized object costs at most ``cap + 1`` bytes;
* listings yield fingerprints, never paths: a name that is not exactly
  ``startup_plan_<16 hex>.json`` directly under the prefix is ignored, and local names are
  rebuilt from the fingerprint, so a hostile listing cannot steer a write;
* every operation runs under one deadline (see :mod:`plancache.storage.budget`).

fsspec and the cloud SDKs are imported here lazily, on first use: ``import plancache`` and
the trust core stay free of them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence, TypeVar

from ..trust.envelope import MAX_SIG_BYTES
from ..trust.errors import PlanCacheError, Reason
from ..trust.plan import MAX_PLAN_BYTES, fingerprint_of_plan_name, fingerprint_of_sig_name, plan_name, sig_name
from .budget import (
    CONCURRENCY,
    DEFAULT_TIMEOUT,
    GCS_HNS_ENV,
    backend_defaults,
    merge_options,
    one_line,
    with_retries,
)
from .items import Item

T = TypeVar("T")

JOIN_GRACE = 0.5
"""Extra wait on the calling thread beyond the deadline, should the event loop be stalled."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one plan or sidecar object (nothing here is trusted)."""

    name: str
    size: int | None
    md5: str | None
    """Hex MD5 of the content when the listing states it for free (S3 single-part ETag,
    GCS ``md5Hash``); push uses it to skip identical objects without downloading them."""


def cap_for(name: str) -> int:
    """The read cap of a store object by its name: the trust core's own size limits."""
    if fingerprint_of_sig_name(name):
        return MAX_SIG_BYTES
    if fingerprint_of_plan_name(name):
        return MAX_PLAN_BYTES
    raise PlanCacheError(Reason.MALFORMED, f"not a plan or signature name: {name!r}")


def _md5_of(info: Mapping[str, Any]) -> str | None:
    etag = info.get("ETag") or info.get("etag")
    if isinstance(etag, str):
        etag = etag.strip('"')
        if len(etag) == 32 and "-" not in etag:
            return etag.lower()  # S3: a single-part upload's ETag is the MD5 of its bytes
    md5 = info.get("md5Hash")
    if isinstance(md5, str):
        try:
            raw = base64.b64decode(md5, validate=True)
        except (binascii.Error, ValueError):
            return None
        return raw.hex() if len(raw) == 16 else None
    return None


def _store_error(what: str, exc: BaseException) -> PlanCacheError:
    if isinstance(exc, PlanCacheError):
        return exc
    return PlanCacheError(Reason.STORE_ERROR, f"{what}: {one_line(exc)}")


def _filesystem(protocol: str, url: str, defaults: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
    """Instantiate the fsspec filesystem, mapping every setup failure to one CONFIG line."""
    import fsspec  # lazy: see the module docstring
    from fsspec.config import conf

    if protocol in ("gs", "gcs") and os.environ.get(GCS_HNS_ENV, "").lower() not in ("true", "1"):
        try:
            from gcsfs.core import GCSFileSystem as cls  # the plain class: no gRPC bucket probe
        except ImportError:
            raise PlanCacheError(Reason.CONFIG, f"{url}: gcsfs is not installed (pip install 'plancache[gcs]')") from None
    else:
        try:
            cls = fsspec.get_filesystem_class(protocol)
        except ImportError as exc:
            hint = {"s3": "s3", "s3a": "s3"}.get(protocol)
            extra = f" (pip install 'plancache[{hint}]')" if hint else ""
            raise PlanCacheError(Reason.CONFIG, f"{url}: {one_line(exc)}{extra}") from None
        except ValueError as exc:
            raise PlanCacheError(Reason.CONFIG, f"{url}: {one_line(exc)}") from None
    protos = cls.protocol if isinstance(cls.protocol, (tuple, list)) else [cls.protocol]
    configured: dict[str, Any] = {}
    for proto in protos:
        configured = merge_options(configured, conf.get(proto))
    merged = merge_options(defaults, configured, options)
    retries = merged.pop("retries", None) if protocol in ("s3", "s3a") else None
    if protocol in ("gs", "gcs"):
        merged["requests_timeout"] = _aiohttp_timeout(merged.get("requests_timeout"))
    try:
        fs = cls(**merged)
    except PlanCacheError:
        raise
    except Exception as exc:  # bad option names or values, missing credentials files, ...
        raise PlanCacheError(Reason.CONFIG, f"cannot open {url}: {one_line(exc)}") from None
    if retries is not None:
        fs.retries = int(retries)
    return fs


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


def open_store(url: str, storage_options: Mapping[str, Any] | None = None, timeout: float | None = None) -> "Store":
    """Open the store at ``url``; ``timeout`` is the overall budget of each remote operation.

    Options: plancache's defaults for the protocol, overridden by fsspec's configuration for
    it, overridden by options in the URL, overridden by ``storage_options``.
    """
    if "://" not in url:
        raise PlanCacheError(Reason.CONFIG, f"not a store URL: {url!r} (expected e.g. s3://bucket/prefix)")
    if "::" in url:
        raise PlanCacheError(Reason.CONFIG, f"chained URLs are not supported: {url}")
    budget = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not budget > 0:
        raise PlanCacheError(Reason.CONFIG, f"the timeout must be positive, got {timeout}")
    protocol = url.split("://", 1)[0].lower()
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(protocol) if protocol not in ("gs", "gcs") else None
        from_url = cls._get_kwargs_from_urls(url) if cls is not None else {}
    except (ImportError, ValueError):
        from_url = {}
    fs = _filesystem(protocol, url, backend_defaults(protocol, budget), merge_options(from_url, storage_options))
    root = fs._strip_protocol(url)
    root = root.rstrip("/") if root not in ("/", "") else root
    return Store(fs, url.rstrip("/"), root, budget)


class Store:
    """Plans and sidecars under one prefix of an fsspec filesystem, with bounded operations."""

    def __init__(self, fs: Any, url: str, root: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.fs = fs
        self.url = url
        self.root = root
        self.timeout = timeout
        self._async = bool(getattr(fs, "async_impl", False))
        self._s3 = type(fs).__module__.startswith("s3fs")

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Store({self.url!r}, timeout={self.timeout})"

    # -- plumbing ---------------------------------------------------------------------------

    def path(self, name: str) -> str:
        return f"{self.root}/{name}" if self.root not in ("", "/") else f"{self.root.rstrip('/')}/{name}"

    def _loop(self) -> asyncio.AbstractEventLoop:
        if self._async:
            return self.fs.loop  # type: ignore[no-any-return]
        from fsspec.asyn import get_loop

        return get_loop()

    def _deadline(self, deadline: float | None) -> float:
        return time.monotonic() + self.timeout if deadline is None else deadline

    def _run(self, make: Callable[[], Awaitable[T]], deadline: float, what: str) -> T:
        """Run a coroutine on fsspec's loop; cancel it and raise TIMEOUT at the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PlanCacheError(Reason.TIMEOUT, f"{what} {self.url}: no time left in the budget")

        async def bounded() -> T:
            return await asyncio.wait_for(make(), remaining)

        future = asyncio.run_coroutine_threadsafe(bounded(), self._loop())
        try:
            return future.result(remaining + JOIN_GRACE)
        except TimeoutError:
            future.cancel()
            raise PlanCacheError(
                Reason.TIMEOUT, f"{what} {self.url}: no answer within the {self.timeout:g} s budget"
            ) from None
        except PlanCacheError:
            raise
        except Exception as exc:
            raise _store_error(f"{what} {self.url}", exc) from None

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``fs._name(...)`` on async filesystems, ``fs.name(...)`` in a thread otherwise."""
        if self._async:
            return await getattr(self.fs, f"_{name}")(*args, **kwargs)
        return await asyncio.to_thread(getattr(self.fs, name), *args, **kwargs)

    async def _read_capped(self, name: str, deadline: float) -> bytes | None:
        """One object's bytes (None if absent), at most its cap; TOO_LARGE beyond it."""
        cap = cap_for(name)
        path = self.path(name)

        async def attempt() -> bytes:
            if self._s3:
                return await self._s3_read(path, cap)
            return bytes(await self._call("cat_file", path, start=0, end=cap + 1))

        try:
            data = await with_retries(attempt, deadline)
        except FileNotFoundError:
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _store_error(f"cannot read {name}", exc) from None
        if len(data) > cap:
            raise PlanCacheError(Reason.TOO_LARGE, f"{name} in the store is larger than {cap} bytes")
        return data

    async def _s3_read(self, path: str, cap: int) -> bytes:
        """A ranged GET whose declared length is checked before a byte of the body is read,
        and whose body is read at most to ``cap + 1`` even if the server ignores the range."""
        bucket, key, _ = self.fs.split_path(path)
        try:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{cap}")
        except OSError as exc:
            text = str(exc)
            if "InvalidRange" in text or "416" in text or "range is not satisfiable" in text:
                return b""  # S3 answers a range over an empty object with 416: it is empty
            raise
        body = resp["Body"]
        try:
            length = resp.get("ContentLength")
            if isinstance(length, int) and length > cap:
                raise PlanCacheError(Reason.TOO_LARGE, f"{key.rsplit('/', 1)[-1]} in the store is {length} bytes, the cap is {cap}")
            chunks: list[bytes] = []
            got = 0
            while got <= cap:
                chunk = await body.read(min(1 << 16, cap + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            if isinstance(length, int) and got < length:
                raise PlanCacheError(Reason.STORE_ERROR, f"truncated body: {got} of {length} bytes")
            return b"".join(chunks)
        finally:
            body.close()

    # -- reads ------------------------------------------------------------------------------

    def list_objects(self, deadline: float | None = None) -> dict[str, ObjectInfo]:
        """Plan and sidecar objects directly under the prefix; every other name is ignored."""
        deadline = self._deadline(deadline)

        async def listing() -> list[Any]:
            try:
                if self._async:
                    return await with_retries(lambda: self.fs._ls(self.root, detail=True, refresh=True), deadline)
                return await asyncio.to_thread(self.fs.ls, self.root, detail=True)
            except FileNotFoundError:
                return []

        entries = self._run(listing, deadline, "cannot list")
        found: dict[str, ObjectInfo] = {}
        prefix = self.path("")
        for entry in entries:
            if not isinstance(entry, Mapping):
                continue
            full = entry.get("name")
            if not isinstance(full, str) or entry.get("type", "file") != "file":
                continue
            full = self.fs._strip_protocol(full)
            name = full[len(prefix):] if full.startswith(prefix) else None
            if name is None or not (fingerprint_of_plan_name(name) or fingerprint_of_sig_name(name)):
                continue  # hostile or foreign: never a path we act on
            size = entry.get("size")
            found[name] = ObjectInfo(name, size if type(size) is int else None, _md5_of(entry))
        return found

    def fingerprints(self, deadline: float | None = None) -> list[str]:
        """Fingerprints of the plans under the prefix, sorted; hostile names are ignored."""
        names = self.list_objects(deadline)
        return sorted({fp for fp in map(fingerprint_of_plan_name, names) if fp is not None})

    async def _fetch(self, fp: str, deadline: float) -> tuple[bytes | None, bytes | None]:
        plan, sig = await asyncio.gather(
            self._read_capped(plan_name(fp), deadline), self._read_capped(sig_name(fp), deadline)
        )
        return (None, None) if plan is None else (plan, sig)

    def fetch(self, fp: str, deadline: float | None = None) -> tuple[bytes | None, bytes | None]:
        """(plan bytes, sidecar bytes), both requested at once: one round trip. Plan None when
        absent; raises STORE_ERROR, TIMEOUT or TOO_LARGE. ``deadline`` is ``time.monotonic()``."""
        plan_name(fp)  # validates the fingerprint before anything touches the network
        deadline = self._deadline(deadline)
        return self._run(lambda: self._fetch(fp, deadline), deadline, f"cannot fetch {fp} from")

    def fetch_items(
        self,
        fingerprints: Sequence[str],
        deadline: float | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> list[Item]:
        """Items for many fingerprints, fetched concurrently, in input order.

        A fingerprint that failed carries its ``PlanCacheError``; at the deadline, those not
        yet fetched carry ``TIMEOUT``, and those already fetched are kept.
        """
        for fp in fingerprints:
            plan_name(fp)
        deadline = self._deadline(deadline)
        results: dict[int, Item] = {}

        async def one(index: int, fp: str, gate: asyncio.Semaphore) -> None:
            async with gate:
                try:
                    plan, sig = await self._fetch(fp, deadline)
                    results[index] = (fp, plan, sig)
                except PlanCacheError as exc:
                    results[index] = (fp, exc, None)
            if on_done:
                on_done(1)

        async def everything() -> None:
            gate = asyncio.Semaphore(CONCURRENCY)
            await asyncio.gather(*(one(i, fp, gate) for i, fp in enumerate(fingerprints)))

        try:
            if fingerprints:
                self._run(everything, deadline, "cannot fetch plans from")
        except PlanCacheError as exc:
            if exc.reason is not Reason.TIMEOUT:
                raise
            late = exc
            return [results.get(i, (fp, late, None)) for i, fp in enumerate(fingerprints)]
        return [results[i] for i in range(len(fingerprints))]

    # -- writes -----------------------------------------------------------------------------

    def put_many(
        self,
        objects: Mapping[str, bytes],
        deadline: float | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> None:
        """Upload ``{name: bytes}`` (plan and sidecar names only) concurrently.

        Order among objects is not guaranteed: a reader racing a push may see a new plan with
        an old sidecar, which fails verification (costs a profiling run, never a wrong plan).
        """
        for name in objects:
            cap = cap_for(name)
            if len(objects[name]) > cap:
                raise PlanCacheError(Reason.TOO_LARGE, f"{name} is larger than {cap} bytes")
        self._each(
            list(objects), lambda name: self._call("pipe_file", self.path(name), objects[name]),
            "upload to", self._deadline(deadline), on_done,
        )

    def put(self, fp: str, plan_bytes: bytes, sig_bytes: bytes | None, deadline: float | None = None) -> None:
        """Upload one plan and, when given, its sidecar (concurrently)."""
        objects = {plan_name(fp): plan_bytes}
        if sig_bytes is not None:
            objects[sig_name(fp)] = sig_bytes
        self.put_many(objects, deadline)

    def delete(self, fingerprints: Iterable[str], deadline: float | None = None) -> None:
        """Delete plans and their sidecars; objects already gone are not an error."""
        names = [n for fp in fingerprints for n in (plan_name(fp), sig_name(fp))]
        self._each(names, lambda name: self._call("rm_file", self.path(name)), "delete from", self._deadline(deadline),
                   missing_ok=True)

    def _each(
        self,
        names: Sequence[str],
        action: Callable[[str], Awaitable[Any]],
        what: str,
        deadline: float,
        on_done: Callable[[int], None] | None = None,
        missing_ok: bool = False,
    ) -> None:
        """Run ``action`` on every object name concurrently, each retried within the deadline."""

        async def one(name: str, gate: asyncio.Semaphore) -> None:
            async with gate:
                try:
                    await with_retries(lambda: action(name), deadline)
                except FileNotFoundError as exc:
                    if not missing_ok:
                        raise _store_error(f"cannot {what} {self.url} ({name})", exc) from None
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    raise _store_error(f"cannot {what} {self.url} ({name})", exc) from None
            if on_done:
                on_done(1)

        async def everything() -> None:
            gate = asyncio.Semaphore(CONCURRENCY if self._async else 8)
            await asyncio.gather(*(one(n, gate) for n in names))

        if names:
            self._run(everything, deadline, f"cannot {what}")


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
