"""A boot's few reads on ``s3://`` through plain botocore: no s3fs, no aiobotocore, no aiohttp.

Why: a boot needs one fingerprint, two GETs. Through s3fs those first import aiobotocore and
aiohttp (which builds its TLS contexts at import): about 0.3 s of a boot-time ``plancache
pull`` that a boto3 script does not pay, and, in a vLLM worker, CPU taken from the boot.
botocore alone (boto3's engine) does the same GETs. So a :class:`~..store.Store` on ``s3://``
whose filesystem is not built yet fetches up to :data:`MAX_FINGERPRINTS` fingerprints here, and
the compile cache's few objects of a boot (:func:`..compile_cache.archives.get_object`: in a vLLM
worker, s3fs's import and client cost 0.5 s of CPU beside the engine's start); listings, bulk
reads and every write stay with s3fs.

The guarantees of the s3fs path hold here too, placed on botocore's HTTP layer through its
``before-send`` event (:func:`_capped_send`): an error body is read to ERROR_BODY_CAP at most
and a body botocore would read whole to BODY_CAP (else TOO_LARGE); a redirect is refused; a
GET asks for ``cap + 1`` bytes, its declared length is checked before a byte of the body is
read, and the body is read to ``cap + 1`` bytes at most. botocore's retries are off; transient
failures are retried inside the deadline, classified as everywhere else (:mod:`..deadline`);
every read runs in a daemon thread waited for until the deadline (:mod:`..threads`).

Only options it understands (:func:`direct_settings`) take this path; anything else (for
example ``config_kwargs``, fsspec configuration for s3, a URL query) leaves the reads to s3fs.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...trust.errors import ConfigError, Reason, Rejected, StoreError
from ...trust.plans.plan import plan_name, sig_name
from ..backends import request_timeouts
from ..caps.bodies import (
    BODY_CAP,
    ERROR_BODY_CAP,
    check_complete,
    check_declared,
    check_length_header,
    read_upto,
)
from ..deadline import http_status, one_line, retrying, store_error
from ..listing import cap_for
from ..threads import Pending

MAX_FINGERPRINTS = 8
"""Fingerprints one fetch may read here (two GETs each, all at once); more go through s3fs."""

OPTIONS = frozenset(
    {"endpoint_url", "key", "secret", "token", "anon", "profile", "use_ssl", "client_kwargs"}
)
"""Storage options this path understands, each exactly as s3fs does."""

CLIENT_KWARGS = frozenset({"endpoint_url", "region_name", "verify", "use_ssl"})

_AS_BOTOCORE = (
    ("key", "aws_access_key_id"),
    ("secret", "aws_secret_access_key"),
    ("token", "aws_session_token"),
    ("endpoint_url", "endpoint_url"),
    ("use_ssl", "use_ssl"),
)


@dataclass(frozen=True)
class DirectSettings:
    """Where and how to read: the bucket, the key prefix, and botocore's client arguments."""

    root: str
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    anon: bool = False
    profile: str | None = None

    @property
    def bucket(self) -> str:
        return self.root.split("/", 1)[0]

    def key(self, name: str) -> str:
        prefix = self.root.partition("/")[2]
        return f"{prefix}/{name}" if prefix else name


def _fsspec_configures_anything(env: Mapping[str, str]) -> bool:
    """fsspec configuration (``FSSPEC_*`` variables, files in its config directory) could
    change what s3fs would do: such a store is left to s3fs."""
    if any(name.startswith("FSSPEC_") for name in env):
        return True
    home = env.get("HOME") or os.path.expanduser("~")
    directory = env.get("FSSPEC_CONFIG_DIR") or os.path.join(home, ".config", "fsspec")
    try:
        return bool(os.listdir(directory))
    except OSError:
        return False


def direct_settings(
    url: str, options: Mapping[str, Any], env: Mapping[str, str] = os.environ
) -> DirectSettings | None:
    """The settings to read ``url`` here, or None when s3fs must (see the module docstring)."""
    scheme, _, rest = url.partition("://")
    if (
        scheme not in ("s3", "s3a")
        or any(c in url for c in "?#")
        or rest.startswith("/")
        or "//" in rest
    ):
        return None
    root = rest.rstrip("/")
    client = options.get("client_kwargs") or {}
    if (
        not root
        or not set(options) <= OPTIONS
        or not isinstance(client, Mapping)
        or not set(client) <= CLIENT_KWARGS
        or options.get("anon", False) not in (True, False)
        or _fsspec_configures_anything(env)
    ):
        return None
    kwargs = {
        theirs: options[ours] for ours, theirs in _AS_BOTOCORE if options.get(ours) is not None
    }
    profile = options.get("profile")
    return DirectSettings(
        root, {**kwargs, **client}, options.get("anon", False), profile if profile else None
    )


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


def _capped_send(http: Any, request: Any, **_: Any) -> Any:
    """Send ``request`` with botocore's own HTTP session (its proxies, TLS and timeouts), then
    bound what botocore will read of the answer (see the module docstring)."""
    from botocore.awsrequest import AWSResponse

    streaming, request.stream_output = request.stream_output, True
    try:
        response = http.send(request)
    finally:
        request.stream_output = streaming
    raw, status = response.raw, response.status_code
    if status < 200:  # an informational answer reached botocore as the final one: never empty bytes
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


MAX_INFORMATIONAL = 16
"""Informational answers (``103 Early Hints``, ...) skipped before one request's final answer."""


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
                version, status, reason = super()._read_status()  # type: ignore[misc]
                if not 100 < status < 200 or status == 101:  # 100 itself: http.client skips it
                    return version, status, reason
                http.client._read_headers(self.fp)  # type: ignore[attr-defined]  # capped there
            raise http.client.HTTPException(f"more than {MAX_INFORMATIONAL} informational answers")

    plain = type("Connection", (AWSHTTPConnection,), {"response_class": FinalResponse})
    tls = type("TLSConnection", (AWSHTTPSConnection,), {"response_class": FinalResponse})
    return {
        "http": type("Pool", (AWSHTTPConnectionPool,), {"ConnectionCls": plain}),
        "https": type("TLSPool", (AWSHTTPSConnectionPool,), {"ConnectionCls": tls}),
    }


def _skip_informational(http: Any) -> None:
    """Use :func:`_pools` in botocore's URLLib3Session ``http`` (its pool manager and the proxy
    managers it makes later); left as it is where botocore moved them (then an informational
    final answer is still refused, in :func:`_capped_send`)."""
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


class S3Direct:
    """Capped ranged GETs of named objects under one S3 prefix, with a client made once."""

    def __init__(self, settings: DirectSettings, budget: float) -> None:
        self.settings = settings
        self.budget = budget
        self._client: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> Any:
        try:
            import botocore.session
            from botocore import UNSIGNED
            from botocore.config import Config
        except ImportError:
            raise ConfigError(
                f"s3://{self.settings.root}: botocore is not installed (pip install 'plancache[s3]')"
            ) from None

        connect, read = request_timeouts(self.budget)
        config = Config(
            connect_timeout=connect,
            read_timeout=read,
            max_pool_connections=2 * MAX_FINGERPRINTS,
            retries={"total_max_attempts": 1, "mode": "standard"},
            **({"signature_version": UNSIGNED} if self.settings.anon else {}),
        )
        try:
            session = botocore.session.Session(profile=self.settings.profile)
            client = session.create_client("s3", config=config, **self.settings.client_kwargs)
        except Exception as exc:  # a missing profile, a malformed endpoint, ...
            raise ConfigError(f"cannot open s3://{self.settings.root}: {one_line(exc)}") from None
        http = getattr(getattr(client, "_endpoint", None), "http_session", None)
        if not callable(getattr(http, "send", None)):  # botocore moved it: never read uncapped
            raise ConfigError(
                "this botocore has no endpoint HTTP session: plancache needs a supported botocore"
            )
        _skip_informational(http)
        client.meta.events.register_first("before-send.s3", functools.partial(_capped_send, http))
        return client

    def read(self, name: str, deadline: float, cap: int | None = None) -> bytes | None:
        """One object's bytes, at most ``cap`` (a plan's or sidecar's by its name; None if
        absent); retried while transient."""
        cap = cap_for(name) if cap is None else cap
        client = self.client()

        def attempt() -> bytes | None:
            try:
                resp = client.get_object(
                    Bucket=self.settings.bucket, Key=self.settings.key(name), Range=f"bytes=0-{cap}"
                )
            except Exception as exc:
                status = http_status(exc)
                if status in (
                    404,
                    416,
                ):  # absent; or empty (S3 answers 416 to a range over nothing)
                    return None if status == 404 else b""
                if (
                    type(exc).__name__ == "ParamValidationError"
                ):  # e.g. a bucket name S3 cannot have
                    raise ConfigError(f"s3://{self.settings.root}: {one_line(exc)}") from None
                raise
            body, declared = resp["Body"], resp.get("ContentLength")
            try:
                check_declared(name, cap, declared)
                data = read_upto(body.read, cap)
            finally:
                body.close()
            check_complete(len(data), declared)
            return data

        data = retrying(attempt, deadline)
        if data is not None and len(data) > cap:
            raise Rejected(Reason.TOO_LARGE, f"{name} in the store is larger than {cap} bytes")
        return data

    def get(self, name: str, cap: int | None, deadline: float) -> bytes | None:
        """One object of a boot (a plan set; a compile cache's archive or headers, or their
        signatures) at most ``cap`` (None: by its name), in a daemon thread waited for until the
        deadline; errors typed."""
        what = f"cannot read {name} from s3://{self.settings.root}"
        try:
            return Pending(lambda: self.read(name, deadline, cap), "plancache-s3-get").result(
                deadline, what, self.budget
            )
        except Exception as exc:
            raise store_error(what, exc) from None

    def fetch_pairs(
        self,
        fingerprints: Sequence[str],
        deadline: float,
        on_done: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """``{fp: (plan, sig) or the typed error}``, every GET at once, each in a daemon thread;
        those without an answer at the deadline get StoreTimeout."""

        def reading(name: str) -> Pending:
            return Pending(lambda: self.read(name, deadline), "plancache-s3-get")

        pending = {fp: (reading(plan_name(fp)), reading(sig_name(fp))) for fp in fingerprints}
        out: dict[str, Any] = {}
        for fp, reads in pending.items():
            try:
                plan, sig = (
                    r.result(
                        deadline, f"cannot read {fp} from s3://{self.settings.root}", self.budget
                    )
                    for r in reads
                )
                out[fp] = (None, None) if plan is None else (plan, sig)
            except Exception as exc:
                out[fp] = store_error(f"cannot read {fp}", exc)
            if on_done:
                on_done(1)
        return out
