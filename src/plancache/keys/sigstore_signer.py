"""The ``sigstore`` key reference: keyless signing with a CI job's OIDC identity.

Instead of a long-lived key, each signing run trades an OIDC token for a ten-minute Fulcio
certificate bound to a throwaway P-256 key, and every signature is logged in Rekor;
the result is a Sigstore bundle (:mod:`plancache.trust.keyless.sigstore_bundle`) holding
the same in-toto statement a key would sign. sigstore-python does the protocol; this module
finds the token and the instance:

- the token: ``SIGSTORE_ID_TOKEN``, else the file ``--identity-token FILE`` names (the CLI puts
  the path in ``PLANCACHE_SIGSTORE_IDENTITY_TOKEN_FILE``), else the CI's ambient credential
  (GitHub Actions with ``id-token: write``; GitLab CI's ``id_tokens`` with ``aud: sigstore``,
  which GitLab exports as ``SIGSTORE_ID_TOKEN``), found by sigstore-python's ``detect_credential``;
- the instance: ``PLANCACHE_SIGSTORE_TRUST_CONFIG`` (a ``ClientTrustConfig`` JSON: Fulcio, Rekor,
  TSA URLs and their trust root), else Sigstore's public-good instance.

The token is a secret for its few minutes: it never appears in a message (errors name where
it came from, never its text). One certificate serves every signature of a run while it is
valid (sigstore-python's cache); an expired one is replaced while the token lasts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..trust.display import safe_text
from ..trust.errors import ConfigError
from ..trust.keyring.identities import KEYID_PREFIX, IdentityPolicy, TrustedIdentity
from ..trust.keyring.keys import Keyring
from .sigstore_inputs import (
    NO_TOKEN,
    check_token,
    failure,
    given_token,
    one_line,
    trust_config_file,
)

if TYPE_CHECKING:  # sigstore-python is the [sigstore] extra, imported when a reference names it
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.x509 import Certificate
    from sigstore.models import ClientTrustConfig
    from sigstore.oidc import IdentityToken
    from sigstore.sign import Signer as SigstoreSigner

SCHEME = "sigstore"
MISSING = "the 'sigstore' key reference needs sigstore-python: pip install 'plancache[sigstore]'"


class KeylessSigner:
    """A :class:`~plancache.trust.keyring.keys.Signer` whose signatures are Sigstore bundles.

    ``sign`` (raw bytes) has no meaning here: signing code asks :func:`is_keyless` and calls
    :meth:`sign_statement` instead, and checks the result with :meth:`own_keyring`.
    """

    def __init__(
        self, token: IdentityToken, trust_config: ClientTrustConfig, trusted_root: bytes
    ) -> None:
        self._token = token
        self._config = trust_config
        self._trusted_root = trusted_root
        self._signer: SigstoreSigner | None = None
        self._lock = threading.Lock()

    @property
    def identity(self) -> str:
        """Who this signer signs as: the SAN Fulcio certified once a certificate was had (what a
        verifier sees: for GitHub Actions the workflow's ``job_workflow_ref`` URL), else the
        token's identity claim (for GitHub Actions its ``sub``). Never asks Fulcio itself: a
        report line naming the signer must not fail, nor wait, where signing could not."""
        with self._lock:
            signer = self._signer
        if signer is not None:
            from ..trust.keyless.fulcio_certificate import certified_identity

            try:
                sans = certified_identity(signer._signing_cert()).sans
            except Exception:  # an expired certificate: the token's claim still names the job
                sans = ()
            if sans:
                return sans[0]
        return str(self._token.identity)

    @property
    def issuer(self) -> str:
        return str(self._token.federated_issuer)

    @property
    def keyid(self) -> str:
        """``sigstore:<identity>`` (:attr:`identity`), as a verified bundle's signer is named."""
        return KEYID_PREFIX + self.identity

    @property
    def public(self) -> Ed25519PublicKey:
        """Never: a keyless signer's key lives for one certificate.

        Raises:
            ConfigError: always (reason ``config-error``).
        """
        raise ConfigError("a keyless signer has no long-lived public key (sigstore)")

    def sign(self, data: bytes) -> bytes:
        """Never: signing code calls :meth:`sign_statement` for a keyless signer.

        Raises:
            ConfigError: always (reason ``config-error``).
        """
        raise ConfigError("a keyless signer signs statements into Sigstore bundles, not bytes")

    def own_keyring(self) -> Keyring:
        """A keyring trusting exactly the identity Fulcio certified for this signer, under its
        instance's root. Read from the certificate, not the token: Fulcio chooses the SAN (for
        GitHub Actions the workflow's ``job_workflow_ref`` URL, while the token's identity claim
        is its ``sub``), so only the certificate says what a verifier will see; its source
        extensions are pinned too (the same certificate states them).

        Raises:
            ConfigError: no certificate could be had (as :meth:`sign_statement`).
        """
        from ..trust.keyless.fulcio_certificate import certified_identity

        cert = certified_identity(self._certificate())
        lines = tuple(
            TrustedIdentity(cert.issuer, san, name=san, source=cert.source) for san in cert.sans
        )
        return Keyring(identities=IdentityPolicy(lines, (), self._trusted_root))

    def _fresh_signer(self) -> SigstoreSigner:
        from sigstore.sign import SigningContext

        context = SigningContext.from_trust_config(self._config)
        with context.signer(self._token) as signer:  # requests the certificate now
            return signer

    def _certificate(self) -> Certificate:
        from sigstore.sign import ExpiredCertificate

        with self._lock:
            try:
                for _ in range(2):
                    if self._signer is None:
                        self._signer = self._fresh_signer()
                    try:
                        return self._signer._signing_cert()
                    except ExpiredCertificate:
                        self._signer = None
                raise ConfigError("sigstore: the signing certificate expired")  # pragma: no cover
            except ConfigError:
                raise
            except Exception as exc:
                raise ConfigError(failure("sigstore signing failed", exc)) from None

    def sign_statement(self, payload: bytes) -> bytes:
        """A Sigstore bundle (v0.3 JSON) whose DSSE envelope carries ``payload`` unchanged.

        Raises:
            ConfigError: Fulcio or Rekor refused or could not be reached, or the token expired.
        """
        from sigstore.dsse import Statement
        from sigstore.sign import ExpiredCertificate

        with self._lock:
            try:
                statement = Statement(payload)
                for _ in range(2):
                    if self._signer is None:
                        self._signer = self._fresh_signer()
                    try:
                        bundle = self._signer.sign_dsse(statement)
                        break
                    except ExpiredCertificate:
                        self._signer = None
                else:  # pragma: no cover - a fresh certificate expired at once
                    raise ConfigError("sigstore: the signing certificate expired")
            except ConfigError:
                raise
            except Exception as exc:
                raise ConfigError(failure("sigstore signing failed", exc)) from None
        return str(bundle.to_json()).encode("utf-8")


def is_keyless(signer: object) -> bool:
    """Whether a signer signs into bundles (:class:`KeylessSigner`)."""
    return isinstance(signer, KeylessSigner)


def _raw_token(env: Mapping[str, str]) -> tuple[str, str]:
    """The token's text and where it came from."""
    given = given_token(env)
    if given is not None:
        return given
    from sigstore.oidc import detect_credential

    try:
        ambient = detect_credential()
    except Exception as exc:
        raise ConfigError(f"sigstore: the CI's OIDC token: {one_line(exc)}") from None
    if not ambient:
        raise ConfigError(f"sigstore: {NO_TOKEN}")
    return ambient, "the CI's ambient OIDC token"


def _trust_config(env: Mapping[str, str]) -> ClientTrustConfig:
    from sigstore.models import ClientTrustConfig

    found = trust_config_file(env)
    if found is not None:
        return found[0]
    try:
        return ClientTrustConfig.production()
    except Exception as exc:
        raise ConfigError(failure("sigstore trust config (Sigstore public-good)", exc)) from None


def keyless_signer(ref: str, env: Mapping[str, str] = os.environ) -> KeylessSigner:
    """The signer the ``sigstore`` reference names, its token read and checked now.

    Raises:
        ConfigError: sigstore-python missing, no token or an unusable one (expired, wrong
            audience), or an unusable trust configuration.
    """
    if ref != SCHEME:
        raise ConfigError(f"'{safe_text(ref, 60)}': the keyless reference is exactly 'sigstore'")
    try:
        import sigstore.oidc  # noqa: F401 - the [sigstore] extra, checked before any token read
    except ModuleNotFoundError:
        raise ConfigError(MISSING) from None
    raw, source = _raw_token(env)
    token = check_token(raw, source, datetime.now(timezone.utc))
    config = _trust_config(env)
    trusted_root = config._inner.trusted_root.to_json().encode("utf-8")
    return KeylessSigner(token, config, trusted_root)
