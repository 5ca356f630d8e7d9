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
``before-send`` event (:mod:`.botocore_caps`: bodies botocore reads capped, no redirect); a
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
from typing import Any, Protocol

from ...clock import Deadline
from ...trust.errors import ConfigError, PlanCacheError, Reason, Rejected
from ...trust.plans.plan import plan_name, sig_name
from ..backends import request_timeouts
from ..caps.bodies import check_complete, check_declared, read_upto
from ..deadline import http_status, one_line, retrying, store_error
from ..listing import cap_for
from ..threads import Pending
from .botocore_caps import HttpSession, capped_send, skip_informational

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


class S3Client(Protocol):
    """What this path calls on botocore's S3 client (botocore ships no types)."""

    def get_object(self, *, Bucket: str, Key: str, Range: str) -> dict[str, Any]: ...


class S3Direct:
    """Capped ranged GETs of named objects under one S3 prefix, with a client made once."""

    def __init__(self, settings: DirectSettings, budget: float) -> None:
        self.settings = settings
        self.budget = budget
        self._client: S3Client | None = None
        self._lock = threading.Lock()

    def client(self) -> S3Client:
        """botocore's S3 client for the settings, made at the first call (see
        :meth:`_make_client`)."""
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> S3Client:
        try:
            import botocore.session
            from botocore import UNSIGNED
            from botocore.config import Config
        except ImportError:
            raise ConfigError(
                f"s3://{self.settings.root}: botocore is not installed "
                "(pip install 'plancache[s3]')"
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
        http: HttpSession | None = getattr(getattr(client, "_endpoint", None), "http_session", None)
        if http is None or not callable(getattr(http, "send", None)):  # moved: never uncapped
            raise ConfigError(
                "this botocore has no endpoint HTTP session: plancache needs a supported botocore"
            )
        skip_informational(http)
        client.meta.events.register_first("before-send.s3", functools.partial(capped_send, http))
        return client

    def read(self, name: str, deadline: Deadline, cap: int | None = None) -> bytes | None:
        """One object's bytes, at most ``cap`` (a plan's or sidecar's by its name; None if
        absent); retried while transient, blocking (a caller's daemon thread).

        Raises:
            ConfigError: botocore is missing or refuses the settings, or the request's
                parameters (a bucket name S3 cannot have) (reason ``config-error``).
            Rejected: the object is larger than ``cap`` (reason ``too-large``).
            StoreError: a truncated body or a refused answer, after its tries; botocore's own
                errors (``ClientError``, connection errors) pass through as they are.
        """
        cap = cap_for(name) if cap is None else cap
        client = self.client()

        def attempt() -> bytes | None:
            try:
                resp = client.get_object(
                    Bucket=self.settings.bucket, Key=self.settings.key(name), Range=f"bytes=0-{cap}"
                )
            except Exception as exc:
                status = http_status(exc)
                if status in (404, 416):  # absent; or empty (S3 answers 416 to a range over none)
                    return None if status == 404 else b""
                if type(exc).__name__ == "ParamValidationError":  # a bucket name S3 cannot have
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

    def get(self, name: str, cap: int | None, deadline: Deadline) -> bytes | None:
        """One object of a boot (a plan set; a compile cache's archive or headers, or their
        signatures) at most ``cap`` (None: by its name), in a daemon thread waited for until the
        deadline.

        Raises:
            PlanCacheError: every failure typed (:func:`..deadline.store_error`): ``StoreTimeout``
                at the deadline, ``StoreError`` for the store's, and :meth:`read`'s own
                ``Rejected`` and ``ConfigError`` as they are.
        """
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
        deadline: Deadline,
        on_done: Callable[[int], None] | None = None,
    ) -> dict[str, tuple[bytes | None, bytes | None] | PlanCacheError]:
        """``{fp: (plan, sig) or the typed error}``, every GET at once, each in a daemon thread;
        those without an answer at the deadline get StoreTimeout."""

        def reading(name: str) -> Pending[bytes | None]:
            return Pending(lambda: self.read(name, deadline), "plancache-s3-get")

        pending = {fp: (reading(plan_name(fp)), reading(sig_name(fp))) for fp in fingerprints}
        out: dict[str, tuple[bytes | None, bytes | None] | PlanCacheError] = {}
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
