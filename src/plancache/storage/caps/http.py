"""Caps on every HTTP body an SDK reads whole, and no redirects, for s3fs and gcsfs alike.

plancache reads plan objects itself, capped (see :mod:`..s3.reads`). But the SDKs read some
bodies whole before plancache sees anything: botocore reads every error body (and every
non-streaming success body, such as a listing page) to parse it, gcsfs reads every response
whole with ``await r.read()``. A hostile endpoint answering 500 with a 200 MiB body made a
single-fingerprint pull peak above 500 MiB. Both SDKs use aiohttp, so the cap is placed
where they meet it, in the response class: :class:`CappedResponse` reads at most

* :data:`ERROR_BODY_CAP` of an error body (status >= 300), then drops the connection and
  hands the SDK the prefix: it still parses the status (a 404 stays "not found", a 500
  stays worth a retry), and a cut-off error document only costs its message;
* :data:`BODY_CAP` of a success body by default (a listing page), or the cap a caller sets
  for the current task with :func:`body_cap` (an object read); beyond it, ``TOO_LARGE``.

aiohttp follows redirects to any host by default; :func:`redirect_refusal` stops that
before a byte goes to the other host: neither S3 nor GCS redirects an API call anywhere an
SDK should follow.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp

from ...trust.errors import Reason, Rejected, StoreError
from .bodies import BODY_CAP, CHUNK, ERROR_BODY_CAP, check_complete, check_declared

_task_cap: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "plancache_body_cap", default=None
)


@contextlib.contextmanager
def body_cap(cap: int) -> Iterator[None]:
    """Cap whole-body reads of success responses at ``cap`` bytes in the current task."""
    token = _task_cap.set(cap)
    try:
        yield
    finally:
        _task_cap.reset(token)


class CappedResponse(aiohttp.ClientResponse):
    """An aiohttp response whose whole-body ``read()`` stops at a cap (see the module docs).

    Streaming reads (``response.content.read(n)``) are untouched: their callers bound them.
    """

    async def read(self) -> bytes:
        """The body, read at most to the cap (an error body cut to it, see the module).

        Raises:
            Rejected: a success body larger than the cap (reason ``too-large``); the connection
                is closed, never returned to the pool.
        """
        if self._body is None:
            error = self.status >= 300
            cap = ERROR_BODY_CAP if error else (_task_cap.get() or BODY_CAP)
            data = bytearray()
            try:
                while len(data) <= cap:
                    chunk = await self.content.read(min(CHUNK, cap + 1 - len(data)))
                    if not chunk:
                        break
                    data += chunk
            except BaseException:
                self.close()
                raise
            if len(data) > cap:
                self.close()  # the rest is never read: the connection goes, not back to the pool
                if not error:
                    raise Rejected(
                        Reason.TOO_LARGE,
                        f"a response from {self.url.host} is larger than {cap} bytes",
                    )
                self._body = bytes(data[:cap])
                return self._body
            self._body = bytes(data)
        return await super().read()  # the body is set: aiohttp only releases the connection


async def _refuse(params: aiohttp.TraceRequestRedirectParams, target: str) -> None:
    response = params.response
    response.close()
    raise StoreError(
        f"{params.url.host} answered {response.status} redirecting to {target[:200]!r}: "
        "not followed"
    )


async def _refuse_redirect(
    session: Any, context: Any, params: aiohttp.TraceRequestRedirectParams
) -> None:
    await _refuse(
        params, params.response.headers.get("Location") or params.response.headers.get("URI") or ""
    )


async def _refuse_located_redirect(
    session: Any, context: Any, params: aiohttp.TraceRequestRedirectParams
) -> None:
    """For botocore: a 3xx without a Location (S3's 301 PermanentRedirect for a bucket in another
    region, named in ``x-amz-bucket-region``) goes on to botocore, whose region redirector re-signs
    for that region; aiohttp itself follows nothing without a Location."""
    target = params.response.headers.get("Location") or params.response.headers.get("URI")
    if target is not None:
        await _refuse(params, target)


@functools.cache
def redirect_refusal(for_botocore: bool = False) -> aiohttp.TraceConfig:
    """A trace config that raises StoreError where aiohttp would follow a redirect (and, unless
    ``for_botocore``, on any 3xx: gcsfs would take a 3xx's body for the object's bytes)."""
    config = aiohttp.TraceConfig()
    config.on_request_redirect.append(
        _refuse_located_redirect if for_botocore else _refuse_redirect
    )
    return config


def session_kwargs(for_botocore: bool = False) -> dict[str, Any]:
    """Keyword arguments for an ``aiohttp.ClientSession`` that caps bodies and refuses redirects.

    Compressed bodies are not decoded (a small gzip bomb would inflate past any read cap in
    one step), and ``identity`` is asked for, as botocore does. The same objects every call, so
    fsspec's instance cache still recognises equal options.
    """
    return {
        "response_class": CappedResponse,
        "trace_configs": [redirect_refusal(for_botocore)],
        "auto_decompress": False,
        "headers": {"Accept-Encoding": "identity"},
    }


@functools.cache
def capped_aiobotocore_session() -> type:
    """aiobotocore's HTTP session class with :func:`session_kwargs` applied to its aiohttp session.

    aiobotocore offers no hook for the aiohttp session's arguments, so this overrides
    ``_get_session`` (aiobotocore >= 2.20).

    Raises:
        ConfigError: the installed aiobotocore has no such hook: plancache refuses to run
            uncapped (reason ``config-error``).
    """
    from aiobotocore.httpsession import AIOHTTPSession

    from ...trust.errors import ConfigError

    if not hasattr(AIOHTTPSession, "_get_session") or not hasattr(
        AIOHTTPSession, "_create_connector"
    ):
        raise ConfigError(
            "this aiobotocore has no per-session hook: plancache needs a newer aiobotocore"
        )

    class CappedAIOHTTPSession(AIOHTTPSession):
        async def _get_session(self, proxy_url: str | None) -> aiohttp.ClientSession:
            session = self._sessions.get(proxy_url)
            if session is None:
                async with self._sessions_lock:
                    session = self._sessions.get(proxy_url)
                    if session is None:
                        connector = await self._create_connector(proxy_url)
                        session = aiohttp.ClientSession(
                            connector=connector,
                            timeout=self._timeout,
                            skip_auto_headers={"CONTENT-TYPE"},
                            **session_kwargs(for_botocore=True),
                        )
                        self._sessions[proxy_url] = await self._exit_stack.enter_async_context(
                            session
                        )
            return session

    return CappedAIOHTTPSession


async def read_declared(
    read: Callable[[int], Awaitable[bytes]], name: str, cap: int, declared: Any
) -> bytes:
    """A ranged read's body: its declared length checked against ``cap`` before a byte is read,
    then at most ``cap + 1`` bytes however much the server sends (it may ignore the range).

    Shared by the S3 and Azure read paths, whose SDKs hand back a stream of the same shape
    (:func:`.bodies.read_upto` is its blocking twin, for the plain-botocore path).
    """
    check_declared(name, cap, declared)
    chunks: list[bytes] = []
    got = 0
    while got <= cap:
        chunk = await read(min(CHUNK, cap + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    check_complete(got, declared)
    return b"".join(chunks)
