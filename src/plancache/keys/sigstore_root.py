"""The Sigstore trust root that keyless signatures are verified against, pinned for a keyring.

A keyring that trusts a ``sigstore`` identity (:mod:`plancache.trust.keyring.identities`) needs
a ``trusted_root.json``: the Fulcio CAs, CT logs, Rekor logs and timestamp authorities of the
Sigstore instance whose certificates it accepts. It is read here, once, where the trusted keys
are read, and travels inside the :class:`~plancache.trust.keyring.keys.Keyring` as bytes, so
the trust core verifies offline with no file or network access of its own:

1. ``--trusted-root FILE`` (the CLI puts it in the variable below), else
2. ``PLANCACHE_SIGSTORE_TRUSTED_ROOT``, else
3. Sigstore's public-good root as shipped inside the installed sigstore-python wheel (its TUF
   bootstrap copy: refresh it by upgrading sigstore-python, or pin a file). sigstore-python
   has no public accessor for those bytes (``ClientTrustConfig.production`` goes through TUF
   and may fetch): :func:`public_good_root` reads its package data, the one place that does.

A keyring of keys alone reads nothing here and never imports sigstore-python.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from ..settings import SIGSTORE_TRUSTED_ROOT_ENV
from ..storage.local.files import read_capped
from ..trust.display import safe_text
from ..trust.errors import ConfigError
from ..trust.keyring.keys import Keyring

MAX_TRUSTED_ROOT_BYTES = 1024 * 1024
MISSING = "sigstore identities need sigstore-python: pip install 'plancache[sigstore]'"
PUBLIC_GOOD = "https%3A%2F%2Ftuf-repo-cdn.sigstore.dev"
"""sigstore-python's folder of the production instance's TUF bootstrap files."""


def public_good_root() -> bytes:
    """The production ``trusted_root.json`` shipped inside sigstore-python.

    Raises:
        ConfigError: sigstore-python is not installed (the ``[sigstore]`` extra).
    """
    try:
        from importlib.resources import files

        return files("sigstore._store").joinpath(PUBLIC_GOOD, "trusted_root.json").read_bytes()
    except ModuleNotFoundError:
        raise ConfigError(MISSING) from None


def trusted_root_bytes(env: Mapping[str, str] = os.environ) -> tuple[bytes, str]:
    """The pinned root's bytes and where they came from (for messages and ``doctor``).

    Raises:
        ConfigError: the named file is missing, too large or not a Sigstore trusted root.
    """
    path = env.get(SIGSTORE_TRUSTED_ROOT_ENV)
    if not path:
        return public_good_root(), "Sigstore public-good (shipped with sigstore-python)"
    try:
        data = read_capped(Path(path).expanduser(), MAX_TRUSTED_ROOT_BYTES, follow_symlinks=True)
    except Exception as exc:
        raise ConfigError(
            f"{SIGSTORE_TRUSTED_ROOT_ENV}={safe_text(path)}: {safe_text(exc)}"
        ) from None
    if data is None:
        raise ConfigError(f"{SIGSTORE_TRUSTED_ROOT_ENV}={safe_text(path)}: no such file")
    check_trusted_root(data, safe_text(path))
    return data, safe_text(path)


def check_trusted_root(data: bytes, where: str, now: datetime | None = None) -> None:
    """Whether ``data`` is a trust root that can verify a bundle signed at ``now`` (default:
    the real clock): it parses, and it has a Fulcio CA, a CT log and a transparency log whose
    windows have started (:func:`~plancache.trust.keyless.trust_root.unusable`). Otherwise every
    bundle would be refused and each refusal would blame the bundle; refused here, the
    operator's file is named instead.

    Raises:
        ConfigError: it does not, or sigstore-python is not installed.
    """
    from ..trust.keyless.trust_root import parse_root, unusable

    try:
        from ..trust.keyless.verifier_refusals import parse_trusted_root

        why = unusable(parse_root(data), now or datetime.now(timezone.utc))
        if why is not None:
            raise ConfigError(f"{where} can verify no Sigstore bundle: {why}")
        parse_trusted_root(data)
    except ModuleNotFoundError:
        raise ConfigError(MISSING) from None
    except ValueError as exc:
        raise ConfigError(f"{where} is not a usable Sigstore trusted root: {exc}") from None


def pin_trusted_root(keyring: Keyring, env: Mapping[str, str] = os.environ) -> Keyring:
    """``keyring`` with its identities' trust root pinned; unchanged when it trusts no
    identity or already holds a root.

    Raises:
        ConfigError: as :func:`trusted_root_bytes`.
    """
    ids = keyring.identities
    if ids is None or ids.trusted_root is not None:
        return keyring
    data, _ = trusted_root_bytes(env)
    return Keyring(keyring.keys, keyring.revoked, keyring.threshold, ids.with_root(data))
