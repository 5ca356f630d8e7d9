"""``gcpkms://`` key references: a Google Cloud KMS key version of algorithm ``EC_SIGN_ED25519``
signing through google-cloud-kms (extra ``[gcpkms]``)::

    gcpkms://projects/P/locations/L/keyRings/R/cryptoKeys/K/cryptoKeyVersions/V

Cloud KMS signs Ed25519 in pure mode: ``AsymmetricSign`` gets the message itself in ``data``
(not a digest, which is what securesystemslib's KMS signers send and why they cannot do
Ed25519). The public key is ``GetPublicKey``'s PEM. The client uses the REST transport (no
gRPC channel to set up at boot) with Application Default Credentials; the endpoint can be
overridden with gcloud's own ``CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDKMS``. Every call has the
budget as its deadline, no SDK retries, and the budget thread around it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from ..trust.display import safe_text
from ..trust.errors import ConfigError, StoreTimeout
from ..trust.keyring.keyformat import parse_pem_public
from .remote_signer import RemoteSigner, missing_extra, one_line, within

if TYPE_CHECKING:  # imported when a reference names the scheme: the extra is optional
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud.kms_v1 import KeyManagementServiceClient, PublicKey

SCHEME = "gcpkms://"
ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDKMS"
_NAME = re.compile(
    r"projects/[^/\s]+/locations/[^/\s]+/keyRings/[^/\s]+"
    r"/cryptoKeys/[^/\s]+/cryptoKeyVersions/[^/\s]+"
)
T = TypeVar("T")


def parse_gcpkms_uri(ref: str) -> str:
    """The key version's resource name in a ``gcpkms://`` reference.

    Raises:
        ConfigError: not ``gcpkms://projects/…/cryptoKeyVersions/V`` (reason ``config-error``).
    """
    name = ref[len(SCHEME) :] if ref.startswith(SCHEME) else ""
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"'{safe_text(ref, 120)}' is not "
            "gcpkms://projects/P/locations/L/keyRings/R/cryptoKeys/K/cryptoKeyVersions/V"
        )
    return name


def _client(env: Mapping[str, str]) -> KeyManagementServiceClient:
    try:
        from google.api_core.client_options import ClientOptions
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import kms_v1
    except ImportError:
        raise missing_extra("gcpkms://", "google-cloud-kms", "gcpkms") from None
    endpoint = (env.get(ENDPOINT_ENV) or "").rstrip("/")
    try:
        return kms_v1.KeyManagementServiceClient(
            transport="rest",
            client_options=ClientOptions(api_endpoint=endpoint) if endpoint else None,
        )
    except DefaultCredentialsError:
        raise ConfigError(
            f"{SCHEME}: no Google credentials (GOOGLE_APPLICATION_CREDENTIALS or gcloud auth "
            "application-default login)"
        ) from None


def _call(source: str, what: str, call: Callable[[], T]) -> T:
    """One Cloud KMS call; refusals and unreachable endpoints are ConfigError, deadlines
    StoreTimeout."""
    import requests
    from google.api_core import exceptions as api
    from google.auth.exceptions import GoogleAuthError

    try:
        return call()
    except (api.DeadlineExceeded, requests.Timeout) as exc:
        raise StoreTimeout(f"{source}: Cloud KMS {what}: {one_line(exc)}") from None
    except api.GoogleAPICallError as exc:
        raise ConfigError(f"{source}: Cloud KMS refused {what}: {_status(exc)}") from None
    except (GoogleAuthError, requests.RequestException, api.GoogleAPIError) as exc:
        raise ConfigError(f"{source}: Cloud KMS {what} failed: {one_line(exc)}") from None


def _status(exc: GoogleAPICallError) -> str:
    """``403 PERMISSION_DENIED: message`` from the REST error body (the exception's own text
    repeats the whole request URL)."""
    try:
        error = exc.response.json()["error"]
        return safe_text(f"{error['code']} {error['status']}: {error['message']}", 200)
    except Exception:
        return safe_text(f"{type(exc).__name__}: {exc.message}", 200)


def gcpkms_signer(ref: str, env: Mapping[str, str], budget: float) -> RemoteSigner:
    """Check the key version's algorithm and read its public key, within ``budget``.

    Raises:
        ConfigError: a malformed reference, no credentials, a refusal, a key version that is
            not ``EC_SIGN_ED25519``, an unreadable public key, google-cloud-kms not installed
            (reason ``config-error``).
        StoreTimeout: Cloud KMS did not answer within ``budget`` (reason ``timeout``).
    """
    name = parse_gcpkms_uri(ref)
    source = safe_text(ref, 160)

    def load() -> tuple[KeyManagementServiceClient, PublicKey]:
        client = _client(env)
        return client, _call(
            source,
            "GetPublicKey",
            lambda: client.get_public_key(request={"name": name}, timeout=budget, retry=None),
        )

    client, answer = within(budget, f"reading the public key of {source}", load)
    from google.cloud import kms_v1

    if answer.algorithm != kms_v1.CryptoKeyVersion.CryptoKeyVersionAlgorithm.EC_SIGN_ED25519:
        shown = safe_text(getattr(answer.algorithm, "name", answer.algorithm), 40)
        raise ConfigError(f"{source}: the key version is {shown}, not EC_SIGN_ED25519")
    try:
        public = parse_pem_public(answer.pem.encode("ascii", "replace"))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc.detail}") from None

    def raw_sign(data: bytes) -> bytes:
        reply = _call(
            source,
            "AsymmetricSign",
            lambda: client.asymmetric_sign(
                request={"name": name, "data": data}, timeout=budget, retry=None
            ),
        )
        return bytes(reply.signature)

    return RemoteSigner(source, public, raw_sign, budget)
