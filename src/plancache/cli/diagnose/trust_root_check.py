"""``doctor``'s check of the Sigstore trust root that keyless signatures verify against:
present, parses, not expired. Run only when the trusted keys name a ``sigstore`` identity.

"Usable" is what ``verify`` refuses to load without (a CA, a CT log and a transparency log
whose windows have started: :func:`plancache.keys.sigstore_root.check_trusted_root`). "Not
expired" means what an offline node needs to verify a bundle signed today: at least one
Fulcio CA, one transparency log key and one CT log key whose validity has started and has no
end or ends in the future (a successor not yet in service does not count), and a CA
certificate not past its notAfter (``verify`` refuses a bundle signed
after its part's end as ``retired-trust-root``). A root due to expire within
:data:`WARN_DAYS` is a warning: refresh it (a newer plancache pin, or a newer pinned file)
before the fleet's nodes start refusing new caches and plans.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from ...settings import SIGSTORE_TRUSTED_ROOT_ENV
from ...trust.errors import PlanCacheError
from ...trust.keyring.keys import Keyring

if TYPE_CHECKING:
    from ...trust.keyless.trust_root import Window
    from .doctor import Checks

WARN_DAYS = 30


def _latest(ends: list[datetime | None]) -> datetime | None:
    """The latest end among parts (None: one part never ends); ``datetime.min`` if no part."""
    if not ends:
        return datetime.min.replace(tzinfo=timezone.utc)
    if any(e is None for e in ends):
        return None
    return max(e for e in ends if e is not None)


def root_expiry(data: bytes, now: datetime | None = None) -> datetime | None:
    """When the root stops verifying new signatures (None: never, as far as it says): the
    parts and windows ``verify`` judges a bundle by (:mod:`plancache.trust.keyless.trust_root`),
    so ``doctor`` and ``verify`` read one root the same way. Given ``now``, a part whose window
    has not started by then is left out: it vouches for nothing signed now, so a root whose
    only current CA (or log) retired before its successor starts has expired, for ``verify``
    as for ``doctor`` (red team 48a: ``doctor`` said ok, ``verify`` refused every new bundle).

    Raises:
        ValueError: it is not a trusted root (not JSON, no CA, no log).
    """
    from cryptography import x509

    from ...trust.keyless.trust_root import parse_root

    root = parse_root(data)
    if not root.cas:
        raise ValueError("no certificateAuthorities")

    def serving(window: Window) -> bool:
        return now is None or window.started(now)

    cas: list[datetime | None] = []
    for ca in (ca for ca in root.cas if serving(ca.window)):
        not_after = min(
            x509.load_der_x509_certificate(der).not_valid_after_utc for der in ca.certificates
        )
        end = ca.window.end
        cas.append(not_after if end is None else min(end, not_after))
    if not root.tlogs or not root.ctlogs:
        raise ValueError("no transparency log or no CT log")
    logs = [k.window.end for k in root.tlogs if serving(k.window)]
    cts = [k.window.end for k in root.ctlogs if serving(k.window)]
    ends = [e for e in (_latest(cas), _latest(logs), _latest(cts)) if e is not None]
    return min(ends) if ends else None


def identities_named(source: str | None) -> Keyring | None:
    """The trusted-keys file's keyring with no trust root pinned, or None: when the keys could
    not be used, the root may be why, and it deserves its own line."""
    if not source:
        return None
    from pathlib import Path

    from ...keys.keyfile import load_keyring

    try:
        return load_keyring(Path(source).expanduser(), pin_root=False)
    except PlanCacheError:
        return None


def check_trust_root(checks: Checks, keyring: Keyring | None, now: datetime | None = None) -> None:
    """Add the ``sigstore-trust-root`` check when ``keyring`` trusts an identity."""
    if keyring is None or keyring.identities is None or not keyring.identities.trusted:
        return
    from ...keys.sigstore_root import check_trusted_root, trusted_root_bytes

    now = now or datetime.now(timezone.utc)
    where = os.environ.get(SIGSTORE_TRUSTED_ROOT_ENV) or "Sigstore public-good (shipped)"
    try:
        data, where = trusted_root_bytes()
        check_trusted_root(data, where, now)
        expiry = root_expiry(data, now)
    except (PlanCacheError, ValueError, KeyError, TypeError) as exc:
        detail = exc.detail if isinstance(exc, PlanCacheError) else f"{where}: {exc}"
        checks.add("sigstore-trust-root", "fail", f"{detail}; no bundle will verify")
        return
    ids = len(keyring.identities.trusted)
    if expiry is not None and expiry <= now:
        checks.add("sigstore-trust-root", "fail", f"{where} expired at {expiry:%Y-%m-%d}")
    elif expiry is not None and expiry - now < timedelta(days=WARN_DAYS):
        checks.add("sigstore-trust-root", "warn", f"{where} expires {expiry:%Y-%m-%d}: refresh it")
    else:
        until = f"valid until {expiry:%Y-%m-%d}" if expiry else "no end date"
        checks.add(
            "sigstore-trust-root",
            "ok",
            f"{where}: parses, {until}; {ids} sigstore identit{'y' if ids == 1 else 'ies'} trusted",
            source=where,
            expires=expiry.isoformat() if expiry else None,
            identities=[i.line for i in keyring.identities.trusted],
        )
