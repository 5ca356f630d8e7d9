"""A plan mirror on any fsspec URL (``s3://``, ``gs://``, ``file://``, ``memory://``, ...).

The store moves bytes and decides nothing: :meth:`Store.fetch_many` returns raw plan and
sidecar bytes for the trust core to verify, :meth:`Store.put_many` uploads what the caller hands it.
The remote layout mirrors vLLM's directory: ``<prefix>/startup_plan_<fp>.json`` and
``<prefix>/startup_plan_<fp>.json.sig``.

What it does guarantee is bounded cost, whatever the store does:

* every read is capped: one ranged read of ``cap + 1`` bytes (on S3 the declared length is
  checked before the body is read), so an oversized object costs at most ``cap + 1`` bytes;
* listings yield fingerprints, never paths: a name that is not exactly
  ``startup_plan_<16 hex>.json`` directly under the prefix is ignored, and local names are
  rebuilt from the fingerprint, so a hostile listing cannot steer a write;
* every operation runs under one deadline (see :mod:`plancache.storage.deadline`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence, TypeVar

from ..trust.envelope import MAX_SIG_BYTES
from ..trust.errors import PlanCacheError, Reason, Rejected, StoreError
from ..trust.plan import MAX_PLAN_BYTES, fingerprint_of_plan_name, fingerprint_of_sig_name, plan_name, sig_name
from ..trust.result import PlanResult
from .backends import CONCURRENCY, open_filesystem
from .deadline import DEFAULT_TIMEOUT, checked_budget, http_status, run_by, store_error, with_retries

T = TypeVar("T")

SYNC_CONCURRENCY = 8
"""Threads in flight for filesystems without an async implementation (file://, memory://)."""


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
    raise Rejected(Reason.MALFORMED, f"not a plan or signature name: {name!r}")


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


def open_store(url: str, storage_options: Mapping[str, Any] | None = None, timeout: float | None = None) -> "Store":
    """Open the store at ``url``; ``timeout`` is the overall budget of each remote operation.

    Options: plancache's defaults for the protocol, overridden by fsspec's configuration for
    it, overridden by options in the URL, overridden by ``storage_options``.
    """
    budget = checked_budget(timeout)
    fs, root = open_filesystem(url, storage_options, budget)
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
        return run_by(self._loop(), make, deadline, f"{what} {self.url}", self.timeout)

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
            raise store_error(f"cannot read {name}", exc) from None
        if len(data) > cap:
            raise Rejected(Reason.TOO_LARGE, f"{name} in the store is larger than {cap} bytes")
        return data

    async def _s3_read(self, path: str, cap: int) -> bytes:
        """A ranged GET whose declared length is checked before a byte of the body is read,
        and whose body is read at most to ``cap + 1`` even if the server ignores the range."""
        bucket, key, _ = self.fs.split_path(path)
        try:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{cap}")
        except OSError as exc:
            if http_status(exc) == 416:
                return b""  # S3 answers a range over an empty object with 416: it is empty
            raise
        body = resp["Body"]
        try:
            length = resp.get("ContentLength")
            if isinstance(length, int) and length > cap:
                name = key.rsplit("/", 1)[-1]
                raise Rejected(Reason.TOO_LARGE, f"{name} in the store is {length} bytes, the cap is {cap}")
            chunks: list[bytes] = []
            got = 0
            while got <= cap:
                chunk = await body.read(min(1 << 16, cap + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            if isinstance(length, int) and got < length:
                raise StoreError(f"truncated body: {got} of {length} bytes", transient=True)
            return b"".join(chunks)
        finally:
            body.close()

    async def _each(
        self,
        keys: Sequence[str],
        action: Callable[[str], Awaitable[T]],
        what: str,
        on_done: Callable[[int], None] | None,
    ) -> dict[str, T | PlanCacheError]:
        """``action`` on every key, at most CONCURRENCY at once; each key's result or typed error.

        The one concurrency helper behind fetch, upload and delete. Actions retry on their own
        (:func:`~plancache.storage.deadline.with_retries`); a key's failure never stops the others.
        """
        results: dict[str, T | PlanCacheError] = {}
        gate = asyncio.Semaphore(CONCURRENCY if self._async else SYNC_CONCURRENCY)

        async def one(key: str) -> None:
            async with gate:
                try:
                    results[key] = await action(key)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    results[key] = store_error(f"cannot {what} {key}", exc)
            if on_done:
                on_done(1)

        await asyncio.gather(*(one(k) for k in keys))
        return results

    def _each_by(
        self,
        keys: Sequence[str],
        action: Callable[[str], Awaitable[T]],
        what: str,
        deadline: float,
        on_done: Callable[[int], None] | None = None,
    ) -> dict[str, T | PlanCacheError]:
        """:meth:`_each` from a synchronous caller; keys not done at the deadline get its StoreTimeout."""
        if not keys:
            return {}
        done: dict[str, T | PlanCacheError] = {}

        async def everything() -> None:
            done.update(await self._each(keys, action, what, on_done))

        try:
            self._run(everything, deadline, f"cannot {what}")
        except PlanCacheError as exc:
            return {key: done.get(key, exc) for key in keys}
        return done

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

    def fetch_many(
        self,
        fingerprints: Sequence[str],
        deadline: float | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> list[PlanResult]:
        """Plan and sidecar bytes of each fingerprint, both requested at once, in input order.

        Raw and unverified. A plan that is absent is a result with no bytes and no error; one
        that failed carries its typed error; at the deadline, those not yet fetched carry
        StoreTimeout and those already fetched are kept.
        """
        for fp in fingerprints:
            plan_name(fp)  # validates every fingerprint before anything touches the network
        deadline = self._deadline(deadline)

        async def pair(fp: str) -> tuple[bytes | None, bytes | None]:
            plan, sig = await asyncio.gather(
                self._read_capped(plan_name(fp), deadline), self._read_capped(sig_name(fp), deadline)
            )
            return (None, None) if plan is None else (plan, sig)

        got = self._each_by(list(dict.fromkeys(fingerprints)), pair, "fetch", deadline, on_done)
        results = []
        for fp in fingerprints:
            outcome = got[fp]
            if isinstance(outcome, PlanCacheError):
                results.append(PlanResult(fp, "store", error=outcome))
            else:
                results.append(PlanResult(fp, "store", plan_bytes=outcome[0], sig_bytes=outcome[1]))
        return results

    def fetch(self, fp: str, deadline: float | None = None) -> PlanResult:
        """One fingerprint's plan and sidecar in one round trip (see :meth:`fetch_many`)."""
        return self.fetch_many([fp], deadline)[0]

    # -- writes -----------------------------------------------------------------------------

    def put_many(
        self,
        objects: Mapping[str, bytes],
        deadline: float | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> None:
        """Upload ``{name: bytes}`` (plan and sidecar names only) concurrently; raises the first failure.

        Order among objects is not guaranteed: a reader racing a push may see a new plan with
        an old sidecar, which fails verification (costs a profiling run, never a wrong plan).
        """
        for name in objects:
            cap = cap_for(name)
            if len(objects[name]) > cap:
                raise Rejected(Reason.TOO_LARGE, f"{name} is larger than {cap} bytes")
        deadline = self._deadline(deadline)

        async def upload(name: str) -> None:
            await with_retries(lambda: self._call("pipe_file", self.path(name), objects[name]), deadline)

        _raise_first(self._each_by(list(objects), upload, f"upload to {self.url}", deadline, on_done))

    def put(self, fp: str, plan_bytes: bytes, sig_bytes: bytes | None, deadline: float | None = None) -> None:
        """Upload one plan and, when given, its sidecar (concurrently)."""
        objects = {plan_name(fp): plan_bytes}
        if sig_bytes is not None:
            objects[sig_name(fp)] = sig_bytes
        self.put_many(objects, deadline)

    def delete(self, fingerprints: Iterable[str], deadline: float | None = None) -> None:
        """Delete plans and their sidecars; objects already gone are not an error."""
        names = [n for fp in fingerprints for n in (plan_name(fp), sig_name(fp))]
        deadline = self._deadline(deadline)

        async def remove(name: str) -> None:
            try:
                await with_retries(lambda: self._call("rm_file", self.path(name)), deadline)
            except FileNotFoundError:
                pass

        _raise_first(self._each_by(names, remove, f"delete from {self.url}", deadline))


def _raise_first(results: Mapping[str, object]) -> None:
    for outcome in results.values():
        if isinstance(outcome, PlanCacheError):
            raise outcome


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
