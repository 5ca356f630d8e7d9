"""botocore's HTTP layer, bounded: capped bodies, no redirect, informational answers skipped.

The boot path on plain botocore (:mod:`.direct`) keeps the guarantees of the s3fs path, whose
aiohttp session :mod:`..caps.http` bounds. botocore offers no such session, so the bounds are
placed on its HTTP layer: its ``before-send`` event hands each request to
:func:`capped_send`, which sends it with botocore's own HTTP session (its proxies, TLS and
timeouts) and then bounds what botocore reads of the answer: an error body is read to
ERROR_BODY_CAP at most and a body botocore would read whole to BODY_CAP (else TOO_LARGE); a
redirect is refused; a GET's body is left to :meth:`.direct.S3Direct.read`, which reads it
capped. :func:`skip_informational` makes botocore's connections read past informational
answers as aiohttp does.

Apart from :mod:`.direct` because this is what botocore's HTTP layer needs, not what a boot
reads: it knows responses and connection pools, never a store's names or settings.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Protocol

from ...trust.errors import Reason, Rejected, StoreError
from ..caps.bodies import BODY_CAP, ERROR_BODY_CAP, check_length_header, read_upto

MAX_INFORMATIONAL = 16
"""Informational answers (``103 Early Hints``, ...) skipped before one request's final answer."""


class _RawBody(Protocol):
    """urllib3's response body, as botocore hands it over (botocore ships no types)."""

    def read(self, amt: int) -> bytes: ...

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


class _Response(Protocol):
    """botocore's ``AWSResponse``: what :func:`capped_send` reads of an answer."""

    url: str
    status_code: int
    headers: Mapping[str, str]
    raw: _RawBody


class _Request(Protocol):
    """botocore's ``AWSPreparedRequest``: whether botocore will stream the body itself."""

    stream_output: bool


class HttpSession(Protocol):
    """botocore's ``URLLib3Session``: the endpoint's sender of requests."""

    def send(self, request: _Request) -> _Response: ...


class _Buffered:
    """A body already read (capped), in the shape botocore reads responses from."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Any:
        yield self._data

    def read(self, amt: int | None = None) -> bytes:
        data, self._data = (
            (self._data, b"") if amt is None else (self._data[:amt], self._data[amt:])
        )
        return data

    def close(self) -> None:
        pass


def capped_send(http: HttpSession, request: _Request, **_: Any) -> _Response:
    """Send ``request`` with botocore's own HTTP session ``http``, then bound what botocore will
    read of the answer (see the module docstring).

    Raises:
        StoreError: an informational answer as the final one (transient), an impossible
            ``Content-Length``, or a redirect naming a ``Location`` (reason ``store-error``).
        Rejected: a success body botocore would read whole past BODY_CAP (reason
            ``too-large``).
    """
    from botocore.awsrequest import AWSResponse

    streaming, request.stream_output = request.stream_output, True
    try:
        response = http.send(request)
    finally:
        request.stream_output = streaming
    raw, status = response.raw, response.status_code
    if status < 200:  # an informational answer reached botocore as the final one: never empty
        raw.close()
        raise StoreError(f"the store answered {status} and no final answer", transient=True)
    try:
        check_length_header(response.headers.get("Content-Length"))
    except StoreError:
        raw.close()
        raise
    target = response.headers.get("Location")
    # A 3xx naming a Location is a redirect: refused. Without one (S3's 301 PermanentRedirect
    # names the bucket's region in a header), botocore's own region redirector decides.
    if 300 <= status < 400 and target is not None:
        raw.close()
        raise StoreError(
            f"the store answered {status} redirecting to {str(target)[:200]!r}: not followed"
        )
    if streaming and status < 300:
        return response  # a GET body: read by S3Direct.read, capped
    cap = ERROR_BODY_CAP if status >= 300 else BODY_CAP
    data = read_upto(raw.read, cap)
    if len(data) > cap:
        raw.close()  # the rest is never read: the connection goes, not back to the pool
        if status < 300:
            raise Rejected(
                Reason.TOO_LARGE, f"a response from the store is larger than {cap} bytes"
            )
        data = data[:cap]
    else:
        raw.release_conn()
    return AWSResponse(response.url, status, response.headers, _Buffered(data))


@functools.cache
def _pools() -> dict[str, type] | None:
    """botocore's connection pools, whose responses skip informational answers as aiohttp does
    (every 1xx but 101); None if http.client has no status reader to extend.

    http.client only skips ``100 Continue``: a ``103 Early Hints`` before the real answer became
    botocore's final, empty answer, and the real one was left on the connection. aiohttp (the
    s3fs path) reads past it to the final answer; so this path does too.
    """
    import http.client

    from botocore.awsrequest import (
        AWSHTTPConnection,
        AWSHTTPConnectionPool,
        AWSHTTPSConnection,
        AWSHTTPSConnectionPool,
    )

    if not callable(getattr(http.client.HTTPResponse, "_read_status", None)) or not hasattr(
        http.client, "_read_headers"
    ):
        return None

    class FinalResponse(http.client.HTTPResponse):
        def _read_status(self) -> tuple[str, int, str]:
            for _ in range(MAX_INFORMATIONAL):
                version, status, reason = super()._read_status()  # type: ignore[misc]  # http.client's private reader, absent from typeshed
                if not 100 < status < 200 or status == 101:  # 100 itself: http.client skips it
                    return version, status, reason
                http.client._read_headers(self.fp)  # type: ignore[attr-defined]  # http.client's private reader (it caps the headers), absent from typeshed
            raise http.client.HTTPException(f"more than {MAX_INFORMATIONAL} informational answers")

    plain = type("Connection", (AWSHTTPConnection,), {"response_class": FinalResponse})
    tls = type("TLSConnection", (AWSHTTPSConnection,), {"response_class": FinalResponse})
    return {
        "http": type("Pool", (AWSHTTPConnectionPool,), {"ConnectionCls": plain}),
        "https": type("TLSPool", (AWSHTTPSConnectionPool,), {"ConnectionCls": tls}),
    }


def skip_informational(http: Any) -> None:
    """Use :func:`_pools` in botocore's URLLib3Session ``http`` (its pool manager and the proxy
    managers it makes later); left as it is where botocore moved them (then an informational
    final answer is still refused, in :func:`capped_send`).

    ``http`` is ``Any``: its private attributes are looked up here, never assumed.
    """
    pools = _pools()
    manager = getattr(http, "_manager", None)
    if (
        pools is None
        or manager is None
        or not isinstance(getattr(http, "_pool_classes_by_scheme", None), dict)
    ):
        return
    http._pool_classes_by_scheme = pools
    manager.pool_classes_by_scheme = pools
