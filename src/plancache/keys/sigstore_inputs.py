"""What keyless signing reads before it signs, read offline: the OIDC token handed to the run
and the Sigstore trust configuration.

Apart from :mod:`.sigstore_signer` (the signer, which talks to Fulcio and Rekor, and may ask the
CI for its ambient token or Sigstore's TUF repository for the public-good configuration) because
``doctor`` reads exactly these too and must never touch the network: what is here opens local
files and parses text, nothing else. Every file is an operator's path and may be anything: it is
read capped, without blocking (a FIFO, a device or a directory is refused before a byte is read),
and a message names the file, never what it holds; the token never appears in a message.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..settings import SIGSTORE_ID_TOKEN_ENV, SIGSTORE_ID_TOKEN_FILE_ENV, SIGSTORE_TRUST_CONFIG_ENV
from ..storage.local.files import read_capped
from ..trust import strictjson
from ..trust.display import safe_text
from ..trust.errors import ConfigError, PlanCacheError

if TYPE_CHECKING:  # sigstore-python is the [sigstore] extra
    from sigstore.models import ClientTrustConfig
    from sigstore.oidc import IdentityToken

MAX_TOKEN_BYTES = 64 * 1024
MAX_TRUST_CONFIG_BYTES = 1024 * 1024


def one_line(exc: BaseException) -> str:
    """An exception as one line: its class, then its text cut short."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {safe_text(text, 200)}" if text else type(exc).__name__


def unreachable_host(exc: BaseException) -> str | None:
    """The host a network failure could not reach (``host:port``), found in the exception or
    the ones it was raised from (sigstore-python lets ``requests``' errors through, or wraps
    them); None when ``exc`` is no connection failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # requests' ConnectionError and Timeout are OSErrors carrying the request they failed
        url = getattr(getattr(current, "request", None), "url", None)
        if isinstance(current, OSError) and isinstance(url, str) and url:
            return safe_text(urlsplit(url).netloc, 120)
        current = current.__cause__ or current.__context__
    return None


def failure(what: str, exc: BaseException) -> str:
    """``what`` failed, said in one line: the host it could not reach when the network is what
    failed (an operator's first question), else the exception (:func:`one_line`)."""
    host = unreachable_host(exc)
    if host is not None:
        return f"{what}: could not reach {host} ({type(exc).__name__}): is the network up?"
    return f"{what}: {one_line(exc)}"


def read_operator_file(path: str, cap: int, what: str) -> bytes:
    """An operator-named file, capped; a FIFO, a device or a directory is refused before a byte
    is read (:func:`~plancache.storage.local.files.read_capped` opens without blocking and
    checks for a regular file), and the message names the file, never what it holds.

    Raises:
        ConfigError: the file is missing, unreadable, not a regular file or over ``cap``.
    """
    try:
        data = read_capped(Path(path).expanduser(), cap, follow_symlinks=True)
    except PlanCacheError as exc:  # its detail names the file
        raise ConfigError(f"{what}: {safe_text(exc.detail, 200)}") from None
    except Exception as exc:
        raise ConfigError(f"{what} {safe_text(path)}: {one_line(exc)}") from None
    if data is None:
        raise ConfigError(f"{what} {safe_text(path)}: no such file")
    return data


NO_TOKEN = (
    f"no OIDC token: set {SIGSTORE_ID_TOKEN_ENV}, pass --identity-token FILE, "
    "or run in GitHub Actions (permissions: id-token: write) or GitLab CI (id_tokens)"
)


def given_token(env: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """The token handed to this run (``SIGSTORE_ID_TOKEN``, else the ``--identity-token`` file)
    and where it came from; None when neither is set (the CI's ambient token is then asked for
    at signing time). Reads no network, and never puts the token in a message.

    Raises:
        ConfigError: the file is missing, not a regular file (a FIFO, a device, a directory),
            or empty; the token over :data:`MAX_TOKEN_BYTES`, or not one line of printable
            ASCII (a line break, a NUL or another control character inside it).
    """
    token, source = env.get(SIGSTORE_ID_TOKEN_ENV, "").strip(), SIGSTORE_ID_TOKEN_ENV
    if not token:
        path = env.get(SIGSTORE_ID_TOKEN_FILE_ENV)
        if not path:
            return None
        data = read_operator_file(path, MAX_TOKEN_BYTES, "--identity-token")
        token, source = (
            data.decode("utf-8", "replace").strip(),
            f"--identity-token {safe_text(path)}",
        )
        if not token:
            raise ConfigError(f"sigstore: {source} is empty")
    if len(token) > MAX_TOKEN_BYTES:
        raise ConfigError(
            f"sigstore: the OIDC token from {source} is larger than {MAX_TOKEN_BYTES} bytes"
        )
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise ConfigError(
            f"sigstore: the OIDC token from {source} is not one line of text (a line break, a "
            "NUL or another control character inside it): a JWT is base64url and dots"
        )
    return token, source


def token_claims(token: str) -> dict[str, object]:
    """A JWT's claims, read without verifying its signature (Fulcio verifies it): for the
    messages here and ``doctor`` only; empty when the token is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3 or len(token) > MAX_TOKEN_BYTES:
        return {}
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = strictjson.loads(raw, "the token's claims")
    except (ValueError, PlanCacheError):
        return {}
    return claims if isinstance(claims, dict) else {}


def token_expiry(token: str) -> datetime | None:
    """When the token's ``exp`` claim says it expires (None: not said, or not a time)."""
    exp = token_claims(token).get("exp")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        return None
    try:
        return datetime.fromtimestamp(exp, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def check_token(token: str, source: str, now: datetime) -> IdentityToken:
    """The token as sigstore-python reads it, offline: an expired one is named so (with its
    expiry), where sigstore-python would only call it malformed.

    Raises:
        ConfigError: expired, for an audience other than ``sigstore`` (said so), or refused
            by sigstore-python (missing claims).
    """
    from sigstore.oidc import IdentityToken

    expiry = token_expiry(token)
    if expiry is not None and expiry <= now:
        raise ConfigError(
            f"sigstore: the OIDC token from {source} expired at {expiry:%Y-%m-%dT%H:%M:%SZ}: "
            "tokens live minutes, mint a fresh one"
        )
    audience = token_claims(token).get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if audience is not None and "sigstore" not in audiences:
        raise ConfigError(
            f"sigstore: the OIDC token from {source} is for the audience "
            f"'{safe_text(str(audience), 60)}': Fulcio takes only tokens whose audience is "
            "'sigstore' (GitHub: request it with audience=sigstore; GitLab: id_tokens with "
            "aud: sigstore)"
        )
    try:
        return IdentityToken(token)
    except Exception as exc:
        raise ConfigError(f"sigstore: the OIDC token from {source}: {one_line(exc)}") from None


def trust_config_file(env: Mapping[str, str] = os.environ) -> tuple[ClientTrustConfig, str] | None:
    """``PLANCACHE_SIGSTORE_TRUST_CONFIG`` read (capped, as :func:`given_token`'s file) and
    parsed, offline; None when unset: Sigstore's public-good instance, whose configuration
    signing fetches through TUF.

    Raises:
        ConfigError: the file cannot be read (as :func:`given_token`'s) or is not a
            ``ClientTrustConfig`` sigstore-python takes.
    """
    from sigstore.models import ClientTrustConfig

    path = env.get(SIGSTORE_TRUST_CONFIG_ENV)
    if not path:
        return None
    text = read_operator_file(path, MAX_TRUST_CONFIG_BYTES, SIGSTORE_TRUST_CONFIG_ENV)
    try:
        return ClientTrustConfig.from_json(text.decode("utf-8", "replace")), safe_text(path)
    except Exception as exc:
        raise ConfigError(f"sigstore trust config ({safe_text(path)}): {one_line(exc)}") from None
