"""``doctor``'s checks of keyless signing (``PLANCACHE_SIGNING_KEY=sigstore``), made offline.

Loading the ``sigstore`` signer is not a check a node can afford: it may ask the CI runner for
its token and Sigstore's TUF repository for the public-good trust configuration, and a node's
doctor runs where neither may be reachable (and must not hang or reach out where it is). So
these checks read what signing would read, and nothing else (:mod:`plancache.keys.
sigstore_inputs`: local files and text): where the OIDC token comes from and when it expires,
the trust configuration and whether it parses, and how long its trusted root lasts. Fulcio,
Rekor and the TUF repository are named, never contacted. Apart from :mod:`.doctor`'s set-up
checks because these rows are keyless signing's alone, imported only where it is configured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ...trust.display import safe_text
from ...trust.errors import PlanCacheError
from .trust_root_check import root_expiry

if TYPE_CHECKING:
    from .doctor import Checks

AMBIENT = (
    ("GITHUB_ACTIONS", ("ACTIONS_ID_TOKEN_REQUEST_URL",), "GitHub Actions", "the runner"),
    ("GOOGLE_SERVICE_ACCOUNT_NAME", (), "Google Cloud", "the metadata server"),
    ("BUILDKITE", (), "Buildkite", "the agent"),
    ("CIRCLECI", (), "CircleCI", "the circleci CLI"),
)
"""sigstore-python's ambient token sources (``id.detect_credential``) other than GitLab's, which
is ``SIGSTORE_ID_TOKEN`` itself: the variable that says a CI is there, the ones the token request
needs, and who is asked for the token when signing."""


def check_keyless_signer(
    checks: Checks, env: Mapping[str, str] = os.environ, now: datetime | None = None
) -> None:
    """Add ``signing-key``, ``sigstore-token`` and ``sigstore-trust-config`` rows."""
    now = now or datetime.now(timezone.utc)
    token = _token_row(env, now)
    config = _config_row(env, now)
    usable = token[0] == "ok" and config[0] == "ok"
    checks.add(
        "signing-key",
        "ok" if usable else "warn",
        "sigstore: keyless (a Fulcio certificate per run, every signature logged in Rekor; both "
        "contacted when signing, not here)"
        + ("" if usable else "; as set up, plans are saved unsigned"),
        keyless=True,
    )
    checks.add("sigstore-token", *token)
    checks.add("sigstore-trust-config", *config)


def _token_row(env: Mapping[str, str], now: datetime) -> tuple[str, str]:
    from ...keys.sigstore_inputs import check_token, given_token, token_claims

    try:
        given = given_token(env)
        if given is None:
            return _ambient(env)
        token, source = given
        check_token(token, source, now)
    except PlanCacheError as exc:
        return "warn", exc.detail.removeprefix("sigstore: ")
    except ModuleNotFoundError:
        from ...keys.sigstore_signer import MISSING

        return "warn", MISSING
    claims = token_claims(token)
    issuer = safe_text(str(claims.get("iss", "?")), 100)
    exp = claims.get("exp")
    expiry = datetime.fromtimestamp(exp, timezone.utc) if isinstance(exp, int) else None
    when = (
        f"expires at {expiry:%Y-%m-%dT%H:%M:%SZ} (in {int((expiry - now).total_seconds())} s)"
        if expiry
        else "no expiry stated"
    )
    return "ok", f"from {source}: issuer {issuer}, {when}"  # the token itself: never shown


def _ambient(env: Mapping[str, str]) -> tuple[str, str]:
    """The CI's ambient token, named and never asked for."""
    from ...keys.sigstore_inputs import NO_TOKEN

    for marker, needed, ci, asked in AMBIENT:
        if not env.get(marker):
            continue
        missing = [name for name in needed if not env.get(name)]
        if missing:
            return "warn", (
                f"{ci} without an OIDC token: {', '.join(missing)} unset (on GitHub: "
                "permissions: id-token: write)"
            )
        return "ok", f"{ci}'s ambient OIDC token, asked of {asked} when signing (not here)"
    if env.get("GITLAB_CI"):
        return "warn", (
            "GitLab CI without SIGSTORE_ID_TOKEN (id_tokens: SIGSTORE_ID_TOKEN, aud: sigstore)"
        )
    return "warn", NO_TOKEN


def _config_row(env: Mapping[str, str], now: datetime) -> tuple[str, str]:
    from ...keys.sigstore_inputs import trust_config_file
    from ...keys.sigstore_root import public_good_root

    try:
        found = trust_config_file(env)
        if found is None:
            where = (
                "Sigstore public-good (PLANCACHE_SIGSTORE_TRUST_CONFIG unset): signing fetches "
                "its configuration from tuf-repo-cdn.sigstore.dev (not contacted here)"
            )
            root = public_good_root()
            services = ""
        else:
            config, path = found
            where = f"{path} parses"
            root = config._inner.trusted_root.to_json().encode("utf-8")
            services = _services(config._inner.signing_config.to_json())
        expiry = root_expiry(root, now)
    except PlanCacheError as exc:
        return "warn", exc.detail
    except ModuleNotFoundError:
        from ...keys.sigstore_signer import MISSING

        return "warn", MISSING
    except (ValueError, KeyError, TypeError) as exc:
        return "warn", f"its trusted root does not read: {safe_text(str(exc), 120)}"
    if expiry is not None and expiry <= now:
        return "warn", f"{where}{services}; its trusted root expired at {expiry:%Y-%m-%d}"
    until = f"valid until {expiry:%Y-%m-%d}" if expiry else "no end date"
    return "ok", f"{where}{services}; its trusted root {until}"


def _services(signing_config: str) -> str:
    """``: Fulcio URL, Rekor URL`` from a parsed signing configuration's JSON."""
    doc: Any = json.loads(signing_config)
    fulcio = [u.get("url") for u in doc.get("caUrls", []) if isinstance(u, dict)]
    rekor = [u.get("url") for u in doc.get("rekorTlogUrls", []) if isinstance(u, dict)]
    names = [f"Fulcio {safe_text(str(u), 80)}" for u in fulcio[:2]]
    names += [f"Rekor {safe_text(str(u), 80)}" for u in rekor[:2]]
    return f" ({', '.join(names)})" if names else ""
